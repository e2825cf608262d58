// HostFallbackBackend: reference ops on host copies of device memory (host_fallback.h).
#include "backend/reference/host_fallback.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "base/check.h"
#include "base/log.h"

namespace dh {
namespace {

constexpr uintptr_t kAlign = 64;  // device allocations are at least this aligned

// [begin, end) bytes a strided view touches; {0, 0} for an empty view.
std::pair<uintptr_t, uintptr_t> ExtentOf(const Tensor& t) {
  if (t.empty() || t.numel() == 0) return {0, 0};
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) {
    DH_CHECK(t.stride[i] >= 0, "host fallback: negative stride in {}", t.ShapeString());
    last += (t.shape[i] - 1) * t.stride[i];
  }
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data);
  return {begin, begin + static_cast<uintptr_t>(last + 1) * DTypeSize(t.dtype)};
}

Tensor Bytes(uintptr_t begin, uintptr_t end) {
  return Tensor(reinterpret_cast<void*>(begin), DType::kU8, {static_cast<int64_t>(end - begin)});
}

// Host copies of the byte ranges a set of tensors covers. Tensors are registered by address
// and rebased onto the host copy by Fetch(); Store() writes back every range holding an output.
class Mirror {
 public:
  explicit Mirror(Backend& device) : device_(device) {}
  Mirror& In(Tensor* t) { return Add(t, false); }
  Mirror& Out(Tensor* t) { return Add(t, true); }

  void Fetch() {
    std::vector<Entry*> order;
    for (Entry& e : entries_) order.push_back(&e);
    std::sort(order.begin(), order.end(), [](Entry* a, Entry* b) { return a->begin < b->begin; });
    for (Entry* e : order) {
      if (regions_.empty() || e->begin >= regions_.back().end) {
        regions_.push_back({e->begin / kAlign * kAlign, e->end, e->out, nullptr});
      } else {
        regions_.back().end = std::max(regions_.back().end, e->end);
        regions_.back().out |= e->out;
      }
      e->region = regions_.size() - 1;
    }
    for (Region& r : regions_) {
      r.host = std::make_unique<HostBuffer>(r.end - r.begin);
      device_.CopyToHost(r.host->data(), Bytes(r.begin, r.end));
    }
    for (Entry& e : entries_) {
      const Region& r = regions_[e.region];
      e.t->data = static_cast<char*>(r.host->data()) + (e.begin - r.begin);
    }
  }

  void Store() {
    for (Region& r : regions_) {
      if (r.out) device_.CopyToDevice(Bytes(r.begin, r.end), r.host->data());
    }
  }

 private:
  struct Entry {
    Tensor* t;
    bool out;
    uintptr_t begin, end;
    size_t region = 0;
  };
  struct Region {
    uintptr_t begin, end;
    bool out;
    std::unique_ptr<HostBuffer> host;
  };
  Mirror& Add(Tensor* t, bool out) {
    auto [b, e] = ExtentOf(*t);
    if (b != e) entries_.push_back({t, out, b, e});
    return *this;
  }
  Backend& device_;
  std::vector<Entry> entries_;
  std::vector<Region> regions_;
};

// "Attention", or "Attention i8" over a cache that is not f32.
std::string KvOpName(const char* op, const KvCacheView& cache) {
  if (cache.data.dtype == DType::kF32) return op;
  return fmt::format("{} {}", op, DTypeName(cache.data.dtype));
}

std::string Desc(const char* op, const Weight& w) {
  return fmt::format("{} {}/{}", op, WeightFormatName(w.format), DTypeName(w.data.dtype));
}

}  // namespace

struct HostFallbackBackend::HostWeight {
  Weight w;
  uintptr_t begin = 0, end = 0;  // device range of w.data (for forgetting)
  std::vector<std::unique_ptr<HostBuffer>> buffers;
};

struct HostFallbackBackend::WeightCache {
  std::mutex mu;
  std::map<uintptr_t, std::unique_ptr<HostWeight>> by_address;  // key: device address of data
};

HostFallbackBackend::HostFallbackBackend(const BackendOptions& options)
    : options_(options), host_(options), weights_(std::make_shared<WeightCache>()) {}

HostFallbackBackend::~HostFallbackBackend() = default;

std::function<void(const void*, size_t)> HostFallbackBackend::ForgetHostCopiesHook() {
  std::weak_ptr<WeightCache> weak = weights_;
  return [weak](const void* p, size_t n) {
    auto cache = weak.lock();
    if (!cache) return;
    const uintptr_t b = reinterpret_cast<uintptr_t>(p), e = b + n;
    std::lock_guard<std::mutex> lock(cache->mu);
    for (auto it = cache->by_address.begin(); it != cache->by_address.end();) {
      if (it->first >= b && it->first < e) {
        it = cache->by_address.erase(it);
      } else {
        ++it;
      }
    }
  };
}

Result<Weight> HostFallbackBackend::PrepareWeight(const Weight& w) {
  Weight d = w;
  for (Tensor* t : {&d.data, &d.scales, &d.zeros, &d.perm}) {
    auto [b, e] = ExtentOf(*t);
    if (b == e || IsDeviceMemory(t->data)) continue;
    const uintptr_t ab = b / kAlign * kAlign;  // stays inside the page holding the tensor
    auto buf = Allocate(e - ab);
    if (!buf) return ResourceExhausted("{}: cannot allocate {} bytes for a weight", name(), e - ab);
    CopyToDevice(Tensor(buf->data(), DType::kU8, {static_cast<int64_t>(e - ab)}),
                 reinterpret_cast<const void*>(ab));
    t->data = static_cast<char*>(buf->data()) + (b - ab);
    uploaded_.push_back(std::move(buf));
  }
  return d;
}

void HostFallbackBackend::Note(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!noted_.insert(what).second) return;
  DH_LOG(Warning,
         "backend {}: {} has no device kernel; running the reference op through host "
         "copies (slow)",
         name(), what);
}

std::vector<std::string> HostFallbackBackend::FallenBackOps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<std::string>(noted_.begin(), noted_.end());
}

const Weight& HostFallbackBackend::HostCopy(const Weight& w) {
  const uintptr_t key = reinterpret_cast<uintptr_t>(w.data.data);
  std::lock_guard<std::mutex> lock(weights_->mu);
  auto& slot = weights_->by_address[key];
  if (slot && slot->w.format == w.format && slot->w.rows == w.rows && slot->w.cols == w.cols &&
      slot->w.data.dtype == w.data.dtype) {
    return slot->w;
  }
  auto hw = std::make_unique<HostWeight>();
  hw->w = w;
  for (Tensor* t : {&hw->w.data, &hw->w.scales, &hw->w.zeros, &hw->w.perm}) {
    auto [b, e] = ExtentOf(*t);
    if (b == e) continue;
    const uintptr_t ab = b / kAlign * kAlign;
    auto buf = std::make_unique<HostBuffer>(e - ab);
    CopyToHost(buf->data(), Bytes(ab, e));
    t->data = static_cast<char*>(buf->data()) + (b - ab);
    hw->buffers.push_back(std::move(buf));
  }
  slot = std::move(hw);
  return slot->w;
}

void HostFallbackBackend::Embedding(const Weight& table, const Tensor& ids, Tensor out) {
  Note(Desc("Embedding", table));
  const Weight& ht = HostCopy(table);
  Tensor i = ids;
  Mirror m(*this);
  m.In(&i).Out(&out).Fetch();
  host_.Embedding(ht, i, out);
  m.Store();
}

void HostFallbackBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  Note("RmsNorm");
  Tensor hx = x, hw = weight;
  Mirror m(*this);
  m.In(&hx).In(&hw).Out(&out).Fetch();
  host_.RmsNorm(hx, hw, eps, out);
  m.Store();
}

void HostFallbackBackend::AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight,
                                     float eps, Tensor out) {
  Note("AddRmsNorm");
  Tensor hx = x, hw = weight;
  Mirror m(*this);
  m.Out(&residual).In(&hx).In(&hw).Out(&out).Fetch();
  host_.AddRmsNorm(residual, hx, hw, eps, out);
  m.Store();
}

void HostFallbackBackend::MatMul(const Tensor& x, const Weight& w, const Tensor& bias,
                                 Tensor out) {
  Note(Desc("MatMul", w));
  const Weight& hwt = HostCopy(w);
  Tensor hx = x, hb = bias;
  Mirror m(*this);
  m.In(&hx).In(&hb).Out(&out).Fetch();
  host_.MatMul(hx, hwt, hb, out);
  m.Store();
}

void HostFallbackBackend::BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) {
  Note(w.empty() ? std::string("BatchedMatMul") : Desc("BatchedMatMul", w[0]));
  std::vector<Weight> hw;
  hw.reserve(w.size());
  for (const Weight& one : w) hw.push_back(HostCopy(one));
  Tensor hx = x;
  Mirror m(*this);
  m.In(&hx).Out(&out).Fetch();
  host_.BatchedMatMul(hx, hw, out);
  m.Store();
}

void HostFallbackBackend::Rope(Tensor x, const Tensor& positions, const RopeParams& p) {
  Note(p.style == RopeStyle::kHalf ? "Rope half" : "Rope interleaved");
  RopeParams hp = p;
  Tensor pos = positions;
  Mirror m(*this);
  m.Out(&x).In(&pos).In(&hp.inv_freq).Fetch();
  host_.Rope(x, pos, hp);
  m.Store();
}

void HostFallbackBackend::KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache,
                                  KvCacheView v_cache, const Tensor& slot_mapping) {
  Note(KvOpName("KvWrite", k_cache));
  Tensor hk = k, hv = v, hs = slot_mapping;
  Mirror m(*this);
  m.In(&hk).In(&hv).Out(&k_cache.data).Out(&k_cache.scales).Out(&v_cache.data);
  m.Out(&v_cache.scales).In(&hs).Fetch();
  host_.KvWrite(hk, hv, k_cache, v_cache, hs);
  m.Store();
}

void HostFallbackBackend::Attention(const Tensor& q, const KvCacheView& k_cache,
                                    const KvCacheView& v_cache, const AttentionMeta& meta,
                                    float scale, Tensor out) {
  Note(KvOpName("Attention", k_cache));
  Tensor hq = q;
  KvCacheView hk = k_cache, hv = v_cache;
  AttentionMeta hm = meta;
  Mirror m(*this);
  m.In(&hq).In(&hk.data).In(&hk.scales).In(&hv.data).In(&hv.scales).Out(&out);
  m.In(&hm.query_start).In(&hm.seq_lens).In(&hm.block_tables).In(&hm.slot_mapping).Fetch();
  host_.Attention(hq, hk, hv, hm, scale, out);
  m.Store();
}

void HostFallbackBackend::KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) {
  Note(KvOpName("KvGather", cache));
  KvCacheView hc = cache;
  Tensor hs = slots;
  Mirror m(*this);
  m.In(&hc.data).In(&hc.scales).In(&hs).Out(&out).Fetch();
  host_.KvGather(hc, hs, out);
  m.Store();
}

void HostFallbackBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  Note("SiluMul");
  Tensor g = gate, u = up;
  Mirror m(*this);
  m.In(&g).In(&u).Out(&out).Fetch();
  host_.SiluMul(g, u, out);
  m.Store();
}

void HostFallbackBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  Note("Add");
  Tensor ha = a, hb = b;
  Mirror m(*this);
  m.In(&ha).In(&hb).Out(&out).Fetch();
  host_.Add(ha, hb, out);
  m.Store();
}

void HostFallbackBackend::Copy(const Tensor& src, Tensor dst) {
  Note("Copy");
  Tensor s = src;
  Mirror m(*this);
  m.In(&s).Out(&dst).Fetch();
  host_.Copy(s, dst);
  m.Store();
}

void HostFallbackBackend::GatherRows(const Tensor& x, const Tensor& rows, Tensor out) {
  Note("GatherRows");
  Tensor hx = x, hr = rows;
  Mirror m(*this);
  m.In(&hx).In(&hr).Out(&out).Fetch();
  host_.GatherRows(hx, hr, out);
  m.Store();
}

void HostFallbackBackend::MoeGate(const Tensor& logits, const Tensor& bias,
                                  const MoeGateParams& p, Tensor topk_ids, Tensor topk_weights) {
  Note("MoeGate");
  Tensor hl = logits, hb = bias;
  Mirror m(*this);
  m.In(&hl).In(&hb).Out(&topk_ids).Out(&topk_weights).Fetch();
  host_.MoeGate(hl, hb, p, topk_ids, topk_weights);
  m.Store();
}

void HostFallbackBackend::MoeExperts(const Tensor& x, const Tensor& topk_ids,
                                     const Tensor& topk_weights,
                                     std::span<const ExpertWeights> experts, Tensor out) {
  Note("MoeExperts");
  std::vector<ExpertWeights> host_experts;
  host_experts.reserve(experts.size());
  for (const ExpertWeights& e : experts) {
    host_experts.push_back({HostCopy(e.gate), HostCopy(e.up), HostCopy(e.down)});
  }
  Tensor hx = x, hi = topk_ids, hw = topk_weights;
  Mirror m(*this);
  m.In(&hx).In(&hi).In(&hw).Out(&out).Fetch();
  host_.MoeExperts(hx, hi, hw, host_experts, out);
  m.Store();
}

}  // namespace dh
