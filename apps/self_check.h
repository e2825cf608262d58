// Start-up self-check (docs/reliability.md "Start-up self-check"): before `serve` accepts
// requests, a few tokens go through the loaded model while CheckingBackend re-runs every op on the
// reference backend with the same inputs and compares the outputs within the golden tolerances.
// The first op that differs is named (kind, layer, step, shapes) and the server refuses to start.
//
// CheckingBackend forwards everything to the chosen backend (a ForwardingBackend overriding the
// ops); it compares only between BeginCheck and EndCheck, so serving afterwards costs one extra
// virtual call per op. It reads op tensors in host memory, so it checks host backends (cpu) only.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/forwarding_backend.h"
#include "backend/reference/reference_backend.h"
#include "comm/communicator.h"
#include "model/model.h"

namespace dh::app {

// --self-check: auto (full when the weights are small, else first layers), full, first, off.
enum class SelfCheckMode { kAuto, kFull, kFirstLayers, kOff };
Result<SelfCheckMode> ParseSelfCheckMode(const std::string& text);

class CheckingBackend : public ForwardingBackend {
 public:
  explicit CheckingBackend(std::unique_ptr<Backend> inner);

  // Compares ops from now on; max_layers < 0 compares every op, else only the ops of decoder
  // layers [0, max_layers) (layers are counted from the decoder's norm calls, see .cc).
  void BeginCheck(int max_layers);
  // Marks the start of a forward step (for layer counting and messages).
  void BeginStep();
  // Stops comparing; the first difference found (OK when none).
  Status EndCheck();
  int64_t ops_checked() const { return ops_checked_; }
  // With tensor parallelism: this process's rank (for the test hook's `<Op>@<rank>` form).
  void SetRank(int rank) { rank_ = rank; }
  // The error the DEEPHARNESS_TEST_SELF_CHECK_ERROR hook injected in this check (OK: none).
  const Status& injected_error() const { return injected_error_; }

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
  void MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p,
               Tensor topk_ids, Tensor topk_weights) override;
  void MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                  std::span<const ExpertWeights> experts, Tensor out) override;

 private:
  // True when this op is to be compared (checking, no difference found yet, layer in range).
  bool Checking(OpKind op);
  // Compares `got` (the chosen backend's output) with `want` (the reference's); records the
  // first difference beyond rtol * max(1, max|want|) (+ slack[i] for element i when given).
  void Compare(OpKind op, const char* what, const Tensor& got, const Tensor& want, float rtol,
               const std::string& detail, std::span<const float> slack = {});
  // Test hook (DEEPHARNESS_TEST_SELF_CHECK_PERTURB=<Op>, or <Op>@<rank> for one tensor-parallel
  // rank): shifts the chosen backend's output of that op while checking only, so it can make the
  // check fail but never changes served output.
  void MaybePerturb(OpKind op, Tensor out);
  // Test hooks for a rank that breaks down during the check (tests/mpi/serve_tp_test.sh), both
  // `<Op>@<rank>` and active only while checking: DEEPHARNESS_TEST_SELF_CHECK_ERROR makes the
  // forward step that runs <Op> on that rank return an error (injected_error()), and
  // DEEPHARNESS_TEST_SELF_CHECK_STALL stops that rank (SIGSTOP) at its first <Op>, a hang.
  void MaybeBreakDown(OpKind op);

  ReferenceBackend reference_;
  bool checking_ = false;
  int max_layers_ = -1;
  int step_ = 0;
  int op_in_step_ = 0;
  int norms_in_step_ = 0;  // AddRmsNorm calls so far in this step
  int64_t ops_checked_ = 0;
  std::string perturb_op_;
  int perturb_rank_ = -1;  // -1: every rank
  int rank_ = 0;
  Status first_difference_;
  std::string error_op_, stall_op_;  // the break-down hooks' ops ("" when unset)
  int error_rank_ = -1, stall_rank_ = -1;
  Status injected_error_;
};

struct SelfCheckReport {
  std::string state = "off";  // "off", "passed", "failed", "skipped"
  std::string scope;          // "all layers" or "first N layers"
  int64_t ops_checked = 0;
  int steps = 0;
  double seconds = 0;
  std::string message;        // why skipped / what differed
  // A forward step returned an error (rather than computing a value that differs): this rank
  // left the collective sequence part way, so the ranks are out of step and cannot exchange
  // their reports; the process must end without finalizing MPI.
  bool out_of_step = false;
};

// Feeds a short prompt and a few greedy decode steps through `model` (loaded on `checker`).
// `weight_bytes` decides kAuto. A failure is in report.state == "failed" with the message.
SelfCheckReport RunSelfCheck(Model& model, CheckingBackend& checker, SelfCheckMode mode,
                             uint64_t weight_bytes);

// With tensor parallelism (collective: every rank calls it at once, right after loading): each
// rank runs RunSelfCheck on its own slice of the model, so its ops are compared with the
// reference backend on the shapes it really computes (the model's all-reduces and logits gather
// keep the ranks in step), then the ranks' reports are gathered on every rank. The result is the
// same everywhere: "failed" with the first failing rank named in the message ("self-check on rank 1
// (pid 77): MatMul differs ..."), else "passed" (ops summed over the ranks, the slowest
// rank's seconds, rank 0's scope and steps) or "skipped"; `per_rank` (optional) gets each rank's report, in rank order.
// A rank whose forward step returns an error does not gather: it returns at once with
// out_of_step set and the message naming itself ("self-check on rank 1 (pid 77): ..."); the
// other ranks then wait in a collective until rank 0's start-up watch (serve_parallel.h) ends the
// job.
SelfCheckReport RunSelfCheckOnRanks(Model& model, CheckingBackend& checker, SelfCheckMode mode,
                                    uint64_t weight_bytes, comm::Communicator& comm,
                                    std::vector<SelfCheckReport>* per_rank = nullptr);

}  // namespace dh::app
