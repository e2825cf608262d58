// CheckingBackend and RunSelfCheck (apps/self_check.h). Each checked op runs on the chosen
// backend first (its output is what the model goes on with), then on the reference backend over
// host copies of the inputs taken before the call (several ops write in place), and the two
// outputs are compared.
#include "apps/self_check.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "backend/weight_rows.h"
#include "base/log.h"
#include "model/sequence_runner.h"

namespace dh::app {
namespace {

// Golden tolerances (tests/golden/golden_test.cc): 1e-4 of the scale where the weights are f32,
// 2e-2 where an op reads bf16/f16/fp8 or quantized weights (the CPU's integer-dot kernels also
// quantize activations to int8).
constexpr float kTolF32 = 1e-4f;
constexpr float kTolLowPrecision = 2e-2f;

const char* OpName(OpKind op) {
  switch (op) {
    case OpKind::kEmbedding: return "Embedding";
    case OpKind::kRmsNorm: return "RmsNorm";
    case OpKind::kAddRmsNorm: return "AddRmsNorm";
    case OpKind::kMatMul: return "MatMul";
    case OpKind::kRope: return "Rope";
    case OpKind::kKvWrite: return "KvWrite";
    case OpKind::kAttention: return "Attention";
    case OpKind::kSiluMul: return "SiluMul";
    case OpKind::kAdd: return "Add";
    case OpKind::kCopy: return "Copy";
    case OpKind::kGatherRows: return "GatherRows";
    case OpKind::kKvGather: return "KvGather";
    case OpKind::kMoeGate: return "MoeGate";
    case OpKind::kMoeExperts: return "MoeExperts";
    case OpKind::kBatchedMatMul: return "BatchedMatMul";
  }
  return "?";
}

float TolFor(const Weight& w) {
  return w.format == WeightFormat::kDense && w.data.dtype == DType::kF32 ? kTolF32
                                                                         : kTolLowPrecision;
}

// The CPU's integer-dot kernels quantize each row of x to int8 per block of 32 columns
// (backend/cpu/quant_vnni.h), so with int8/int4 weights output (i, j) may differ from the exact
// product by up to sum over blocks b of (max|x_ib| / 254) * sum_{k in b} |w_jk| (the kernel's
// stated bound, as the kernel tests check it). Returns that bound per output element of x [M, K]
// (host, contiguous) times w; empty for other weights.
std::vector<float> ActivationQuantBound(const Tensor& x, const Weight& w) {
  if ((w.format != WeightFormat::kInt8 && w.format != WeightFormat::kInt4) ||
      x.dtype != DType::kF32 || x.ndim < 1 || x.shape[x.ndim - 1] != w.cols) {
    return {};
  }
  constexpr int64_t kBlock = 32;
  const int64_t k = w.cols, n = w.rows, m = x.numel() / k, blocks = (k + kBlock - 1) / kBlock;
  const float* xs = x.as<const float>();
  std::vector<float> xmax(static_cast<size_t>(m * blocks), 0.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < k; ++c) {
      float& mx = xmax[static_cast<size_t>(i * blocks + c / kBlock)];
      mx = std::max(mx, std::fabs(xs[i * k + c]));
    }
  std::vector<float> bound(static_cast<size_t>(m * n), 0.0f), row(static_cast<size_t>(k));
  std::vector<float> wsum(static_cast<size_t>(blocks));
  for (int64_t j = 0; j < n; ++j) {
    DecodeWeightRow(w, j, row.data());
    std::fill(wsum.begin(), wsum.end(), 0.0f);
    for (int64_t c = 0; c < k; ++c) wsum[static_cast<size_t>(c / kBlock)] += std::fabs(row[c]);
    for (int64_t i = 0; i < m; ++i) {
      float b = 0;
      for (int64_t q = 0; q < blocks; ++q)
        b += xmax[static_cast<size_t>(i * blocks + q)] / 254.0f * wsum[static_cast<size_t>(q)];
      bound[static_cast<size_t>(i * n + j)] = b;
    }
  }
  return bound;
}

std::string WeightText(const Weight& w) {
  return fmt::format("weight {} [{} x {}] {}", WeightFormatName(w.format), w.rows, w.cols,
                     DTypeName(w.data.dtype));
}

// Calls fn(element offset in t, linear index) for every element of t in row-major order.
void ForEachElement(const Tensor& t, const std::function<void(int64_t, int64_t)>& fn) {
  if (t.empty()) return;
  std::array<int64_t, kMaxDims> idx{};
  const int64_t n = t.numel();
  for (int64_t linear = 0; linear < n; ++linear) {
    int64_t off = 0;
    for (int d = 0; d < t.ndim; ++d) off += idx[d] * t.stride[d];
    fn(off, linear);
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// A contiguous host copy of a (possibly strided) tensor; an empty tensor stays empty.
struct HostCopy {
  std::vector<char> bytes;
  Tensor t;
};

HostCopy CopyOf(const Tensor& src, bool with_data = true) {
  HostCopy c;
  if (src.empty()) return c;
  const size_t es = DTypeSize(src.dtype);
  c.bytes.assign(std::max<size_t>(src.nbytes(), 1), 0);
  c.t = src;
  c.t.data = c.bytes.data();
  c.t.SetContiguousStrides();
  if (with_data) {
    const char* base = static_cast<const char*>(src.data);
    ForEachElement(src, [&](int64_t off, int64_t i) {
      std::memcpy(c.bytes.data() + i * es, base + off * es, es);
    });
  }
  return c;
}

HostCopy ZerosLike(const Tensor& t) { return CopyOf(t, /*with_data=*/false); }

float ValueAt(const Tensor& t, int64_t off) {
  const char* p = static_cast<const char*>(t.data);
  switch (t.dtype) {
    case DType::kF32: return reinterpret_cast<const float*>(p)[off];
    case DType::kF64: return static_cast<float>(reinterpret_cast<const double*>(p)[off]);
    case DType::kBF16: return BF16ToF32(reinterpret_cast<const uint16_t*>(p)[off]);
    case DType::kF16: return F16ToF32(reinterpret_cast<const uint16_t*>(p)[off]);
    case DType::kF8E4M3: return F8E4M3ToF32(reinterpret_cast<const uint8_t*>(p)[off]);
    case DType::kI32: return static_cast<float>(reinterpret_cast<const int32_t*>(p)[off]);
    case DType::kI64: return static_cast<float>(reinterpret_cast<const int64_t*>(p)[off]);
    case DType::kI8: return reinterpret_cast<const int8_t*>(p)[off];
    default: return reinterpret_cast<const uint8_t*>(p)[off];
  }
}

}  // namespace

Result<SelfCheckMode> ParseSelfCheckMode(const std::string& text) {
  if (text == "auto" || text == "on" || text.empty()) return SelfCheckMode::kAuto;
  if (text == "full") return SelfCheckMode::kFull;
  if (text == "first") return SelfCheckMode::kFirstLayers;
  if (text == "off") return SelfCheckMode::kOff;
  return InvalidArgument("--self-check: expected auto, full, first or off, got '{}'", text);
}

CheckingBackend::CheckingBackend(std::unique_ptr<Backend> inner)
    : ForwardingBackend(std::move(inner)), reference_(BackendOptions{.num_threads = 1}) {
  // The reference reads the weights' stored layout: the chosen backend hands it back only once
  // the check is done (ReleaseHeldRows, cmd_serve.cc / serve_parallel.cc).
  HoldReleases();
  if (const char* env = std::getenv("DEEPHARNESS_TEST_SELF_CHECK_PERTURB")) {
    perturb_op_ = env;
    if (const size_t at = perturb_op_.find('@'); at != std::string::npos) {
      perturb_rank_ = std::atoi(perturb_op_.c_str() + at + 1);
      perturb_op_.resize(at);
    }
    DH_LOG(Warning, "DEEPHARNESS_TEST_SELF_CHECK_PERTURB={} is set: a test hook that makes the "
                    "start-up self-check see a wrong {} (it cannot change served output)",
           perturb_op_, perturb_op_);
  }
  // <Op>@<rank> (or <Op> for every rank) from a break-down hook.
  auto parse = [](const char* var, std::string* op, int* rank) {
    const char* env = std::getenv(var);
    if (env == nullptr) return;
    *op = env;
    if (const size_t at = op->find('@'); at != std::string::npos) {
      *rank = std::atoi(op->c_str() + at + 1);
      op->resize(at);
    }
    DH_LOG(Warning, "{}={} is set: a test hook that breaks this rank down during the start-up "
                    "self-check", var, env);
  };
  parse("DEEPHARNESS_TEST_SELF_CHECK_ERROR", &error_op_, &error_rank_);
  parse("DEEPHARNESS_TEST_SELF_CHECK_STALL", &stall_op_, &stall_rank_);
}

void CheckingBackend::BeginCheck(int max_layers) {
  checking_ = true;
  max_layers_ = max_layers;
  step_ = 0;
  ops_checked_ = 0;
  first_difference_ = Status::Ok();
  injected_error_ = Status::Ok();
}

void CheckingBackend::BeginStep() {
  ++step_;
  op_in_step_ = 0;
  norms_in_step_ = 0;
}

Status CheckingBackend::EndCheck() {
  checking_ = false;
  return first_difference_;
}

// The decoder skeleton (model/layers/decoder.cc) calls AddRmsNorm twice per layer after the
// first (input norm, post-attention norm) and once in layer 0, so the layer of the current op is
// (AddRmsNorm calls so far) / 2; the final norm counts as layer num_layers.
bool CheckingBackend::Checking(OpKind op) {
  if (!checking_) return false;
  MaybeBreakDown(op);
  ++op_in_step_;
  if (op == OpKind::kAddRmsNorm) ++norms_in_step_;
  if (!first_difference_.ok()) return false;
  if (max_layers_ >= 0 && norms_in_step_ / 2 >= max_layers_) return false;
  ++ops_checked_;
  return true;
}

void CheckingBackend::MaybeBreakDown(OpKind op) {
  if (!error_op_.empty() && error_op_ == OpName(op) && (error_rank_ < 0 || error_rank_ == rank_) &&
      injected_error_.ok()) {
    injected_error_ = Internal("{} at forward step {} failed (DEEPHARNESS_TEST_SELF_CHECK_ERROR, "
                               "a test hook)", OpName(op), step_);
  }
  if (!stall_op_.empty() && stall_op_ == OpName(op) && (stall_rank_ < 0 || stall_rank_ == rank_)) {
    stall_op_.clear();  // once
    ::raise(SIGSTOP);
  }
}

void CheckingBackend::MaybePerturb(OpKind op, Tensor out) {
  if (perturb_op_ != OpName(op) || out.empty()) return;
  if (perturb_rank_ >= 0 && perturb_rank_ != rank_) return;
  if (out.dtype == DType::kF32) {
    out.as<float>()[0] += 1.0f;
  } else if (out.dtype == DType::kI32) {
    out.as<int32_t>()[0] += 1;
  }
}

void CheckingBackend::Compare(OpKind op, const char* what, const Tensor& got, const Tensor& want,
                              float rtol, const std::string& detail,
                              std::span<const float> slack) {
  if (!first_difference_.ok()) return;
  float max_ref = 0, max_diff = 0;
  int64_t worst = -1;
  float worst_got = 0, worst_want = 0;
  ForEachElement(got, [&](int64_t off, int64_t i) {
    const float g = ValueAt(got, off), w = ValueAt(want, i);
    if (std::isfinite(w)) max_ref = std::max(max_ref, std::fabs(w));
    float d = (std::isnan(g) != std::isnan(w)) ? INFINITY
              : (std::isnan(g) ? 0.0f : std::fabs(g - w));
    if (!slack.empty()) d = std::max(0.0f, d - slack[static_cast<size_t>(i)]);
    if (worst < 0 || d > max_diff) {
      max_diff = d;
      worst = i;
      worst_got = g;
      worst_want = w;
    }
  });
  const float tol = rtol * std::max(1.0f, max_ref);
  if (!(max_diff <= tol)) {
    const int layer = norms_in_step_ / 2;
    first_difference_ = Internal(
        "self-check: {} differs between the {} backend and the reference backend at op {} of "
        "forward step {} (decoder layer {}{}; {} {}{}): max |diff| {:.4g} at element {} ({} "
        "{:.6g}, reference {:.6g}), tolerance {:.3g} = {:g} x max(1, max|reference| {:.4g}){}",
        OpName(op), inner().name(), op_in_step_, step_, layer,
        max_layers_ < 0 ? "" : " or the final norm/lm_head", what, got.ShapeString(),
        detail.empty() ? "" : ", " + detail, max_diff, worst, inner().name(), worst_got,
        worst_want, tol, rtol, max_ref,
        slack.empty() ? "" : " beyond the integer-dot kernels' activation-quantization bound");
  }
}

void CheckingBackend::Embedding(const Weight& table, const Tensor& ids, Tensor out) {
  if (!Checking(OpKind::kEmbedding)) return inner().Embedding(table, ids, out);
  HostCopy ids0 = CopyOf(ids);
  inner().Embedding(table, ids, out);
  MaybePerturb(OpKind::kEmbedding, out);
  HostCopy want = ZerosLike(out);
  reference_.Embedding(table, ids0.t, want.t);
  Compare(OpKind::kEmbedding, "output", out, want.t, TolFor(table), WeightText(table));
}

void CheckingBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  if (!Checking(OpKind::kRmsNorm)) return inner().RmsNorm(x, weight, eps, out);
  HostCopy x0 = CopyOf(x);
  inner().RmsNorm(x, weight, eps, out);
  MaybePerturb(OpKind::kRmsNorm, out);
  HostCopy want = ZerosLike(out);
  reference_.RmsNorm(x0.t, weight, eps, want.t);
  Compare(OpKind::kRmsNorm, "output", out, want.t, kTolF32, "");
}

void CheckingBackend::AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                                 Tensor out) {
  if (!Checking(OpKind::kAddRmsNorm)) return inner().AddRmsNorm(residual, x, weight, eps, out);
  HostCopy r0 = CopyOf(residual), x0 = CopyOf(x);
  inner().AddRmsNorm(residual, x, weight, eps, out);
  MaybePerturb(OpKind::kAddRmsNorm, out);
  HostCopy want = ZerosLike(out);
  reference_.AddRmsNorm(r0.t, x0.t, weight, eps, want.t);
  Compare(OpKind::kAddRmsNorm, "residual", residual, r0.t, kTolF32, "");
  Compare(OpKind::kAddRmsNorm, "output", out, want.t, kTolF32, "");
}

void CheckingBackend::MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) {
  if (!Checking(OpKind::kMatMul)) return inner().MatMul(x, w, bias, out);
  HostCopy x0 = CopyOf(x);
  inner().MatMul(x, w, bias, out);
  MaybePerturb(OpKind::kMatMul, out);
  HostCopy want = ZerosLike(out);
  reference_.MatMul(x0.t, w, bias, want.t);
  Compare(OpKind::kMatMul, "output", out, want.t, TolFor(w), WeightText(w),
          ActivationQuantBound(x0.t, w));
}

// The products as the backend runs them together, each then compared as MatMul's above.
void CheckingBackend::MatMuls(const Tensor& x, std::span<const MatMulTarget> targets) {
  if (!Checking(OpKind::kMatMul)) return inner().MatMuls(x, targets);
  HostCopy x0 = CopyOf(x);
  inner().MatMuls(x, targets);
  for (const MatMulTarget& t : targets) {
    MaybePerturb(OpKind::kMatMul, t.out);
    HostCopy want = ZerosLike(t.out);
    reference_.MatMul(x0.t, *t.w, t.bias, want.t);
    Compare(OpKind::kMatMul, "output", t.out, want.t, TolFor(*t.w), WeightText(*t.w),
            ActivationQuantBound(x0.t, *t.w));
  }
}

void CheckingBackend::BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) {
  if (!Checking(OpKind::kBatchedMatMul) || w.empty()) return inner().BatchedMatMul(x, w, out);
  HostCopy x0 = CopyOf(x);
  inner().BatchedMatMul(x, w, out);
  MaybePerturb(OpKind::kBatchedMatMul, out);
  HostCopy want = ZerosLike(out);
  reference_.BatchedMatMul(x0.t, w, want.t);
  Compare(OpKind::kBatchedMatMul, "output", out, want.t, TolFor(w[0]), WeightText(w[0]));
}

void CheckingBackend::Rope(Tensor x, const Tensor& positions, const RopeParams& p) {
  if (!Checking(OpKind::kRope)) return inner().Rope(x, positions, p);
  HostCopy x0 = CopyOf(x);
  inner().Rope(x, positions, p);
  MaybePerturb(OpKind::kRope, x);
  reference_.Rope(x0.t, positions, p);
  Compare(OpKind::kRope, "output", x, x0.t, kTolF32, "");
}

// The caches are the whole pool, so instead of copying them: the chosen backend writes, the
// written rows (and their scales, for a quantized cache) are copied, the reference writes the
// same slots again, and the rows are compared.
void CheckingBackend::KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache,
                              KvCacheView v_cache, const Tensor& slot_mapping) {
  if (!Checking(OpKind::kKvWrite)) return inner().KvWrite(k, v, k_cache, v_cache, slot_mapping);
  HostCopy k0 = CopyOf(k), v0 = CopyOf(v), slots = CopyOf(slot_mapping);
  inner().KvWrite(k, v, k_cache, v_cache, slot_mapping);
  auto rows = [&](const Tensor& cache) {
    std::vector<HostCopy> out;
    if (cache.empty()) return out;
    for (int64_t t = 0; t < slots.t.numel(); ++t) {
      const int32_t s = slots.t.as<int32_t>()[t];
      if (s >= 0) out.push_back(CopyOf(cache.Slice0(s, 1)));
    }
    return out;
  };
  const KvCacheView no_v;
  const KvCacheView& vc = v.empty() ? no_v : v_cache;
  const Tensor* parts[] = {&k_cache.data, &k_cache.scales, &vc.data, &vc.scales};
  const char* names[] = {"k cache row", "k cache scales", "v cache row", "v cache scales"};
  std::vector<HostCopy> got[4], want[4];
  for (int i = 0; i < 4; ++i) got[i] = rows(*parts[i]);
  if (!got[0].empty()) MaybePerturb(OpKind::kKvWrite, got[0][0].t);
  reference_.KvWrite(k0.t, v0.t, k_cache, v_cache, slots.t);
  for (int i = 0; i < 4; ++i) {
    want[i] = rows(*parts[i]);
    for (size_t r = 0; r < got[i].size(); ++r) {
      Compare(OpKind::kKvWrite, names[i], got[i][r].t, want[i][r].t, kTolF32, "");
    }
  }
}

void CheckingBackend::Attention(const Tensor& q, const KvCacheView& k_cache,
                                const KvCacheView& v_cache, const AttentionMeta& meta,
                                float scale, Tensor out) {
  if (!Checking(OpKind::kAttention)) return inner().Attention(q, k_cache, v_cache, meta, scale, out);
  HostCopy q0 = CopyOf(q);
  inner().Attention(q, k_cache, v_cache, meta, scale, out);
  MaybePerturb(OpKind::kAttention, out);
  HostCopy want = ZerosLike(out);
  reference_.Attention(q0.t, k_cache, v_cache, meta, scale, want.t);
  // A bf16 cache is a low-precision input like bf16 weights: the CPU then rounds the queries to
  // bf16 as well where it has AVX512-BF16 (backend/cpu/attention.h, AttendBf16Dot).
  const float tol = k_cache.data.dtype == DType::kBF16 ? kTolLowPrecision : kTolF32;
  Compare(OpKind::kAttention, "output", out, want.t, tol, "");
}

void CheckingBackend::KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) {
  if (!Checking(OpKind::kKvGather)) return inner().KvGather(cache, slots, out);
  HostCopy s0 = CopyOf(slots);
  inner().KvGather(cache, slots, out);
  MaybePerturb(OpKind::kKvGather, out);
  HostCopy want = ZerosLike(out);
  reference_.KvGather(cache, s0.t, want.t);
  Compare(OpKind::kKvGather, "output", out, want.t, kTolF32, "");
}

void CheckingBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  if (!Checking(OpKind::kSiluMul)) return inner().SiluMul(gate, up, out);
  HostCopy g0 = CopyOf(gate), u0 = CopyOf(up);
  inner().SiluMul(gate, up, out);
  MaybePerturb(OpKind::kSiluMul, out);
  HostCopy want = ZerosLike(out);
  reference_.SiluMul(g0.t, u0.t, want.t);
  Compare(OpKind::kSiluMul, "output", out, want.t, kTolF32, "");
}

void CheckingBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  if (!Checking(OpKind::kAdd)) return inner().Add(a, b, out);
  HostCopy a0 = CopyOf(a), b0 = CopyOf(b);
  inner().Add(a, b, out);
  MaybePerturb(OpKind::kAdd, out);
  HostCopy want = ZerosLike(out);
  reference_.Add(a0.t, b0.t, want.t);
  Compare(OpKind::kAdd, "output", out, want.t, kTolF32, "");
}

// Copy's source and destination never alias, so the reference reads the source as it is (a
// host copy would lose its stride-0 broadcast dimensions).
void CheckingBackend::Copy(const Tensor& src, Tensor dst) {
  if (!Checking(OpKind::kCopy)) return inner().Copy(src, dst);
  inner().Copy(src, dst);
  MaybePerturb(OpKind::kCopy, dst);
  HostCopy want = ZerosLike(dst);
  reference_.Copy(src, want.t);
  Compare(OpKind::kCopy, "output", dst, want.t, kTolF32, "");
}

void CheckingBackend::GatherRows(const Tensor& x, const Tensor& rows, Tensor out) {
  if (!Checking(OpKind::kGatherRows)) return inner().GatherRows(x, rows, out);
  HostCopy x0 = CopyOf(x), r0 = CopyOf(rows);
  inner().GatherRows(x, rows, out);
  MaybePerturb(OpKind::kGatherRows, out);
  HostCopy want = ZerosLike(out);
  reference_.GatherRows(x0.t, r0.t, want.t);
  Compare(OpKind::kGatherRows, "output", out, want.t, kTolF32, "");
}

// Expert ids are compared as each token's set (sorted by id, with their weights): the order in
// which a backend lists the top-k is not part of the op's contract.
void CheckingBackend::MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p,
                              Tensor topk_ids, Tensor topk_weights) {
  if (!Checking(OpKind::kMoeGate)) return inner().MoeGate(logits, bias, p, topk_ids, topk_weights);
  HostCopy l0 = CopyOf(logits);
  inner().MoeGate(logits, bias, p, topk_ids, topk_weights);
  MaybePerturb(OpKind::kMoeGate, topk_weights);
  HostCopy got_ids = CopyOf(topk_ids), got_w = CopyOf(topk_weights);
  HostCopy want_ids = ZerosLike(topk_ids), want_w = ZerosLike(topk_weights);
  reference_.MoeGate(l0.t, bias, p, want_ids.t, want_w.t);
  const int64_t tokens = topk_ids.shape[0], k = topk_ids.shape[1];
  for (HostCopy* ids : {&got_ids, &want_ids}) {
    HostCopy* w = ids == &got_ids ? &got_w : &want_w;
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<std::pair<int32_t, float>> row(k);
      for (int64_t j = 0; j < k; ++j)
        row[j] = {ids->t.as<int32_t>()[t * k + j], w->t.as<float>()[t * k + j]};
      std::sort(row.begin(), row.end());
      for (int64_t j = 0; j < k; ++j) {
        ids->t.as<int32_t>()[t * k + j] = row[j].first;
        w->t.as<float>()[t * k + j] = row[j].second;
      }
    }
  }
  Compare(OpKind::kMoeGate, "expert ids", got_ids.t, want_ids.t, 0.0f, "");
  Compare(OpKind::kMoeGate, "expert weights", got_w.t, want_w.t, kTolF32, "");
}

void CheckingBackend::MoeExperts(const Tensor& x, const Tensor& topk_ids,
                                 const Tensor& topk_weights,
                                 std::span<const ExpertWeights> experts, Tensor out) {
  if (!Checking(OpKind::kMoeExperts))
    return inner().MoeExperts(x, topk_ids, topk_weights, experts, out);
  HostCopy x0 = CopyOf(x), i0 = CopyOf(topk_ids), w0 = CopyOf(topk_weights);
  inner().MoeExperts(x, topk_ids, topk_weights, experts, out);
  MaybePerturb(OpKind::kMoeExperts, out);
  HostCopy want = ZerosLike(out);
  reference_.MoeExperts(x0.t, i0.t, w0.t, experts, want.t);
  const float tol = experts.empty() ? kTolF32 : TolFor(experts[0].gate);
  Compare(OpKind::kMoeExperts, "output", out, want.t, tol,
          experts.empty() ? "" : fmt::format("{} experts, {}", experts.size(),
                                             WeightText(experts[0].gate)));
}

SelfCheckReport RunSelfCheck(Model& model, CheckingBackend& checker, SelfCheckMode mode,
                             uint64_t weight_bytes) {
  SelfCheckReport report;
  if (mode == SelfCheckMode::kOff) return report;
  const std::string device = checker.inner().name();
  if (device == "reference") {
    report.state = "skipped";
    report.message = "the chosen backend is the reference backend";
    return report;
  }
  if (device != "cpu") {
    report.state = "skipped";
    report.message = fmt::format("the checker reads op tensors in host memory; backend '{}' is "
                                 "not a host backend", device);
    return report;
  }
  // The reference's plain loops run ~1 GB of weights in tens of seconds on one core: past
  // 256 MiB only the first two layers (and their share of a step) are compared.
  constexpr uint64_t kFullCheckMaxBytes = 256ull << 20;
  constexpr int kFirstLayers = 2;
  if (mode == SelfCheckMode::kAuto)
    mode = weight_bytes <= kFullCheckMaxBytes ? SelfCheckMode::kFull : SelfCheckMode::kFirstLayers;
  const int max_layers = mode == SelfCheckMode::kFull ? -1 : kFirstLayers;
  report.scope = max_layers < 0 ? "all layers" : fmt::format("first {} layers", kFirstLayers);

  const auto start = std::chrono::steady_clock::now();
  const int vocab = static_cast<int>(model.config().vocab_size);
  constexpr int kPromptTokens = 8, kDecodeSteps = 3;
  auto runner = SequenceRunner::Create(model, checker, kPromptTokens + kDecodeSteps + 1);
  if (!runner.ok()) {
    report.state = "failed";
    report.message = "self-check: " + runner.status().message();
    report.out_of_step = true;  // for one rank's allocation failure, the others go on
    return report;
  }
  std::vector<int32_t> ids;
  for (int i = 0; i < kPromptTokens; ++i) ids.push_back((1 + 37 * i) % std::max(vocab, 1));
  checker.BeginCheck(max_layers);
  Status failed = Status::Ok();
  for (int step = 0; step <= kDecodeSteps && failed.ok(); ++step) {
    checker.BeginStep();
    auto logits = (*runner)->Feed(ids, /*all_logits=*/false);
    ++report.steps;
    if (logits.ok() && !checker.injected_error().ok()) logits = checker.injected_error();
    if (!logits.ok()) {
      failed = logits.status();
      report.out_of_step = true;
      break;
    }
    ids = {ArgMax(*logits)};
  }
  Status diff = checker.EndCheck();
  if (!diff.ok()) failed = diff;
  report.ops_checked = checker.ops_checked();
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.state = failed.ok() ? "passed" : "failed";
  if (!failed.ok()) report.message = failed.message();
  return report;
}

namespace {

// One rank's report on the wire (fixed size for the all-gather; strings cut to fit).
struct WireReport {
  char state[16];
  char scope[32];
  char message[2048];
  int64_t ops_checked;
  int64_t pid;
  int32_t steps;
  double seconds;
};

template <size_t N>
void Put(char (&dst)[N], const std::string& src) {
  const size_t n = std::min(src.size(), N - 1);
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

}  // namespace

SelfCheckReport RunSelfCheckOnRanks(Model& model, CheckingBackend& checker, SelfCheckMode mode,
                                    uint64_t weight_bytes, comm::Communicator& comm,
                                    std::vector<SelfCheckReport>* per_rank) {
  checker.SetRank(comm.Rank());
  const SelfCheckReport mine = RunSelfCheck(model, checker, mode, weight_bytes);
  if (mine.out_of_step) {
    // Gathering now would meet the other ranks inside a collective of the forward.
    SelfCheckReport out = mine;
    std::string what = mine.message;
    constexpr std::string_view kPrefix = "self-check: ";
    if (what.compare(0, kPrefix.size(), kPrefix) == 0) what.erase(0, kPrefix.size());
    out.message = fmt::format("self-check on rank {} (pid {}): {}", comm.Rank(), ::getpid(), what);
    return out;
  }
  WireReport w{};
  Put(w.state, mine.state);
  Put(w.scope, mine.scope);
  Put(w.message, mine.message);
  w.ops_checked = mine.ops_checked;
  w.pid = static_cast<int64_t>(::getpid());
  w.steps = mine.steps;
  w.seconds = mine.seconds;
  std::vector<WireReport> all(static_cast<size_t>(comm.Size()));
  SelfCheckReport out;
  if (Status st = comm.AllGather(&w, sizeof(WireReport), all.data()); !st.ok()) {
    out.state = "failed";
    out.message = "self-check: gathering the ranks' reports: " + st.message();
    return out;
  }
  std::vector<SelfCheckReport> ranks;
  for (WireReport& r : all) {
    SelfCheckReport one;
    r.state[sizeof(r.state) - 1] = r.scope[sizeof(r.scope) - 1] =
        r.message[sizeof(r.message) - 1] = '\0';
    one.state = r.state;
    one.scope = r.scope;
    one.message = r.message;
    one.ops_checked = r.ops_checked;
    one.steps = r.steps;
    one.seconds = r.seconds;
    ranks.push_back(one);
  }
  out = ranks[0];
  out.ops_checked = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const SelfCheckReport& one = ranks[r];
    out.ops_checked += one.ops_checked;
    out.seconds = std::max(out.seconds, one.seconds);
    if (one.state == "failed" && out.state != "failed") {
      out.state = "failed";
      std::string what = one.message;
      constexpr std::string_view kPrefix = "self-check: ";
      if (what.compare(0, kPrefix.size(), kPrefix) == 0) what.erase(0, kPrefix.size());
      out.message = fmt::format("self-check on rank {} (pid {}): {}", r, all[r].pid, what);
    } else if (one.state != "failed" && one.state != out.state && out.state != "failed") {
      out.state = "failed";  // ranks that disagree on skipping cannot have run in step
      out.message = fmt::format("self-check: rank {} says '{}', rank 0 '{}'", r, one.state,
                                ranks[0].state);
    }
  }
  if (per_rank) *per_rank = std::move(ranks);
  return out;
}

}  // namespace dh::app
