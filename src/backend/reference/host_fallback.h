// HostFallbackBackend: the base class of a device backend that is brought up op by op. Every op
// it does not override runs the reference loop on host copies of its operands: the byte ranges
// the tensors cover are copied to host memory (tensors that overlap share one copy, so in-place
// ops and views of one buffer stay consistent), the reference op runs there, and the ranges that
// hold outputs are copied back. Slow but correct; each op (with its weight format and dtype) is
// logged once at warning level the first time it falls back. Weights are copied once and kept
// (they never change after loading), so a fallen-back MatMul costs host memory for its weight.
//
// A derived backend implements memory (Allocate, CopyToDevice, CopyToHost; allocations at least
// 64-byte aligned), then overrides ops one at a time and says so in Supports(); within an
// override it may call the base class's op for the cases it does not handle (e.g. a weight
// format). docs/backends.md has the recipe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/reference/reference_backend.h"

namespace dh {

class HostFallbackBackend : public Backend {
 public:
  explicit HostFallbackBackend(const BackendOptions& options);
  ~HostFallbackBackend() override;

  // Nothing is native here; a derived backend says true for what it overrides.
  bool Supports(const OpDesc& op) const override { return false; }
  // Uploads every tensor of `w` (data, scales, zeros, perm) that is still in host memory (the
  // loader hands over checkpoint views as they are). The uploaded buffers belong to this
  // backend and live as long as it does.
  Result<Weight> PrepareWeight(const Weight& w) override;

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

  // The op descriptions ("MatMul int4/u8", "RmsNorm") that have fallen back so far.
  std::vector<std::string> FallenBackOps() const;

 protected:
  const BackendOptions& options() const { return options_; }
  // True for an address inside memory this backend allocated.
  virtual bool IsDeviceMemory(const void* p) const = 0;
  // Host copies of weights are keyed by device address: a derived backend's Buffer calls the
  // function this returns, with its address range, when it frees device memory, so a later
  // allocation at the same address is never served a stale copy. Safe to call after the backend
  // is gone.
  std::function<void(const void*, size_t)> ForgetHostCopiesHook();

 private:
  struct HostWeight;
  struct WeightCache;
  // Logs `what` once (first fallback of that op description).
  void Note(const std::string& what);
  // The host copy of a weight (made on first use, then reused).
  const Weight& HostCopy(const Weight& w);

  BackendOptions options_;
  ReferenceBackend host_;
  mutable std::mutex mu_;
  std::set<std::string> noted_;
  std::shared_ptr<WeightCache> weights_;
  std::vector<std::unique_ptr<Buffer>> uploaded_;  // weights PrepareWeight moved to the device
};

}  // namespace dh
