// Register- and cache-blocked GEMM for many rows of x (prefill, batched decode, MoE expert
// groups): out[M, N] = x[M, K] . W[N, K]^T (+ bias), f32 accumulation. The micro-kernel keeps
// an MR x NR tile of dot products in registers (AVX3: 8 rows of x x 3 weight rows = 24 vector
// accumulators; other targets 4 x 2), so each loaded weight vector serves MR rows and each x
// vector NR weight rows. K is cut into blocks (GemmKc) so the x tile stays in L1 while a block
// of weight rows (L2) passes under it; up to 8 rows keep whole rows, passed over each block in
// two halves when the whole tile would overflow L1 (GemmTileRows in gemm.cc). Each tile
// prefetches the next tile's weight rows (docs/kernels.md "The f32 tiled GEMM"). From
// GemmPackedMinRows rows the 16-register targets widen each weight block once into panels and
// run an outer-product tile instead (docs/kernels.md "Packed panels"). Work is handed out
// dynamically over blocks of output features, so a core slowed by another process does not hold
// the others up. Runtime SIMD dispatch as cpu_kernels.cc. For 1-3 rows of x the streaming GEMV
// (cpu::MatMulRange) is as fast and is used instead (CpuBackend::MatMul, kGemvMaxRows).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "backend/cpu/cpu_kernels.h"
#include "base/thread_pool.h"

namespace dh::cpu {

// K is cut into equal blocks of at most kGemmKcMax columns, a multiple of kGemmKcUnit each (the
// x tile, MR x block floats, stays in L1).
constexpr int64_t kGemmKcMax = 1024;
constexpr int64_t kGemmKcUnit = 256;
// Columns per K block for an m x k product (k itself when no blocking).
int64_t GemmKc(int64_t m, int64_t k, bool rows_fn);

// Largest m that CpuBackend::MatMul still sends to the GEMV kernel (measured crossover, see
// bench/README.md "Tiled GEMM").
constexpr int64_t kGemvMaxRows = 3;
// Fewest multiply-adds (m * n * k) for which a GEMM hands blocks to the pool's other threads;
// a smaller call runs on the caller's thread alone (the same blocks, so the same results): waking
// a worker costs more than ~2^18 multiply-adds take one core, and on a shared machine a worker
// that was descheduled stalls the call (bench/README.md "Speculative decoding": the 4-row
// verification of a hidden-128 model ran ~8 such dispatches per layer).
constexpr int64_t kGemmMinParallelWork = int64_t{1} << 18;

// Supplies weight rows as f32 (e.g. dequantizes them): writes rows [row_begin, row_begin +
// count), columns [col_begin, col_begin + col_count), into out, row-major, col_count floats per
// row. col_begin is a multiple of GemmKc(m, k, true) (itself a multiple of kGemmKcUnit) and
// col_count <= kGemmKcMax, or whole rows (col_begin 0, col_count k) when the packed panels take
// the call (GemmUsesPanels); count <= GemmMaxBlockRows().
// Called concurrently from the pool's threads (disjoint rows or columns); must not throw. Each
// weight element is requested exactly once per Gemm call.
using WeightRowsFn = std::function<void(int64_t row_begin, int64_t count, int64_t col_begin,
                                        int64_t col_count, float* out)>;

struct GemmArgs : ActivationArgs {
  int64_t n = 0;  // output features (rows of the weight)
  // Dense weight rows, w_stride elements apart, of type wtype. Ignored when rows_fn is set.
  const void* w = nullptr;
  WType wtype = WType::kF32;
  int64_t w_stride = 0;
  const WeightRowsFn* rows_fn = nullptr;  // weight supplied as f32 rows by a callback
  bool exact_x = false;  // never round x to bf16 (Weight::exact_x)
};

// The packed-panel kernel of the 16-register targets (AVX2, SSE4, NEON; gemm.cc) takes calls
// with at least this many rows of x: the weight block is widened once into panels of kGemmPackKc
// columns, which pays from 32 rows for bf16 / f16 weights (widened in the tile's loop otherwise)
// and from 64 for f32 ones and rows from a callback (bench/README.md "Packed f32 panels").
inline int64_t GemmPackedMinRows(WType wtype, bool rows_fn) {
  return !rows_fn && wtype != WType::kF32 ? 32 : 64;
}
// Whether a call of m rows takes the packed panels on the dispatched target (--trace-kernels).
bool GemmUsesPanels(int64_t m, WType wtype, bool rows_fn);
constexpr int64_t kGemmPackKc = 256;

// Runs the GEMM on all threads of pool (the caller's thread included).
void Gemm(const GemmArgs& a, ThreadPool& pool);
// Runs several GEMMs of one shape (m, n, k, weight type) as one hand-out of their blocks over
// the pool, each call cut into the blocks it would take alone, so each gives the same bits as
// Gemm (CpuBackend::BatchedMatMul: MLA's per-head products, where one head is too little work
// to spread over the threads by itself). Calls of other shapes, or taking the bf16 dot tiles,
// run one by one.
void GemmBatched(std::span<const GemmArgs> calls, ThreadPool& pool);

// Most weight rows one rows_fn call asks for.
int64_t GemmMaxBlockRows();

// Floating-point operations per call of FmaProbe for the dispatched target.
int64_t FmaProbeFlops(int64_t iters);
// Runs iters steps of independent register-resident FMA chains; returns a value derived from
// them (keep it, so the work is not optimised away).
float FmaProbe(int64_t iters);

}  // namespace dh::cpu
