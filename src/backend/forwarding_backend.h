// ForwardingBackend: a Backend that passes every call to an inner backend, one line per member,
// so a decorator (tracing, plugins, the self-check) overrides only what it changes. A member
// added to Backend must be forwarded here too: until it is, every decorator stays abstract and
// fails to compile instead of quietly skipping the new op.
#pragma once

#include <memory>
#include <utility>

#include "backend/backend.h"

namespace dh {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  Backend& inner() const { return *inner_; }

  std::string name() const override { return inner_->name(); }
  std::string KernelTag() const override { return inner_->KernelTag(); }
  bool Supports(const OpDesc& op) const override { return inner_->Supports(op); }

  std::unique_ptr<Buffer> Allocate(size_t bytes) override { return inner_->Allocate(bytes); }
  bool KvCacheHeadMajor() const override { return inner_->KvCacheHeadMajor(); }
  void CopyToDevice(const Tensor& dst, const void* src) override { inner_->CopyToDevice(dst, src); }
  void CopyToHost(void* dst, const Tensor& src) override { inner_->CopyToHost(dst, src); }
  void Synchronize() override { inner_->Synchronize(); }
  Result<Weight> PrepareWeight(const Weight& w) override { return inner_->PrepareWeight(w); }
  bool PackedServesEveryProduct(const Weight& w) const override {
    return inner_->PackedServesEveryProduct(w);
  }
  void HoldReleases() override { inner_->HoldReleases(); }
  void ReleaseHeldRows() override { inner_->ReleaseHeldRows(); }

  void Embedding(const Weight& table, const Tensor& ids, Tensor out) override {
    inner_->Embedding(table, ids, out);
  }
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override {
    inner_->RmsNorm(x, weight, eps, out);
  }
  void AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                  Tensor out) override {
    inner_->AddRmsNorm(residual, x, weight, eps, out);
  }
  void MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) override {
    inner_->MatMul(x, w, bias, out);
  }
  void MatMuls(const Tensor& x, std::span<const MatMulTarget> targets) override {
    inner_->MatMuls(x, targets);
  }
  void BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) override {
    inner_->BatchedMatMul(x, w, out);
  }
  void Rope(Tensor x, const Tensor& positions, const RopeParams& p) override {
    inner_->Rope(x, positions, p);
  }
  void KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache, KvCacheView v_cache,
               const Tensor& slot_mapping) override {
    inner_->KvWrite(k, v, k_cache, v_cache, slot_mapping);
  }
  void Attention(const Tensor& q, const KvCacheView& k_cache, const KvCacheView& v_cache,
                 const AttentionMeta& meta, float scale, Tensor out) override {
    inner_->Attention(q, k_cache, v_cache, meta, scale, out);
  }
  void KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) override {
    inner_->KvGather(cache, slots, out);
  }
  void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) override {
    inner_->SiluMul(gate, up, out);
  }
  void Add(const Tensor& a, const Tensor& b, Tensor out) override { inner_->Add(a, b, out); }
  void Copy(const Tensor& src, Tensor dst) override { inner_->Copy(src, dst); }
  void GatherRows(const Tensor& x, const Tensor& rows, Tensor out) override {
    inner_->GatherRows(x, rows, out);
  }
  void MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p, Tensor topk_ids,
               Tensor topk_weights) override {
    inner_->MoeGate(logits, bias, p, topk_ids, topk_weights);
  }
  void MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                  std::span<const ExpertWeights> experts, Tensor out) override {
    inner_->MoeExperts(x, topk_ids, topk_weights, experts, out);
  }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace dh
