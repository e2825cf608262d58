// ReferenceBackend: host memory and plain-loop ops (reference_ops.h). It is the oracle every other
// backend and SIMD target is tested against, and the base class host backends inherit fallbacks
// from.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace dh {

// 64-byte aligned host memory.
class HostBuffer : public Buffer {
 public:
  explicit HostBuffer(size_t bytes);
  ~HostBuffer() override;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() override { return data_; }
  size_t size() const override { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

class ReferenceBackend : public Backend {
 public:
  explicit ReferenceBackend(const BackendOptions& options);

  std::string name() const override { return "reference"; }
  bool Supports(const OpDesc& op) const override { return true; }

  std::unique_ptr<Buffer> Allocate(size_t bytes) override;
  void CopyToDevice(const Tensor& dst, const void* src) override;
  void CopyToHost(void* dst, const Tensor& src) override;

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

 protected:
  const BackendOptions& options() const { return options_; }

 private:
  BackendOptions options_;
};

}  // namespace dh
