// Kernels of the CUDA backend (cuda_kernels.h): f32 activations, f32/bf16/f16 weights and caches,
// f32 accumulation everywhere. Written for clarity first: one block per row for the row ops, a
// warp per weight row for the GEMV, a block per (token, head) with an online softmax for the
// attention.
#include "backend/cuda/cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>

namespace dh::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float LoadF(const void* p, int elem, int64_t i) {
  switch (elem) {
    case kElemBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case kElemF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void StoreF(void* p, int elem, int64_t i, float v) {
  switch (elem) {
    case kElemBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v); return;
    case kElemF16: static_cast<__half*>(p)[i] = __float2half(v); return;
    default: static_cast<float*>(p)[i] = v; return;
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ double BlockSum(double v) {
  __shared__ double partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += partial[w];
  return total;
}

unsigned Blocks(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

// ---- row ops ----

__global__ void EmbeddingKernel(Rows table, const int32_t* ids, Rows out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = static_cast<float*>(out.data) + t * out.stride;
  const bool ok = id >= 0 && id < table.rows;
  for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x) {
    o[c] = ok ? LoadF(table.data, table.elem, id * table.stride + c) : 0.0f;
  }
}

// residual (optional): residual += x, then normalise residual; else normalise x.
__global__ void RmsNormKernel(Rows x, Rows residual, const void* w, int w_elem, float eps,
                              Rows out) {
  const int64_t r = blockIdx.x, h = x.cols;
  const float* xr = static_cast<const float*>(x.data) + r * x.stride;
  float* rr = residual.data ? static_cast<float*>(residual.data) + r * residual.stride : nullptr;
  float* o = static_cast<float*>(out.data) + r * out.stride;
  double sum = 0;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    float v = xr[i];
    if (rr) {
      v = rr[i] + v;
      rr[i] = v;
    }
    sum += static_cast<double>(v) * v;
  }
  sum = BlockSum(sum);
  const float inv = 1.0f / sqrtf(static_cast<float>(sum / h) + eps);
  const float* src = rr ? rr : xr;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    o[i] = src[i] * inv * LoadF(w, w_elem, i);
  }
}

__global__ void SiluMulKernel(Rows g, Rows u, Rows out) {
  const int64_t n = out.rows * out.cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / out.cols, c = e % out.cols;
    const float gv = static_cast<const float*>(g.data)[r * g.stride + c];
    const float uv = static_cast<const float*>(u.data)[r * u.stride + c];
    static_cast<float*>(out.data)[r * out.stride + c] = gv / (1.0f + expf(-gv)) * uv;
  }
}

__global__ void AddKernel(Rows a, Rows b, Rows out) {
  const int64_t n = out.rows * out.cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / out.cols, c = e % out.cols;
    static_cast<float*>(out.data)[r * out.stride + c] =
        static_cast<const float*>(a.data)[r * a.stride + c] +
        static_cast<const float*>(b.data)[r * b.stride + c];
  }
}

__global__ void AddBiasKernel(Rows out, const void* bias, int bias_elem) {
  const int64_t n = out.rows * out.cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / out.cols, c = e % out.cols;
    static_cast<float*>(out.data)[r * out.stride + c] += LoadF(bias, bias_elem, c);
  }
}

__device__ __forceinline__ int64_t ViewOffset(const View& v, int64_t e) {
  int64_t off = 0;
  for (int i = v.ndim - 1; i >= 0; --i) {
    off += (e % v.shape[i]) * v.stride[i];
    e /= v.shape[i];
  }
  return off;
}

template <typename T>
__global__ void CopyRawKernel(View src, View dst, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    static_cast<T*>(dst.data)[ViewOffset(dst, e)] =
        static_cast<const T*>(src.data)[ViewOffset(src, e)];
  }
}

__global__ void CopyConvertKernel(View src, View dst, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    StoreF(dst.data, dst.elem, ViewOffset(dst, e), LoadF(src.data, src.elem, ViewOffset(src, e)));
  }
}

__global__ void GatherRowsKernel(Rows x, const int32_t* rows, Rows out) {
  const int64_t i = blockIdx.x;
  const int32_t r = rows[i];
  const bool ok = r >= 0 && r < x.rows;
  const float* src = static_cast<const float*>(x.data) + (ok ? r : 0) * x.stride;
  float* o = static_cast<float*>(out.data) + i * out.stride;
  for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x) o[c] = ok ? src[c] : 0.0f;
}

__global__ void ConvertRowsKernel(Rows x, void* out, int out_elem) {
  const int64_t n = x.rows * x.cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / x.cols, c = e % x.cols;
    StoreF(out, out_elem, e, static_cast<const float*>(x.data)[r * x.stride + c]);
  }
}

__global__ void SplitBf16Kernel(Rows x, __nv_bfloat16* out, int parts) {
  const int64_t n = x.rows * x.cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / x.cols, c = e % x.cols;
    float rest = static_cast<const float*>(x.data)[r * x.stride + c];
    for (int p = 0; p < parts; ++p) {
      const __nv_bfloat16 b = __float2bfloat16(rest);
      out[p * n + e] = b;
      rest -= __bfloat162float(b);  // exact: the rounding error of a coarser format
    }
  }
}

__global__ void WidenRowsKernel(Rows w, float* out) {
  const int64_t n = w.rows * w.cols;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = e / w.cols, c = e % w.cols;
    out[e] = LoadF(w.data, w.elem, r * w.stride + c);
  }
}

// ---- rope, kv write ----

__global__ void RopeKernel(View x, const int32_t* positions, const float* inv_freq, RopeArgs a) {
  const int half = a.rot_dim / 2;
  const int64_t heads = x.shape[1], n = x.shape[0] * heads * half;
  float* base = static_cast<float*>(x.data);
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int i = static_cast<int>(e % half);
    const int64_t h = (e / half) % heads, t = e / half / heads;
    const float angle = static_cast<float>(positions[t]) * inv_freq[i];
    // cos/sin in double, as the reference computes them.
    const float c = static_cast<float>(cos(static_cast<double>(angle))) * a.attention_factor;
    const float s = static_cast<float>(sin(static_cast<double>(angle))) * a.attention_factor;
    const int64_t ia = a.offset + (a.half_style ? i : 2 * i);
    const int64_t ib = a.half_style ? ia + half : ia + 1;
    float* head = base + t * x.stride[0] + h * x.stride[1];
    const float va = head[ia * x.stride[2]], vb = head[ib * x.stride[2]];
    head[ia * x.stride[2]] = va * c - vb * s;
    head[ib * x.stride[2]] = vb * c + va * s;
  }
}

__global__ void KvWriteKernel(View src, View cache, const int32_t* slot_mapping) {
  const int64_t heads = src.shape[1], d = src.shape[2], n = src.shape[0] * heads * d;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = e % d, h = (e / d) % heads, t = e / d / heads;
    const int32_t slot = slot_mapping[t];
    if (slot < 0 || slot >= cache.shape[0]) continue;
    const float v = LoadF(src.data, src.elem, t * src.stride[0] + h * src.stride[1] + i * src.stride[2]);
    StoreF(cache.data, cache.elem, slot * cache.stride[0] + h * cache.stride[1] + i * cache.stride[2],
           v);
  }
}

// ---- attention ----

constexpr int kAttnWarps = 4;
constexpr int kAccPerLane = kMaxAttentionDv / 32;

// One block per (query row, query head). Each warp walks every kAttnWarps-th key with an online
// softmax (running max, running sum, lane-split output accumulator); the warps merge at the end.
__global__ void AttentionKernel(View q, View kc, View vc, View out, AttentionArgs a) {
  extern __shared__ float smem[];
  const int t = blockIdx.x, h = blockIdx.y;
  const int dk = static_cast<int>(q.shape[2]), dv = static_cast<int>(vc.shape[2]);
  const int group = static_cast<int>(q.shape[1] / kc.shape[1]);
  const int kvh = h / group;
  int s = 0;
  while (s < a.num_seqs && t >= a.query_start[s + 1]) ++s;
  if (s >= a.num_seqs) return;
  const int q0 = a.query_start[s], nq = a.query_start[s + 1] - q0;
  const int pos = a.seq_lens[s] - nq + (t - q0);  // attends to keys [0, pos]
  const int* table = a.block_tables + s * a.block_table_stride;

  float* qs = smem;                          // [dk]
  float* wm = qs + dk;                       // [warps] running max
  float* wl = wm + kAttnWarps;               // [warps] running sum
  float* wacc = wl + kAttnWarps;             // [warps, dv]
  const float* qrow = static_cast<const float*>(q.data) + t * q.stride[0] + h * q.stride[1];
  for (int i = threadIdx.x; i < dk; i += blockDim.x) qs[i] = qrow[i * q.stride[2]];
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float m = -FLT_MAX, l = 0.0f;
  float acc[kAccPerLane];
#pragma unroll
  for (int r = 0; r < kAccPerLane; ++r) acc[r] = 0.0f;
  for (int j = warp; j <= pos; j += kAttnWarps) {
    const int64_t slot = int64_t{table[j / a.block_size]} * a.block_size + j % a.block_size;
    const int64_t kbase = slot * kc.stride[0] + kvh * kc.stride[1];
    float dot = 0.0f;
    for (int i = lane; i < dk; i += 32) dot += qs[i] * LoadF(kc.data, kc.elem, kbase + i * kc.stride[2]);
    const float score = WarpSum(dot) * a.scale;
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -FLT_MAX)
    const float p = expf(score - m_new);
    l = l * corr + p;
    const int64_t vbase = slot * vc.stride[0] + kvh * vc.stride[1];
#pragma unroll
    for (int r = 0; r < kAccPerLane; ++r) {
      const int d = lane + 32 * r;
      if (d < dv) acc[r] = acc[r] * corr + p * LoadF(vc.data, vc.elem, vbase + d * vc.stride[2]);
    }
    m = m_new;
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int r = 0; r < kAccPerLane; ++r) {
    const int d = lane + 32 * r;
    if (d < dv) wacc[warp * dv + d] = acc[r];
  }
  __syncthreads();
  float mx = -FLT_MAX;
  for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, wm[w]);
  float denom = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) denom += wl[w] * expf(wm[w] - mx);
  float* orow = static_cast<float*>(out.data) + t * out.stride[0] + h * out.stride[1];
  for (int d = threadIdx.x; d < dv; d += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) v += wacc[w * dv + d] * expf(wm[w] - mx);
    orow[d * out.stride[2]] = v / denom;
  }
}

// ---- MoE ----

// Index of the largest not-yet-taken value (ties: the lower index), or -1.
__device__ int ArgMaxFree(const float* v, const bool* taken, int n) {
  int best = -1;
  for (int i = 0; i < n; ++i) {
    if (taken[i]) continue;
    if (best < 0 || v[i] > v[best]) best = i;
  }
  return best;
}

constexpr int kMaxGroups = 64;
constexpr int kMaxTopK = 32;

// One thread per token, the reference router's steps in order (reference_moe.cc).
__global__ void MoeGateKernel(Rows logits, const void* bias, int bias_elem, MoeGateArgs a,
                              int32_t* ids, float* weights) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= logits.rows) return;
  const int E = a.num_experts;
  float scores[kMaxMoeExperts], choice[kMaxMoeExperts];
  bool taken[kMaxMoeExperts];
  const float* row = static_cast<const float*>(logits.data) + t * logits.stride;
  for (int e = 0; e < E; ++e) scores[e] = row[e];
  if (a.softmax) {
    float mx = scores[0];
    for (int e = 1; e < E; ++e) mx = fmaxf(mx, scores[e]);
    double sum = 0;
    for (int e = 0; e < E; ++e) {
      scores[e] = expf(scores[e] - mx);
      sum += scores[e];
    }
    for (int e = 0; e < E; ++e) scores[e] = static_cast<float>(scores[e] / sum);
  } else {
    for (int e = 0; e < E; ++e) scores[e] = 1.0f / (1.0f + expf(-scores[e]));
  }
  for (int e = 0; e < E; ++e) {
    choice[e] = scores[e] + (a.noaux_tc ? LoadF(bias, bias_elem, e) : 0.0f);
    taken[e] = false;
  }
  if (a.grouped) {
    const int gsize = E / a.n_group;
    float gscore[kMaxGroups];
    bool gtaken[kMaxGroups];
    for (int g = 0; g < a.n_group; ++g) {
      float best = -FLT_MAX, second = -FLT_MAX;
      int best_i = -1;
      for (int i = 0; i < gsize; ++i) {
        const float v = choice[g * gsize + i];
        if (best_i < 0 || v > best) {
          second = best;
          best = v;
          best_i = i;
        } else if (v > second) {
          second = v;
        }
      }
      gscore[g] = a.noaux_tc ? (gsize >= 2 ? best + second : best) : best;
      gtaken[g] = false;
    }
    for (int i = 0; i < a.topk_group; ++i) {
      const int g = ArgMaxFree(gscore, gtaken, a.n_group);
      gtaken[g] = true;
    }
    for (int e = 0; e < E; ++e) {
      if (!gtaken[e / gsize]) choice[e] = -INFINITY;
    }
  }
  int chosen[kMaxTopK];
  double sum = 0;
  for (int i = 0; i < a.top_k; ++i) {
    chosen[i] = ArgMaxFree(choice, taken, E);
    taken[chosen[i]] = true;
    sum += scores[chosen[i]];
  }
  const bool normalise = a.norm_topk_prob && a.top_k > 1;
  for (int i = 0; i < a.top_k; ++i) {
    const float w = scores[chosen[i]];
    float wi = normalise ? static_cast<float>(w / (sum + 1e-20)) : w;
    ids[t * a.top_k + i] = chosen[i];
    weights[t * a.top_k + i] = wi * a.routed_scaling_factor;
  }
}

__global__ void ScatterRowsKernel(const float* ys, const int32_t* pairs, int64_t hidden, float* y) {
  const int64_t i = blockIdx.x;
  const float* src = ys + i * hidden;
  float* dst = y + int64_t{pairs[i]} * hidden;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) dst[c] = src[c];
}

__global__ void MoeCombineKernel(const float* y, const int32_t* ids, const float* weights, int k,
                                 int64_t hidden, Rows out) {
  const int64_t t = blockIdx.x;
  float* o = static_cast<float*>(out.data) + t * out.stride;
  for (int64_t c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < k; ++i) {
      if (ids[t * k + i] < 0) continue;
      acc += weights[t * k + i] * y[(t * k + i) * hidden + c];
    }
    o[c] = acc;
  }
}

// ---- GEMV ----

__device__ __forceinline__ void Load8(const float* p, float* f) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}
__device__ __forceinline__ void Load8(const __nv_bfloat16* p, float* f) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}
__device__ __forceinline__ void Load8(const __half* p, float* f) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __half22float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}
__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }

constexpr int kGemvWarps = 8;

// One warp per weight row n; `vec`: 8-element (16- or 32-byte) loads of w and x.
template <typename WT, bool kVec>
__global__ void GemvKernel(Rows x, Rows w, const void* bias, int bias_elem, Rows out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n = int64_t{blockIdx.x} * kGemvWarps + warp;
  if (n >= w.rows) return;
  const int M = static_cast<int>(x.rows);
  const int64_t K = x.cols;
  const WT* wr = static_cast<const WT*>(w.data) + n * w.stride;
  const float* xb = static_cast<const float*>(x.data);
  float acc[kMaxGemvRows];
#pragma unroll
  for (int m = 0; m < kMaxGemvRows; ++m) acc[m] = 0.0f;
  if (kVec) {
    for (int64_t k = int64_t{lane} * 8; k < K; k += 32 * 8) {
      float wf[8];
      Load8(wr + k, wf);
#pragma unroll
      for (int m = 0; m < kMaxGemvRows; ++m) {
        if (m < M) {
          float xf[8];
          Load8(xb + m * x.stride + k, xf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[m] += wf[i] * xf[i];
        }
      }
    }
  } else {
    for (int64_t k = lane; k < K; k += 32) {
      const float wv = ToF(wr[k]);
#pragma unroll
      for (int m = 0; m < kMaxGemvRows; ++m) {
        if (m < M) acc[m] += wv * xb[m * x.stride + k];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kMaxGemvRows; ++m) {
    if (m < M) {
      const float v = WarpSum(acc[m]);
      if (lane == 0) {
        static_cast<float*>(out.data)[m * out.stride + n] =
            v + (bias ? LoadF(bias, bias_elem, n) : 0.0f);
      }
    }
  }
}

template <typename WT>
cudaError_t LaunchGemv(Rows x, Rows w, const void* bias, int bias_elem, Rows out, cudaStream_t s) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = x.cols % 8 == 0 && w.stride % 8 == 0 && x.stride % 4 == 0 && aligned(w.data) &&
                   aligned(x.data) && (sizeof(WT) == 2 || w.stride % 4 == 0);
  const unsigned blocks = static_cast<unsigned>((w.rows + kGemvWarps - 1) / kGemvWarps);
  if (vec) {
    GemvKernel<WT, true><<<blocks, kGemvWarps * 32, 0, s>>>(x, w, bias, bias_elem, out);
  } else {
    GemvKernel<WT, false><<<blocks, kGemvWarps * 32, 0, s>>>(x, w, bias, bias_elem, out);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t Embedding(Rows table, const int32_t* ids, int64_t n, Rows out, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  EmbeddingKernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(table, ids, out);
  return cudaGetLastError();
}

cudaError_t RmsNorm(Rows x, const void* w, int w_elem, float eps, Rows out, cudaStream_t s) {
  if (x.rows == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(x.rows), kThreads, 0, s>>>(x, Rows{}, w, w_elem, eps, out);
  return cudaGetLastError();
}

cudaError_t AddRmsNorm(Rows residual, Rows x, const void* w, int w_elem, float eps, Rows out,
                       cudaStream_t s) {
  if (x.rows == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(x.rows), kThreads, 0, s>>>(x, residual, w, w_elem, eps,
                                                                   out);
  return cudaGetLastError();
}

cudaError_t SiluMul(Rows gate, Rows up, Rows out, cudaStream_t s) {
  if (out.rows * out.cols == 0) return cudaSuccess;
  SiluMulKernel<<<Blocks(out.rows * out.cols), kThreads, 0, s>>>(gate, up, out);
  return cudaGetLastError();
}

cudaError_t Add(Rows a, Rows b, Rows out, cudaStream_t s) {
  if (out.rows * out.cols == 0) return cudaSuccess;
  AddKernel<<<Blocks(out.rows * out.cols), kThreads, 0, s>>>(a, b, out);
  return cudaGetLastError();
}

cudaError_t AddBias(Rows out, const void* bias, int bias_elem, cudaStream_t s) {
  if (out.rows * out.cols == 0) return cudaSuccess;
  AddBiasKernel<<<Blocks(out.rows * out.cols), kThreads, 0, s>>>(out, bias, bias_elem);
  return cudaGetLastError();
}

cudaError_t Copy(View src, View dst, bool raw, int esize, cudaStream_t s) {
  int64_t n = 1;
  for (int i = 0; i < src.ndim; ++i) n *= src.shape[i];
  if (n == 0) return cudaSuccess;
  if (!raw) {
    CopyConvertKernel<<<Blocks(n), kThreads, 0, s>>>(src, dst, n);
  } else if (esize == 1) {
    CopyRawKernel<uint8_t><<<Blocks(n), kThreads, 0, s>>>(src, dst, n);
  } else if (esize == 2) {
    CopyRawKernel<uint16_t><<<Blocks(n), kThreads, 0, s>>>(src, dst, n);
  } else if (esize == 4) {
    CopyRawKernel<uint32_t><<<Blocks(n), kThreads, 0, s>>>(src, dst, n);
  } else if (esize == 8) {
    CopyRawKernel<uint64_t><<<Blocks(n), kThreads, 0, s>>>(src, dst, n);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t GatherRows(Rows x, const int32_t* rows, int64_t n, Rows out, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  GatherRowsKernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(x, rows, out);
  return cudaGetLastError();
}

cudaError_t ConvertRows(Rows x, void* out, int out_elem, cudaStream_t s) {
  if (x.rows * x.cols == 0) return cudaSuccess;
  ConvertRowsKernel<<<Blocks(x.rows * x.cols), kThreads, 0, s>>>(x, out, out_elem);
  return cudaGetLastError();
}

cudaError_t SplitBf16(Rows x, void* out, int parts, cudaStream_t s) {
  if (x.rows * x.cols == 0) return cudaSuccess;
  SplitBf16Kernel<<<Blocks(x.rows * x.cols), kThreads, 0, s>>>(
      x, static_cast<__nv_bfloat16*>(out), parts);
  return cudaGetLastError();
}

cudaError_t WidenRows(Rows w, float* out, cudaStream_t s) {
  if (w.rows * w.cols == 0) return cudaSuccess;
  WidenRowsKernel<<<Blocks(w.rows * w.cols), kThreads, 0, s>>>(w, out);
  return cudaGetLastError();
}

cudaError_t Rope(View x, const int32_t* positions, const float* inv_freq, RopeArgs a,
                 cudaStream_t s) {
  const int64_t n = x.shape[0] * x.shape[1] * (a.rot_dim / 2);
  if (n == 0) return cudaSuccess;
  RopeKernel<<<Blocks(n), kThreads, 0, s>>>(x, positions, inv_freq, a);
  return cudaGetLastError();
}

cudaError_t KvWrite(View src, View cache, const int32_t* slot_mapping, cudaStream_t s) {
  const int64_t n = src.shape[0] * src.shape[1] * src.shape[2];
  if (n == 0) return cudaSuccess;
  KvWriteKernel<<<Blocks(n), kThreads, 0, s>>>(src, cache, slot_mapping);
  return cudaGetLastError();
}

cudaError_t Attention(View q, View k_cache, View v_cache, View out, AttentionArgs a,
                      cudaStream_t s) {
  if (a.num_tokens == 0 || q.shape[1] == 0) return cudaSuccess;
  const int dk = static_cast<int>(q.shape[2]), dv = static_cast<int>(v_cache.shape[2]);
  if (dk > kMaxAttentionDk || dv > kMaxAttentionDv) return cudaErrorInvalidValue;
  const size_t smem = sizeof(float) * (dk + 2 * kAttnWarps + kAttnWarps * dv);
  const dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(q.shape[1]));
  AttentionKernel<<<grid, kAttnWarps * 32, smem, s>>>(q, k_cache, v_cache, out, a);
  return cudaGetLastError();
}

cudaError_t MoeGate(Rows logits, const void* bias, int bias_elem, MoeGateArgs a, int32_t* ids,
                    float* weights, cudaStream_t s) {
  if (a.num_experts > kMaxMoeExperts || a.n_group > kMaxGroups || a.top_k > kMaxTopK) {
    return cudaErrorInvalidValue;
  }
  if (logits.rows == 0) return cudaSuccess;
  MoeGateKernel<<<Blocks(logits.rows, 64), 64, 0, s>>>(logits, bias, bias_elem, a, ids, weights);
  return cudaGetLastError();
}

cudaError_t ScatterRows(const float* ys, const int32_t* pairs, int64_t n, int64_t hidden, float* y,
                        cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  ScatterRowsKernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(ys, pairs, hidden, y);
  return cudaGetLastError();
}

cudaError_t MoeCombine(const float* y, const int32_t* ids, const float* weights, int64_t tokens,
                       int k, Rows out, cudaStream_t s) {
  if (tokens == 0) return cudaSuccess;
  MoeCombineKernel<<<static_cast<unsigned>(tokens), kThreads, 0, s>>>(y, ids, weights, k, out.cols,
                                                                      out);
  return cudaGetLastError();
}

cudaError_t Gemv(Rows x, Rows w, const void* bias, int bias_elem, Rows out, cudaStream_t s) {
  if (x.rows == 0 || w.rows == 0) return cudaSuccess;
  if (x.rows > kMaxGemvRows) return cudaErrorInvalidValue;
  switch (w.elem) {
    case kElemBF16: return LaunchGemv<__nv_bfloat16>(x, w, bias, bias_elem, out, s);
    case kElemF16: return LaunchGemv<__half>(x, w, bias, bias_elem, out, s);
    default: return LaunchGemv<float>(x, w, bias, bias_elem, out, s);
  }
}

}  // namespace dh::cuda
