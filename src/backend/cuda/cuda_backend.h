// CudaBackend ("cuda"): device memory from cudaMalloc (never managed memory), one stream per
// backend, cuBLAS for batched GEMMs and own kernels (cuda_kernels.cu) for the rest. Everything it
// does not run natively (quantized weight formats, shapes outside the kernels' limits) goes
// through HostFallbackBackend: the reference op on host copies, logged once.
//
// Ops are asynchronous on the stream; CopyToHost and Synchronize wait. MoeExperts reads the
// router's choices back to the host to group tokens per expert (one stream sync per MoE layer).
// With DH_CUDA_OP_TIMES=<file>, every op is timed with CUDA events (which serialises the stream)
// and a JSON table of per-op totals is written to <file> when the backend is destroyed.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backend/reference/host_fallback.h"
#include "base/status.h"

namespace dh {
namespace cuda {
struct Rows;  // cuda_kernels.h
}  // namespace cuda

class CudaBackend : public HostFallbackBackend {
 public:
  // Fails (Unsupported) when there is no usable CUDA device.
  static Result<std::unique_ptr<Backend>> Create(const BackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  // "sm_90 NVIDIA H200" (compute capability and device name).
  std::string KernelTag() const override { return tag_; }
  bool Supports(const OpDesc& op) const override;

  std::unique_ptr<Buffer> Allocate(size_t bytes) override;
  void CopyToDevice(const Tensor& dst, const void* src) override;
  void CopyToHost(void* dst, const Tensor& src) override;
  void Synchronize() override;

  void Embedding(const Weight& table, const Tensor& ids, Tensor out) override;
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override;
  void AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                  Tensor out) override;
  void MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) override;
  void BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) override;
  void Rope(Tensor x, const Tensor& positions, const RopeParams& p) override;
  void KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache, KvCacheView v_cache,
               const Tensor& slot_mapping) override;
  void Attention(const Tensor& q, const KvCacheView& k_cache, const KvCacheView& v_cache,
                 const AttentionMeta& meta, float scale, Tensor out) override;
  void KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) override;
  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override;
  void Add(const Tensor& a, const Tensor& b, Tensor out) override;
  void Copy(const Tensor& src, Tensor dst) override;
  void GatherRows(const Tensor& x, const Tensor& rows, Tensor out) override;
  void MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p,
               Tensor topk_ids, Tensor topk_weights) override;
  void MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                  std::span<const ExpertWeights> experts, Tensor out) override;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }

 protected:
  bool IsDeviceMemory(const void* p) const override;

 private:
  CudaBackend(const BackendOptions& options, int device);
  // Device scratch of at least `bytes` (slot 0..4), grown on demand; valid until the next call
  // with the same slot.
  void* Scratch(int slot, size_t bytes);
  // out = x w^T (+ bias) for dense rows: the GEMV kernel up to kMaxGemvRows rows of x, cuBLAS
  // above, with products of the f32 activations as they are (as the CPU path's): f32 weights by
  // SGEMM, bf16 by three tensor-core GEMMs over x split into bf16 parts, f16 widened to f32 in
  // chunks. `batched` names the op in the timings.
  void DenseMatMul(const cuda::Rows& x, const cuda::Rows& w, const void* bias, int bias_elem,
                   const cuda::Rows& out, bool batched);
  // Op timing (DH_CUDA_OP_TIMES): Begin records a start event, End the stop event and the total.
  void Begin();
  void End(const char* op);

  int device_ = 0;
  std::string tag_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  struct ScratchSlot {
    void* data = nullptr;
    size_t bytes = 0;
  };
  ScratchSlot scratch_[5];
  std::string times_path_;
  cudaEvent_t ev_start_ = nullptr, ev_stop_ = nullptr;
  struct OpTime {
    int64_t count = 0;
    double ms = 0;
  };
  std::map<std::string, OpTime> times_;
};

}  // namespace dh
