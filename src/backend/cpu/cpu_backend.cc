// CpuBackend: thread pool set-up, kernel tracing, and for each op the choice between the SIMD
// kernels of cpu_kernels.cc (f32 activations with contiguous rows) and the reference fallback.
// MatMul and BatchedMatMul are in cpu_matmul.cc; Rope, KvWrite and KvGather in cpu_rope_kv.cc.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/attention.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/quant_vnni.h"
#include "backend/cpu/row_view.h"
#include "backend/kernel_note.h"
#include "backend/reference/reference_ops.h"
#include "base/check.h"
#include "base/log.h"
#include "hwy/targets.h"

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

namespace dh {
namespace {

using cpu::AsRows;
using cpu::GrainFor;
using cpu::IsPlainVector;
using cpu::RowView;
using cpu::SameRows;
using cpu::WType;
using cpu::WTypeOf;

// Runs fn(a, b, out, n) over all elements of three same-shaped row views: over flat chunks when
// all are contiguous (one long row parallelises too), else row by row.
template <typename Fn>
void ForEachElementChunk(ThreadPool& pool, const RowView& a, const RowView& b, const RowView& o,
                         Fn fn) {
  if (a.contiguous && b.contiguous && o.contiguous) {
    pool.ParallelFor(a.rows * a.cols, 16384, [&](size_t begin, size_t end) {
      fn(a.row(0) + begin, b.row(0) + begin, o.row(0) + begin, static_cast<int64_t>(end - begin));
    });
    return;
  }
  pool.ParallelFor(a.rows, GrainFor(a.cols), [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) fn(a.row(r), b.row(r), o.row(r), a.cols);
  });
}

// The kernel element type of a KV cache view, or nullopt for a layout Attend does not read.
std::optional<cpu::KvType> KvTypeOf(const KvCacheView& c) {
  const bool scaled = c.quantized() && c.group_size > 0 && c.scales.dtype == DType::kF32 &&
                      c.scales.ndim == 3 && c.scales.stride[2] == 1;
  switch (c.data.dtype) {
    case DType::kF32: return c.quantized() ? std::nullopt : std::optional(cpu::KvType::kF32);
    case DType::kBF16: return c.quantized() ? std::nullopt : std::optional(cpu::KvType::kBF16);
    case DType::kF8E4M3: return scaled ? std::optional(cpu::KvType::kF8E4M3) : std::nullopt;
    case DType::kI8: return scaled ? std::optional(cpu::KvType::kI8) : std::nullopt;
    default: return std::nullopt;
  }
}

// DH_CPU_TIER=avx2|avxvnni (unset: the best the CPU has) runs the backend as on a CPU of that
// x86 tier: Highway kernels no wider than AVX2, and the integer-dot kernel of that tier (unless
// DH_INTEGER_DOT names one), so an AVX-512 machine tests and benchmarks its AVX2 paths.
void ApplyCpuTierFromEnv() {
  static const bool applied = [] {
    const char* v = std::getenv("DH_CPU_TIER");
    if (v == nullptr || *v == '\0') return false;
    const std::string_view s(v);
    if (s != "avx2" && s != "avxvnni") {
      DH_LOG(Warning, "DH_CPU_TIER={}: expected avx2 or avxvnni; using the CPU's best", s);
      return false;
    }
#if HWY_ARCH_X86
    hwy::DisableTargets(HWY_AVX2 - 1);  // every x86 target above AVX2 (lower bits are better)
#endif
    const char* dot = std::getenv("DH_INTEGER_DOT");
    const std::string_view d = dot ? dot : "";
    if (d != "avx2" && d != "avxvnni" && d != "vnni512") {
      cpu::SetIntegerDotPathForTest(s == "avx2" ? cpu::IntegerDotPath::kAvx2
                                                : cpu::IntegerDotPath::kAvxVnni);
    }
    return true;
  }();
  (void)applied;
}

// The SIMD features of this CPU as the compile-cache key records them ("x86 avx2 fma ...").
std::string CpuFeatureString() {
  std::string s;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  s = "x86";
#define DH_CPU_FEATURE(name) \
  if (__builtin_cpu_supports(name)) s += " " name;
  DH_CPU_FEATURE("sse4.2")
  DH_CPU_FEATURE("avx")
  DH_CPU_FEATURE("avx2")
  DH_CPU_FEATURE("fma")
  DH_CPU_FEATURE("bmi2")
  DH_CPU_FEATURE("avx512f")
  DH_CPU_FEATURE("avx512vl")
  DH_CPU_FEATURE("avx512dq")
  DH_CPU_FEATURE("avx512bw")
  DH_CPU_FEATURE("avx512vnni")
  DH_CPU_FEATURE("avx512vbmi")
  DH_CPU_FEATURE("avx512vbmi2")
  DH_CPU_FEATURE("avx512bf16")
  DH_CPU_FEATURE("avx512fp16")
#undef DH_CPU_FEATURE
#elif defined(__aarch64__)
  s = fmt::format("aarch64 hwcap={:x} hwcap2={:x}", getauxval(AT_HWCAP), getauxval(AT_HWCAP2));
#else
  s = "unknown";
#endif
  return s;
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options)
    : ReferenceBackend(options),
      pool_(std::make_unique<ThreadPool>(options.num_threads > 0 ? options.num_threads
                                                                 : AvailableCpus())),
      inline_pool_(std::make_unique<ThreadPool>(1)) {
  ApplyCpuTierFromEnv();
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::KernelTag() const {
  return fmt::format("target={} tiles={} cpu={}", cpu::DispatchedTargetName(),
                     cpu::PrepackWanted(/*int4=*/true) ? "int-v1" : "off", CpuFeatureString());
}

bool CpuBackend::Supports(const OpDesc& op) const {
  switch (op.op) {
    case OpKind::kMatMul:
    case OpKind::kEmbedding:
      return op.format != WeightFormat::kDense || WTypeOf(op.dtype).has_value();
    case OpKind::kAttention:
      return op.dtype == DType::kF32 || op.dtype == DType::kBF16 || op.dtype == DType::kF8E4M3 ||
             op.dtype == DType::kI8;
    case OpKind::kKvWrite:
    case OpKind::kKvGather:  // every cache format (rope_kv.cc)
      return op.dtype == DType::kF32 || op.dtype == DType::kBF16 || op.dtype == DType::kF16 ||
             op.dtype == DType::kF8E4M3 || op.dtype == DType::kI8;
    case OpKind::kRope:
    case OpKind::kRmsNorm:
    case OpKind::kAddRmsNorm:
    case OpKind::kSiluMul:
    case OpKind::kAdd:
      return op.dtype == DType::kF32;
    case OpKind::kBatchedMatMul:  // the GEMV kernel over all heads, or MatMul per head
    case OpKind::kMoeGate:
    case OpKind::kMoeExperts:  // grouped over the accelerated MatMul and SiluMul (cpu_moe.cc)
      return true;
    default:
      return false;
  }
}

void CpuBackend::Trace(const std::string& what) {
  if (!options().trace_kernels) return;
  std::lock_guard<std::mutex> lock(trace_mu_);
  if (traced_.insert(what).second) {
    DH_LOG(Info, "kernel: {} target={}", what, cpu::DispatchedTargetName());
  }
}

void CpuBackend::Embedding(const Weight& table, const Tensor& ids, Tensor out) {
  DH_CHECK(!table.rows_released, "embedding: the table's rows were released (the loader marks "
           "tables read_by_rows)");
  const auto o = AsRows(out);
  const auto wtype = WTypeOf(table.data.dtype);
  if (table.format != WeightFormat::kDense || !wtype || !o || table.data.ndim != 2 ||
      table.data.stride[1] != 1 || o->rows != ids.numel() || o->cols != table.cols) {
    Trace("embedding reference {}", WeightFormatName(table.format));
    return ReferenceBackend::Embedding(table, ids, out);
  }
  NoteKernel("embedding", cpu::DispatchedTargetName);
  Trace("embedding {} T={} H={}", DTypeName(table.data.dtype), o->rows, o->cols);
  const size_t esize = DTypeSize(table.data.dtype);
  pool_->ParallelFor(o->rows, GrainFor(o->cols), [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      const int32_t id = ref::GetI32(ids, t);
      DH_CHECK(id >= 0 && id < table.rows, "token id {} outside the vocabulary of {}", id,
               table.rows);
      const char* src = static_cast<const char*>(table.data.data) +
                        static_cast<int64_t>(id) * table.data.stride[0] * esize;
      cpu::WidenRow(src, *wtype, o->row(t), o->cols);
    }
  });
}

void CpuBackend::RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  const auto xr = AsRows(x), o = AsRows(out);
  if (!xr || !o || !SameRows(*xr, *o) || !IsPlainVector(weight, xr->cols)) {
    Trace("rmsnorm reference");
    return ReferenceBackend::RmsNorm(x, weight, eps, out);
  }
  NoteKernel("rmsnorm", cpu::DispatchedTargetName);
  Trace("rmsnorm T={} H={} w={}", xr->rows, xr->cols, DTypeName(weight.dtype));
  const WType wtype = *WTypeOf(weight.dtype);
  pool_->ParallelFor(xr->rows, GrainFor(xr->cols), [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      const float ss = cpu::SumOfSquares(xr->row(r), xr->cols);
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(xr->cols) + eps);
      cpu::ScaleByWeight(xr->row(r), inv, weight.data, wtype, o->row(r), xr->cols);
    }
  });
}

void CpuBackend::AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                            Tensor out) {
  const auto res = AsRows(residual), xr = AsRows(x), o = AsRows(out);
  if (!res || !xr || !o || !SameRows(*res, *xr) || !SameRows(*res, *o) ||
      !IsPlainVector(weight, res->cols)) {
    Trace("add_rmsnorm reference");
    return ReferenceBackend::AddRmsNorm(residual, x, weight, eps, out);
  }
  NoteKernel("add-rmsnorm", cpu::DispatchedTargetName);
  Trace("add_rmsnorm T={} H={} w={}", res->rows, res->cols, DTypeName(weight.dtype));
  const WType wtype = *WTypeOf(weight.dtype);
  pool_->ParallelFor(res->rows, GrainFor(res->cols), [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      cpu::AddRow(res->row(r), xr->row(r), res->row(r), res->cols);
      const float ss = cpu::SumOfSquares(res->row(r), res->cols);
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(res->cols) + eps);
      cpu::ScaleByWeight(res->row(r), inv, weight.data, wtype, o->row(r), res->cols);
    }
  });
}

void CpuBackend::Attention(const Tensor& q, const KvCacheView& k_cache,
                           const KvCacheView& v_cache, const AttentionMeta& meta, float scale,
                           Tensor out) {
  auto inner_ok = [](const Tensor& t) {
    return t.ndim == 3 && (t.stride[2] == 1 || t.shape[2] == 1);
  };
  const std::optional<cpu::KvType> kv_type = KvTypeOf(k_cache);
  const bool same_format = KvTypeOf(v_cache) == kv_type &&
                           k_cache.quantized() == v_cache.quantized() &&
                           k_cache.group_size == v_cache.group_size;
  if (q.dtype != DType::kF32 || out.dtype != DType::kF32 || !inner_ok(q) ||
      !inner_ok(k_cache.data) || !inner_ok(v_cache.data) || !inner_ok(out) || !kv_type ||
      !same_format) {
    Trace("attention reference");
    return ReferenceBackend::Attention(q, k_cache, v_cache, meta, scale, out);
  }
  const Tensor& kc = k_cache.data;
  const Tensor& vc = v_cache.data;
  const int64_t hq = q.shape[1], dk = q.shape[2], hkv = kc.shape[1], dv = vc.shape[2];
  DH_CHECK(hkv > 0 && hq % hkv == 0 && vc.shape[1] == hkv && kc.shape[2] == dk &&
               out.shape[0] == q.shape[0] && out.shape[1] == hq && out.shape[2] == dv,
           "attention q {} k_cache {} v_cache {} out {}", q.ShapeString(), kc.ShapeString(),
           vc.ShapeString(), out.ShapeString());
  const int64_t t_count = q.shape[0];
  NoteKernel("attention", cpu::DispatchedTargetName);
  Trace("attention T={} Hq={} Hkv={} Dk={} Dv={} seqs={} kv={}", t_count, hq, hkv, dk, dv,
        meta.num_seqs, DTypeName(kc.dtype));
  // Per sequence, the cache slot of every position (sequence s's from slot_start[s]).
  // Backend-owned scratch: a decode step allocates nothing.
  std::vector<int64_t>& slots = attn_.slots;
  std::vector<int64_t>& slot_start = attn_.slot_start;
  std::vector<AttentionItem>& items = attn_.items;
  std::vector<AttentionSplit>& splits = attn_.splits;
  // Capacity grows by doubling from 256 entries, so a growing sequence reallocates rarely.
  auto reserve = [](auto& v, size_t n) {
    v.clear();
    if (v.capacity() < n) v.reserve(std::max<size_t>(256, std::bit_ceil(n)));
  };
  int64_t total_slots = 0;
  for (int s = 0; s < meta.num_seqs; ++s) total_slots += ref::GetSeqLayout(meta, s).seq_len;
  reserve(slots, static_cast<size_t>(total_slots));
  slot_start.assign(meta.num_seqs, 0);
  const int64_t group = hq / hkv;
  // Work items: blocks of up to kAttendMaxRows query rows of one sequence that share a kv head,
  // row i of a sequence's block list being position i / group and query head kvh * group +
  // i % group, so the rows of a block see each key row once. With fewer blocks than threads (a
  // decode of few sequences, MLA's single kv head above all), each block's keys are cut into
  // one range per thread, whole key blocks each; the ranges' partial sums go to attn_.partial
  // and are merged after (attention.h AttendBlockArgs::row_max).
  const int threads = pool_->num_threads();
  auto row_blocks = [&](const ref::SeqLayout& seq) {
    const int64_t rows = (seq.query_end - seq.query_start) * group;
    return hkv * ((rows + cpu::kAttendMaxRows - 1) / cpu::kAttendMaxRows);
  };
  int64_t blocks = 0, max_rows = 0, max_keys = 0;
  for (int s = 0; s < meta.num_seqs; ++s) {
    const ref::SeqLayout seq = ref::GetSeqLayout(meta, s);
    blocks += row_blocks(seq);
    max_rows = std::max(max_rows, (seq.query_end - seq.query_start) * group);
    max_keys = std::max<int64_t>(max_keys, seq.seq_len);
  }
  const int64_t key_parts = blocks > 0 && blocks < threads ? (threads + blocks - 1) / blocks : 1;
  // Decode with several kv heads in a cache laid out slot by slot (a slot's head rows side by
  // side): the keys are cut into chunks of kAttendHeadChunk and one thread runs every head of a
  // chunk in turn, so the threads read nearby stretches of the cache instead of one head each.
  // Measured, not explained: one thread per head read 1.55x slower per byte than a single-head
  // cache, and the chunks read Qwen2's f32 cache at 4096 keys 1.3-1.5x faster on two threads,
  // at batch 1 and 8 (bench/README.md "Zen 5, session 40"); one thread gained nothing. The
  // engine's own cache is laid out head by head (Backend::KvCacheHeadMajor), where a head's
  // keys are one stream and one thread per head read 1.1-1.3x faster than the chunks
  // (bench/README.md "Zen 5, session 41"): no chunks there.
  const bool slot_major = kc.stride[1] < kc.stride[0];
  const bool head_chunks = slot_major && hkv > 1 && max_rows <= cpu::kAttendChunkMaxRows &&
                           max_keys > cpu::kAttendHeadChunk;
  const int64_t chunk_parts =
      head_chunks ? (max_keys + cpu::kAttendHeadChunk - 1) / cpu::kAttendHeadChunk : 1;
  reserve(items, static_cast<size_t>(blocks * std::max(key_parts, chunk_parts)));
  reserve(splits, static_cast<size_t>(key_parts > 1 || head_chunks ? blocks : 0));
  int64_t total_cost = 0, partial_floats = 0;
  for (int s = 0; s < meta.num_seqs; ++s) {
    const ref::SeqLayout seq = ref::GetSeqLayout(meta, s);
    DH_CHECK(seq.query_start >= 0 && seq.query_end <= t_count &&
                 seq.query_end - seq.query_start <= seq.seq_len,
             "sequence {} rows [{}, {}) of {}, {} cached", s, seq.query_start, seq.query_end,
             t_count, seq.seq_len);
    slot_start[s] = static_cast<int64_t>(slots.size());
    for (int64_t p = 0; p < seq.seq_len; ++p) {
      slots.push_back(ref::SlotOf(seq, meta.block_size, p));
      DH_CHECK(slots.back() >= 0 && slots.back() < kc.shape[0] && slots.back() < vc.shape[0],
               "slot {} of {}", slots.back(), kc.shape[0]);
    }
    const int64_t num_queries = seq.query_end - seq.query_start;
    const int64_t rows = num_queries * group;
    for (int64_t kvh = 0; kvh < hkv; ++kvh) {
      for (int64_t r0 = 0; r0 < rows; r0 += cpu::kAttendMaxRows) {
        const int64_t n = std::min<int64_t>(cpu::kAttendMaxRows, rows - r0);
        // The block's last row sees the most keys; the cost counts row vectors of up to 16.
        const int64_t keys = seq.seq_len - num_queries + (r0 + n - 1) / group + 1;
        const int64_t per_part = (keys + key_parts - 1) / key_parts;
        const int64_t range = head_chunks ? cpu::kAttendHeadChunk
                                          : (per_part + cpu::kAttendKeyBlock - 1) /
                                                cpu::kAttendKeyBlock * cpu::kAttendKeyBlock;
        const bool split = range < keys;
        if (split) {
          splits.push_back({s, static_cast<int32_t>(kvh), static_cast<int32_t>(r0),
                            static_cast<int32_t>(n), partial_floats,
                            static_cast<int32_t>((keys + range - 1) / range)});
        }
        for (int64_t k0 = 0; k0 < keys; k0 += range) {
          const int64_t k1 = std::min(keys, k0 + range);
          const int64_t cost = (k1 - k0) * ((n + 15) / 16) * (dk + dv);
          items.push_back({s, static_cast<int32_t>(kvh), static_cast<int32_t>(r0),
                           static_cast<int32_t>(n), k0, k1, split ? partial_floats : -1, cost});
          if (split) partial_floats += n * (dv + 2);
          total_cost += cost;
        }
      }
    }
  }
  std::vector<float>& partial = attn_.partial;
  if (partial.size() < static_cast<size_t>(partial_floats)) {
    partial.resize(std::max<size_t>(4096, std::bit_ceil(static_cast<size_t>(partial_floats))));
  }
  // The costliest first (causal prefill: the last positions), handed out one at a time; with
  // head chunks, every head of one chunk together, handed out as one.
  std::sort(items.begin(), items.end(), [](const AttentionItem& x, const AttentionItem& y) {
    if (x.cost != y.cost) return x.cost > y.cost;
    if (x.seq != y.seq) return x.seq < y.seq;
    if (x.row0 != y.row0) return x.row0 < y.row0;
    if (x.key_begin != y.key_begin) return x.key_begin < y.key_begin;
    return x.kvh < y.kvh;
  });
  // Items handed out together: every head of a chunk (same sequence, rows and keys, so the
  // same cost: adjacent after the sort), or one item.
  std::vector<size_t>& groups = attn_.groups;
  groups.clear();
  for (size_t i = 0; i < items.size(); ++i) {
    const bool same = head_chunks && i > 0 && items[i].seq == items[i - 1].seq &&
                      items[i].row0 == items[i - 1].row0 &&
                      items[i].key_begin == items[i - 1].key_begin;
    if (!same) groups.push_back(i);
  }
  groups.push_back(items.size());
  const float* qd = q.as<const float>();
  const char* kd = static_cast<const char*>(kc.data);
  const char* vd = static_cast<const char*>(vc.data);
  const size_t esize = DTypeSize(kc.dtype);
  const Tensor& ks = k_cache.scales;
  const Tensor& vs = v_cache.scales;
  float* od = out.as<float>();
  // Per thread, grown by doubling: the kernel's scratch and 16 floats to align it to 64 bytes.
  const size_t scratch_floats = static_cast<size_t>(cpu::AttendScratchLayout(dk, dv).total) + 16;
  auto run = [&](const AttentionItem& item) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < scratch_floats) {
      scratch.resize(std::max<size_t>(4096, std::bit_ceil(scratch_floats)));
    }
    const ref::SeqLayout seq = ref::GetSeqLayout(meta, item.seq);
    const int64_t num_queries = seq.query_end - seq.query_start;
    const int64_t kvh = item.kvh;
    cpu::AttendBlockArgs a;
    a.kv_type = *kv_type;
    a.k_base = kd + kvh * kc.stride[1] * esize;
    a.k_slot_stride = kc.stride[0];
    a.v_base = vd + kvh * vc.stride[1] * esize;
    a.v_slot_stride = vc.stride[0];
    if (k_cache.quantized()) {
      a.k_scales = ks.as<const float>() + kvh * ks.stride[1];
      a.k_scale_stride = ks.stride[0];
      a.v_scales = vs.as<const float>() + kvh * vs.stride[1];
      a.v_scale_stride = vs.stride[0];
      a.group = k_cache.group_size;
    }
    a.dk = dk;
    a.dv = dv;
    a.slots = slots.data() + slot_start[item.seq];
    a.scale = scale;
    a.rows = item.rows;
    a.key_begin = item.key_begin;
    a.key_end = item.key_end;
    float* part = item.partial >= 0 ? partial.data() + item.partial : nullptr;
    for (int r = 0; r < item.rows; ++r) {
      const int64_t i = item.row0 + r, p = i / group, h = kvh * group + i % group;
      const int64_t t = seq.query_start + p;
      a.q[r] = qd + t * q.stride[0] + h * q.stride[1];
      a.out[r] = part ? part + r * dv : od + t * out.stride[0] + h * out.stride[1];
      a.num_positions[r] = seq.seq_len - num_queries + p + 1;
    }
    if (part) {
      a.row_max = part + item.rows * dv;
      a.row_sum = a.row_max + item.rows;
    }
    const uintptr_t base = reinterpret_cast<uintptr_t>(scratch.data());
    a.scratch = scratch.data() + ((64 - base % 64) % 64) / sizeof(float);
    cpu::AttendBlock(a);
  };
  // Spread over the threads once there are ~64K multiply-adds (4096 vector ones): a decode step
  // of a small model at short context stays on one thread, where a dispatch per layer would
  // cost more than the attention.
  const size_t num_groups = groups.size() - 1;
  if (total_cost < 4096 || threads == 1) {
    for (const AttentionItem& item : items) run(item);
  } else {
    std::atomic<size_t> next{0};
    pool_->ParallelFor(static_cast<size_t>(threads), 1, [&](size_t, size_t) {
      for (size_t g = next.fetch_add(1, std::memory_order_relaxed); g < num_groups;
           g = next.fetch_add(1, std::memory_order_relaxed)) {
        for (size_t i = groups[g]; i < groups[g + 1]; ++i) run(items[i]);
      }
    });
  }
  // Each split block's ranges merged: out = sum_i e^(max_i - M) out_i / sum_i e^(max_i - M) sum_i.
  for (const AttentionSplit& sp : splits) {
    const ref::SeqLayout seq = ref::GetSeqLayout(meta, sp.seq);
    const int64_t stride = static_cast<int64_t>(sp.rows) * (dv + 2);
    for (int r = 0; r < sp.rows; ++r) {
      const int64_t i = sp.row0 + r, h = sp.kvh * group + i % group;
      const int64_t t = seq.query_start + i / group;
      float* o = od + t * out.stride[0] + h * out.stride[1];
      const float* first = partial.data() + sp.partial;
      float mx = first[sp.rows * dv + r];
      for (int p = 1; p < sp.parts; ++p) mx = std::max(mx, first[p * stride + sp.rows * dv + r]);
      float den = 0.0f;
      std::fill(o, o + dv, 0.0f);
      for (int p = 0; p < sp.parts; ++p) {
        const float* part = first + p * stride;
        const float w = std::exp(part[sp.rows * dv + r] - mx);
        den += w * part[sp.rows * dv + sp.rows + r];
        for (int64_t d = 0; d < dv; ++d) o[d] += w * part[r * dv + d];
      }
      const float inv = 1.0f / den;
      for (int64_t d = 0; d < dv; ++d) o[d] *= inv;
    }
  }
}

void CpuBackend::SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  SiluMulOn(*pool_, gate, up, out);
}

void CpuBackend::SiluMulOn(ThreadPool& pool, const Tensor& gate, const Tensor& up, Tensor out) {
  const auto g = AsRows(gate), u = AsRows(up), o = AsRows(out);
  if (!g || !u || !o || !SameRows(*g, *u) || !SameRows(*g, *o)) {
    Trace("silu_mul reference");
    return ReferenceBackend::SiluMul(gate, up, out);
  }
  NoteKernel("silu-mul", cpu::DispatchedTargetName);
  Trace("silu_mul T={} I={}", g->rows, g->cols);
  ForEachElementChunk(pool, *g, *u, *o, cpu::SiluMulRow);
}

void CpuBackend::Add(const Tensor& a, const Tensor& b, Tensor out) {
  const auto ar = AsRows(a), br = AsRows(b), o = AsRows(out);
  if (!ar || !br || !o || !SameRows(*ar, *br) || !SameRows(*ar, *o)) {
    Trace("add reference");
    return ReferenceBackend::Add(a, b, out);
  }
  NoteKernel("add", cpu::DispatchedTargetName);
  Trace("add T={} H={}", ar->rows, ar->cols);
  ForEachElementChunk(*pool_, *ar, *br, *o, cpu::AddRow);
}

}  // namespace dh
