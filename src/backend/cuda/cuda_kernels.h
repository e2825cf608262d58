// The CUDA backend's kernels (cuda_kernels.cu), as plain launch functions over raw device
// pointers and element strides, so that only this header and the .cu file meet nvcc. Each
// returns the launch's cudaError_t; all run on the given stream.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace dh::cuda {

// Element types the kernels load and store as floats.
enum Elem : int { kElemF32 = 0, kElemBF16 = 1, kElemF16 = 2 };

// A matrix of `rows` rows of `cols` contiguous elements, `stride` elements apart.
struct Rows {
  void* data = nullptr;
  int elem = kElemF32;
  int64_t rows = 0, cols = 0, stride = 0;
};

// Up to 4 dims, element strides (non-negative; 0 broadcasts).
struct View {
  void* data = nullptr;
  int elem = kElemF32;
  int ndim = 0;
  int64_t shape[4] = {1, 1, 1, 1};
  int64_t stride[4] = {0, 0, 0, 0};
};

// out[t, :] = float(table[ids[t], :]); ids outside [0, table.rows) give zeros (checked before on
// the host side where ids come from clients).
cudaError_t Embedding(Rows table, const int32_t* ids, int64_t n, Rows out, cudaStream_t s);
// out = x * rsqrt(mean(x^2) + eps) * w. With residual: residual += x first, then normalise it.
cudaError_t RmsNorm(Rows x, const void* w, int w_elem, float eps, Rows out, cudaStream_t s);
cudaError_t AddRmsNorm(Rows residual, Rows x, const void* w, int w_elem, float eps, Rows out,
                       cudaStream_t s);
// Elementwise over same-shaped f32 row views.
cudaError_t SiluMul(Rows gate, Rows up, Rows out, cudaStream_t s);
cudaError_t Add(Rows a, Rows b, Rows out, cudaStream_t s);
// out[r, :] += bias[:] (f32).
cudaError_t AddBias(Rows out, const void* bias, int bias_elem, cudaStream_t s);
// Strided copy of same-shaped views: same element size (raw bytes, esize 1, 2, 4 or 8) when
// `raw`, else float conversion between f32/bf16/f16.
cudaError_t Copy(View src, View dst, bool raw, int esize, cudaStream_t s);
// out[i, :] = x[rows[i], :] (f32).
cudaError_t GatherRows(Rows x, const int32_t* rows, int64_t n, Rows out, cudaStream_t s);
// Converts f32 rows to contiguous bf16 (elem kElemBF16) or f16 rows (the GEMM's activation copy).
cudaError_t ConvertRows(Rows x, void* out, int out_elem, cudaStream_t s);

struct RopeArgs {
  int half_style = 1;  // 1: (i, i + rot/2) pairs; 0: interleaved (2i, 2i+1)
  int offset = 0, rot_dim = 0;
  float attention_factor = 1.0f;
};
// In place on x [T, H, D] (f32).
cudaError_t Rope(View x, const int32_t* positions, const float* inv_freq, RopeArgs a,
                 cudaStream_t s);
// cache[slot_mapping[t]] = src[t] for slot >= 0; src [T, H, D] f32, cache [slots, H, D].
cudaError_t KvWrite(View src, View cache, const int32_t* slot_mapping, cudaStream_t s);

struct AttentionArgs {
  int num_seqs = 0, num_tokens = 0, block_size = 16;
  int64_t block_table_stride = 0;
  const int32_t* query_start = nullptr;
  const int32_t* seq_lens = nullptr;
  const int32_t* block_tables = nullptr;
  float scale = 1.0f;
};
// Largest head dims the attention kernel takes (else the host fallback runs).
inline constexpr int kMaxAttentionDk = 1024;
inline constexpr int kMaxAttentionDv = 512;
// Paged causal attention, grouped query heads: q [T, Hq, Dk] f32, caches [slots, Hkv, D],
// out [T, Hq, Dv] f32.
cudaError_t Attention(View q, View k_cache, View v_cache, View out, AttentionArgs a,
                      cudaStream_t s);

struct MoeGateArgs {
  int num_experts = 0, top_k = 1, n_group = 1, topk_group = 1;
  int softmax = 1;   // else sigmoid
  int grouped = 0;   // group-limited (greedy or noaux_tc)
  int noaux_tc = 0;  // bias added for the choice, group score = sum of its top two
  int norm_topk_prob = 0;
  float routed_scaling_factor = 1.0f;
};
inline constexpr int kMaxMoeExperts = 512;
// logits [T, E] f32 rows; bias [E] (elem) or null; ids [T, k] i32 and weights [T, k] f32
// contiguous.
cudaError_t MoeGate(Rows logits, const void* bias, int bias_elem, MoeGateArgs a, int32_t* ids,
                    float* weights, cudaStream_t s);
// y[pairs[i], :] = ys[i, :] (f32, hidden columns; y contiguous [*, hidden]).
cudaError_t ScatterRows(const float* ys, const int32_t* pairs, int64_t n, int64_t hidden, float* y,
                        cudaStream_t s);
// out[t, c] = sum_i (ids[t, i] >= 0) * weights[t, i] * y[t * k + i, c].
cudaError_t MoeCombine(const float* y, const int32_t* ids, const float* weights, int64_t tokens,
                       int k, Rows out, cudaStream_t s);

// x as `parts` bf16 [rows, cols] matrices, contiguous one after the other in out, whose sum is x:
// with 3 parts exactly (8 + 8 + 8 significant bits) for every normal f32, so tensor-core GEMMs
// over the parts give f32 activations' products.
cudaError_t SplitBf16(Rows x, void* out, int parts, cudaStream_t s);
// out [rows, cols] contiguous f32 = w (f32/bf16/f16 rows).
cudaError_t WidenRows(Rows w, float* out, cudaStream_t s);

// out[m, n] = x[m, :] . w[n, :] (+ bias[n]) for M <= kMaxGemvRows: one warp per weight row, f32
// accumulation (decode's bandwidth-bound case). w: dense f32/bf16/f16 rows.
inline constexpr int kMaxGemvRows = 8;
cudaError_t Gemv(Rows x, Rows w, const void* bias, int bias_elem, Rows out, cudaStream_t s);

}  // namespace dh::cuda
