// TracingBackend: a decorator that times every op of the backend it wraps. Each op becomes a
// span of the active Tracer (base/trace.h) with its shapes, weight format, bytes and FLOPs, and
// adds to per-(label, op) totals that `profile` and /metrics read, the label being the
// innermost open TraceSpan (the model opens one per attention and FFN block). It synchronizes
// the inner backend after each op so the time is the op's own on asynchronous devices too
// (which serializes them: tracing measures, it does not run at full speed).
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/forwarding_backend.h"

namespace dh {

// Counts of one op class under one label. bytes and flops are what the op must touch and
// compute at least (weights, activations, cache rows read), from its shapes.
struct OpTotals {
  int64_t calls = 0;
  double seconds = 0, bytes = 0, flops = 0;
  void Add(const OpTotals& o) {
    calls += o.calls;
    seconds += o.seconds;
    bytes += o.bytes;
    flops += o.flops;
  }
};

struct OpTotalsRow {
  std::string label;  // "" outside any span
  std::string op;     // "MatMul", "Attention", ...
  std::string kernel;  // the kernel the backend named (kernel_note.h), e.g. "gemv AVX3_ZEN4"; ""
  OpTotals totals;
};

class TracingBackend final : public ForwardingBackend {
 public:
  explicit TracingBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {}

  // Totals since construction or the last ResetTotals, sorted by label, op, then kernel.
  std::vector<OpTotalsRow> Totals() const;
  void ResetTotals();

  void Embedding(const Weight& table, const Tensor& ids, Tensor out) override;
  void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override;
  void AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps,
                  Tensor out) override;
  void MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) override;
  void MatMuls(const Tensor& x, std::span<const MatMulTarget> targets) override;
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
  void MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p, Tensor topk_ids,
               Tensor topk_weights) override;
  void MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                  std::span<const ExpertWeights> experts, Tensor out) override;

 private:
  using Clock = std::chrono::steady_clock;
  // Runs `call`, then records op `op` ([start, end) after synchronizing) with its cost;
  // `detail` formats the span's shape arguments, only when a tracer records.
  template <typename Call, typename Detail>
  void Timed(const char* op, double bytes, double flops, Call&& call, Detail&& detail);

  mutable std::mutex mu_;
  std::map<std::tuple<std::string, std::string, std::string>, OpTotals> totals_;  // label, op, kernel
};

}  // namespace dh
