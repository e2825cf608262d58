// The device interface (docs/DESIGN.md "The device interface"). Model, kvcache and engine code
// talk to hardware only through Backend. Tensors passed to ops live in this backend's Buffers
// (or, for host-accessible backends, in host memory). Activations are f32 unless stated.
//
// Ops are coarse and shaped for DeepSeek/Llama/Qwen models. Every op has a plain-loop
// implementation in backend/reference; a backend derived from ReferenceBackend overrides what it
// accelerates and inherits the rest.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace dh {

class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  virtual size_t size() const = 0;
};

// Rotary embedding pairing. kHalf: (x[i], x[i + d/2]) as Llama/Qwen2 HF checkpoints need;
// kInterleaved: (x[2i], x[2i+1]) as DeepSeek's MLA rope slice needs (reference/deepseek-semantics).
enum class RopeStyle : uint8_t { kHalf, kInterleaved };

struct RopeParams {
  RopeStyle style = RopeStyle::kHalf;
  int offset = 0;          // first rotated element inside each head
  int rot_dim = 0;         // rotated elements per head (even)
  Tensor inv_freq;         // [rot_dim / 2] f32: angle_i = float(pos) * inv_freq[i]
  float attention_factor = 1.0f;  // cos and sin are multiplied by this (YaRN's mscale ratio)
};

// Where each token of a batch comes from and where its keys/values live. The paged cache is a
// pool of slots (slot = block * block_size + offset). Sequence s owns query rows
// [query_start[s], query_start[s+1]) which are the last rows of its seq_lens[s] cached tokens.
struct AttentionMeta {
  int num_seqs = 0;
  int num_tokens = 0;
  int block_size = 16;
  int max_blocks_per_seq = 0;
  int max_seq_len = 0;          // max over seq_lens
  Tensor query_start;           // [num_seqs + 1] i32
  Tensor seq_lens;              // [num_seqs] i32
  Tensor block_tables;          // [num_seqs, max_blocks_per_seq] i32
  Tensor slot_mapping;          // [num_tokens] i32
  // Host copies of the same arrays, for backends that plan work on the host.
  std::span<const int32_t> host_query_start;
  std::span<const int32_t> host_seq_lens;
  std::span<const int32_t> host_block_tables;
  std::span<const int32_t> host_slot_mapping;
};

// AttentionMeta for num_seqs sequences over host arrays that outlive it, for backends whose
// device memory is host memory (kernel tests, benchmarks): qs [num_seqs + 1] query starts, lens
// [num_seqs], tables [num_seqs, max_blocks]; device tensors and host spans view the same data
// (no slot mapping).
inline AttentionMeta HostAttentionMeta(std::vector<int32_t>& qs, std::vector<int32_t>& lens,
                                       std::vector<int32_t>& tables, int num_tokens,
                                       int block_size, int max_blocks, int max_len) {
  const int num_seqs = static_cast<int>(lens.size());
  AttentionMeta meta;
  meta.num_seqs = num_seqs;
  meta.num_tokens = num_tokens;
  meta.block_size = block_size;
  meta.max_blocks_per_seq = max_blocks;
  meta.max_seq_len = max_len;
  meta.query_start = Tensor(qs.data(), DType::kI32, {num_seqs + 1});
  meta.seq_lens = Tensor(lens.data(), DType::kI32, {num_seqs});
  meta.block_tables = Tensor(tables.data(), DType::kI32, {num_seqs, max_blocks});
  meta.host_query_start = qs;
  meta.host_seq_lens = lens;
  meta.host_block_tables = tables;
  return meta;
}

// One layer's K or V cache as KvWrite writes it and Attention reads it: values [slots, heads,
// dim] (dim 0 may be strided) stored as f32 or bf16, or quantized to f8e4m3 or i8 with f32
// scales [slots, heads, groups]: element i of a head row is data * scales[slot, head,
// i / group_size] (one scale per token and head, and per part of a row where parts differ in
// range: MLA's latent and its rope key; the last group may be shorter). KvWrite picks each scale
// as the group's max |x| / 448 (fp8) or / 127 (int8, round to nearest) and writes 0 for an
// all-zero group. A plain Tensor converts to an unquantized view.
struct KvCacheView {
  Tensor data;
  Tensor scales;           // empty unless data is f8e4m3 or i8
  int64_t group_size = 0;  // elements of a head row per scale (with scales)

  KvCacheView() = default;
  KvCacheView(const Tensor& values) : data(values) {}  // NOLINT: implicit on purpose
  KvCacheView(const Tensor& values, const Tensor& group_scales, int64_t group)
      : data(values), scales(group_scales), group_size(group) {}

  bool empty() const { return data.empty(); }
  bool quantized() const { return !scales.empty(); }
  int64_t dim(int i) const { return data.dim(i); }
  // Elements [begin, begin + count) of every head row, with their scales; `begin` must start a
  // group (MLA reads the latent part of its cache as the values).
  KvCacheView NarrowRow(int64_t begin, int64_t count) const {
    KvCacheView r = *this;
    r.data = data.Narrow(2, begin, count);
    if (quantized()) {
      DH_CHECK(begin % group_size == 0, "kv view narrowed at {} inside a group of {}", begin,
               group_size);
      const int64_t first = begin / group_size;
      r.scales = scales.Narrow(2, first, (begin + count + group_size - 1) / group_size - first);
    }
    return r;
  }
};

// A [slots, heads, dim] cache tensor (data or scales) laid out head by head
// (Backend::KvCacheHeadMajor): the same elements, one head's slots side by side.
inline Tensor HeadMajorKv(Tensor t) {
  t.stride[0] = t.shape[2];
  t.stride[1] = t.shape[0] * t.shape[2];
  return t;
}

enum class ScoringFunc : uint8_t { kSoftmax, kSigmoid };
enum class TopkMethod : uint8_t { kGreedy, kGroupLimitedGreedy, kNoauxTc };

struct MoeGateParams {
  ScoringFunc scoring = ScoringFunc::kSoftmax;
  TopkMethod method = TopkMethod::kGreedy;
  int top_k = 1;
  int n_group = 1;
  int topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};

// One product of Backend::MatMuls: out = x @ w^T (+ bias if not empty), as MatMul takes them.
struct MatMulTarget {
  const Weight* w = nullptr;
  Tensor bias;
  Tensor out;
};

// One routed expert: SwiGLU MLP down(silu(gate(x)) * up(x)).
struct ExpertWeights {
  Weight gate;
  Weight up;
  Weight down;
};

enum class OpKind : uint8_t {
  kEmbedding, kRmsNorm, kAddRmsNorm, kMatMul, kRope, kKvWrite, kAttention, kSiluMul, kAdd,
  kCopy, kGatherRows, kMoeGate, kMoeExperts, kBatchedMatMul, kKvGather,
};

// dtype: the activations', or for kKvWrite / kAttention / kKvGather the KV cache's.
struct OpDesc {
  OpKind op;
  WeightFormat format = WeightFormat::kDense;
  DType dtype = DType::kF32;
};

struct BackendOptions {
  int num_threads = 0;         // 0: all available CPUs
  bool trace_kernels = false;  // log the kernel chosen per op and shape
  // Whether PrepareWeight may then hand the bytes of the stored layout back to the system where
  // its own copy serves every product (Weight::rows_released); tests that switch kernels after
  // the load keep them.
  bool release_rows = true;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // What makes this backend's prepared weights (PrepareWeight) and kernels differ between
  // machines or builds of the same backend: e.g. the CPU's SIMD target and features, a GPU's
  // compute capability. It enters the compile-cache key next to name(); "" when nothing does.
  virtual std::string KernelTag() const { return ""; }
  // False where this backend would fall back to a slow path for the op (logged once).
  virtual bool Supports(const OpDesc& op) const = 0;

  // ---- memory ----
  virtual std::unique_ptr<Buffer> Allocate(size_t bytes) = 0;
  // Whether KvStorage lays this backend's KV cache out head by head: each layer's [slots, heads,
  // dim] view with strides {dim, slots * dim, 1}, a head's rows of every slot one stretch of
  // memory, instead of a slot's heads side by side. Both are KvCacheViews every op reads through
  // its strides; the CPU backend's decode reads its cache from memory faster this way.
  virtual bool KvCacheHeadMajor() const { return false; }
  // Copies dst.nbytes() bytes from host memory into a contiguous device tensor, and back.
  virtual void CopyToDevice(const Tensor& dst, const void* src) = 0;
  virtual void CopyToHost(void* dst, const Tensor& src) = 0;
  // Waits until every op issued so far has finished. Ops may run asynchronously on a device
  // (one stream per backend); CopyToHost waits for the ops before it by itself, and callers call
  // Synchronize where results cross to the host otherwise (timing, the end of a step).
  virtual void Synchronize() {}
  // Makes a weight read from a checkpoint (host memory) usable by this backend's kernels:
  // uploads or repacks it. Host backends return it unchanged. A weight served by a compile cache
  // may arrive with the `packed` copy this backend made when the file was written (the key holds
  // KernelTag, so the same layout), and with rows_released set where that copy serves every
  // product (PackedServesEveryProduct) and the file kept the rows' shapes only: the backend checks
  // the copy instead of making it again, and returns an error where it cannot use what arrived
  // (the load then falls back to the checkpoint).
  virtual Result<Weight> PrepareWeight(const Weight& w) { return w; }
  // Whether `w`'s packed copy (made by PrepareWeight) serves every product, so that a load hands
  // its row layout back to the system (Weight::rows_released) unless it is held; a compile cache
  // then stores the copy alone.
  virtual bool PackedServesEveryProduct(const Weight& w) const {
    (void)w;
    return false;
  }
  // Held releases: after HoldReleases, PrepareWeight keeps the stored bytes it would release
  // (BackendOptions::release_rows), leaves Weight::rows_released unset, and remembers them;
  // ReleaseHeldRows hands them back and ends the hold. For a reader of the stored layout that
  // comes after the load: the self-check's reference backend (apps/self_check.h).
  virtual void HoldReleases() {}
  virtual void ReleaseHeldRows() {}

  // ---- ops ----
  // out[t, :] = table[ids[t], :] as f32. ids: [T] i32; table rows: vocab.
  virtual void Embedding(const Weight& table, const Tensor& ids, Tensor out) = 0;
  // out = x * rsqrt(mean(x^2) + eps) * weight, per row. x, out: [T, H] (out may alias x).
  virtual void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) = 0;
  // residual += x; out = RmsNorm(residual).
  virtual void AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                          Tensor out) = 0;
  // out[M, N] = x[M, K] @ w^T (+ bias[N] if not empty), f32 accumulation.
  virtual void MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) = 0;
  // Several weights over the same x (a layer's q, k and v projections, an MLP's gate and up):
  // each target's out exactly as MatMul(x, *w, bias, out) gives it. A backend may prepare x once
  // for them all and hand out every weight's rows in one dispatch; this default runs MatMul
  // target by target.
  virtual void MatMuls(const Tensor& x, std::span<const MatMulTarget> targets) {
    for (const MatMulTarget& t : targets) MatMul(x, *t.w, t.bias, t.out);
  }
  // One weight per head: out[t, h, :] = x[t, h, :] @ w[h]^T for h < w.size() (einsum
  // "thk,hnk->thn"; MLA's absorbed W_uk^T and W_uv). x: [T, heads, K], out: [T, heads, N], dims 0
  // and 1 strided allowed, dim 2 contiguous; every w[h] is [N, K]. f32 accumulation.
  virtual void BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) = 0;
  // In place on x: [T, H, D] (dims 0 and 1 may be strided); positions: [T] i32.
  virtual void Rope(Tensor x, const Tensor& positions, const RopeParams& p) = 0;
  // k_cache[slot_mapping[t]] = k[t]; same for v. k: [T, Hkv, Dk]; caches: [slots, Hkv, D], in
  // their dtype (quantized with fresh scales per KvCacheView). A negative slot is skipped. An
  // empty v skips the v write (MLA keeps one latent cache).
  virtual void KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache,
                       KvCacheView v_cache, const Tensor& slot_mapping) = 0;
  // Causal attention of q [T, Hq, Dk] over each sequence's cached keys/values
  // (k_cache [slots, Hkv, Dk], v_cache [slots, Hkv, Dv], strided on dim 0 allowed; any
  // KvCacheView dtype, dequantized as they are read), grouped query heads (Hq % Hkv == 0),
  // softmax(q·k * scale). out: [T, Hq, Dv].
  virtual void Attention(const Tensor& q, const KvCacheView& k_cache, const KvCacheView& v_cache,
                         const AttentionMeta& meta, float scale, Tensor out) = 0;
  // out[i, h, :] = cache[slots[i], h, :] dequantized to f32. slots: [n] i32; out: [n, H, D]
  // (MLA's naive path gathers the latents it decompresses).
  virtual void KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) = 0;
  // out = silu(gate) * up, elementwise. [T, I].
  virtual void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) = 0;
  // out = a + b, elementwise, same shapes (out may alias a or b).
  virtual void Add(const Tensor& a, const Tensor& b, Tensor out) = 0;
  // Strided copy of same-shaped views; a source stride of 0 broadcasts (Tensor::Broadcast).
  virtual void Copy(const Tensor& src, Tensor dst) = 0;
  // out[i, :] = x[rows[i], :]. x: [T, H]; rows: [n] i32.
  virtual void GatherRows(const Tensor& x, const Tensor& rows, Tensor out) = 0;
  // Router: logits [T, E] f32 (+ bias [E] for noaux_tc, else empty) -> top-k expert ids [T, k]
  // i32 and weights [T, k] f32 (reference/deepseek-semantics.md "Router").
  virtual void MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p,
                       Tensor topk_ids, Tensor topk_weights) = 0;
  // out[t] = sum_k topk_weights[t, k] * expert[topk_ids[t, k]](x[t]); experts are computed
  // grouped over the tokens routed to them. x, out: [T, H].
  virtual void MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                          std::span<const ExpertWeights> experts, Tensor out) = 0;
};

}  // namespace dh
