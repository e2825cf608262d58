// dh_cuda_roofline: the two ceilings the device check compares deepharness with, measured on the
// same GPU in the same run: device-to-device copy bandwidth (cudaMemcpyAsync, bytes read + bytes
// written per second) and cuBLAS's bf16 GEMM rate (f32 accumulation, bf16 in, f32 out, as the
// CUDA backend calls it) for each M,N,K given on the command line. Prints one JSON object.
//
//   dh_cuda_roofline [--copy-mib 1024] [--gemm M,N,K]...
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace {

bool Ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "error: cuda: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

struct Gemm {
  long m, n, k;
};

}  // namespace

int main(int argc, char** argv) {
  long copy_mib = 1024;
  std::vector<Gemm> gemms;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--copy-mib") == 0 && i + 1 < argc) {
      copy_mib = std::atol(argv[++i]);
    } else if (std::strcmp(argv[i], "--gemm") == 0 && i + 1 < argc) {
      Gemm g{};
      if (std::sscanf(argv[++i], "%ld,%ld,%ld", &g.m, &g.n, &g.k) != 3 || g.m <= 0 || g.n <= 0 ||
          g.k <= 0) {
        std::fprintf(stderr, "error: --gemm %s: expected M,N,K (positive integers)\n", argv[i]);
        return 2;
      }
      gemms.push_back(g);
    } else {
      std::fprintf(stderr, "error: %s: expected --copy-mib N or --gemm M,N,K\n", argv[i]);
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "error: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  if (!Ok(cudaGetDeviceProperties(&prop, 0), "properties")) return 1;
  cudaStream_t stream;
  cudaEvent_t a, b;
  if (!Ok(cudaStreamCreate(&stream), "stream") || !Ok(cudaEventCreate(&a), "event") ||
      !Ok(cudaEventCreate(&b), "event")) {
    return 1;
  }
  std::printf("{\"device\": \"%s\", \"sm\": \"%d%d\"", prop.name, prop.major, prop.minor);

  // Copy bandwidth: best of 5 timed rounds of 10 copies each.
  const size_t bytes = static_cast<size_t>(copy_mib) << 20;
  void *src = nullptr, *dst = nullptr;
  if (!Ok(cudaMalloc(&src, bytes), "malloc") || !Ok(cudaMalloc(&dst, bytes), "malloc")) return 1;
  cudaMemsetAsync(src, 1, bytes, stream);
  cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);  // warm-up
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    cudaEventRecord(a, stream);
    for (int i = 0; i < 10; ++i) cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
    cudaEventRecord(b, stream);
    if (!Ok(cudaEventSynchronize(b), "copy")) return 1;
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    const double gbps = 2.0 * 10 * bytes / (ms * 1e-3) / 1e9;
    if (gbps > best) best = gbps;
  }
  cudaFree(src);
  cudaFree(dst);
  std::printf(", \"copy_bytes\": %zu, \"d2d_copy_gb_per_s\": %.1f", bytes, best);

  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "error: cublasCreate failed\n");
    return 1;
  }
  cublasSetStream(h, stream);
  std::printf(", \"gemm_bf16\": [");
  for (size_t gi = 0; gi < gemms.size(); ++gi) {
    const Gemm& g = gemms[gi];
    void *w = nullptr, *x = nullptr, *o = nullptr;
    if (!Ok(cudaMalloc(&w, g.n * g.k * 2), "malloc") || !Ok(cudaMalloc(&x, g.m * g.k * 2), "malloc") ||
        !Ok(cudaMalloc(&o, g.m * g.n * 4), "malloc")) {
      return 1;
    }
    cudaMemsetAsync(w, 0, g.n * g.k * 2, stream);
    cudaMemsetAsync(x, 0, g.m * g.k * 2, stream);
    const float alpha = 1, beta = 0;
    auto run = [&] {
      return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, g.n, g.m, g.k, &alpha, w, CUDA_R_16BF, g.k,
                          x, CUDA_R_16BF, g.k, &beta, o, CUDA_R_32F, g.n, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "error: cublasGemmEx %ld,%ld,%ld failed\n", g.m, g.n, g.k);
      return 1;
    }
    double best_tflops = 0;
    for (int round = 0; round < 5; ++round) {
      cudaEventRecord(a, stream);
      for (int i = 0; i < 10; ++i) run();
      cudaEventRecord(b, stream);
      if (!Ok(cudaEventSynchronize(b), "gemm")) return 1;
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      const double tflops = 2.0 * g.m * g.n * g.k * 10 / (ms * 1e-3) / 1e12;
      if (tflops > best_tflops) best_tflops = tflops;
    }
    std::printf("%s{\"m\": %ld, \"n\": %ld, \"k\": %ld, \"tflops\": %.1f}", gi ? ", " : "", g.m,
                g.n, g.k, best_tflops);
    cudaFree(w);
    cudaFree(x);
    cudaFree(o);
  }
  std::printf("]}\n");
  cublasDestroy(h);
  return 0;
}
