// Serving with tensor parallelism: rank 0 owns the engine (scheduler, sampling, HTTP) and the
// other ranks follow its steps. The leader's model is wrapped so that every Forward first
// broadcasts the step's batch (token ids, positions, sequence boundaries, block tables, slots,
// logits rows) and the KV pool geometry; each follower receives it, runs the same Forward on its
// own slice of the model and its own KV pool (its kv heads), and drops the logits. Destroying the
// leader's model tells the followers to stop.
//
// A rank that dies or hangs: the leader runs each step on a thread of its own and waits at most
// the step timeout for it; a step that does not finish (or fails, or is abandoned because mpirun
// is ending the job) marks the job failed. From then on every Forward returns a Cancelled status
// at once, so the engine fails the requests in flight (the server answers them with 503) instead
// of waiting on a collective that never returns. The process cannot finalize MPI after that: it
// ends with status 1 (serve does so itself once the requests are answered; a backstop ends it
// kRankFailureGrace after the failure otherwise).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/model.h"

namespace dh {

// How long after a failure the backstop waits before it ends the process with status 1.
inline constexpr std::chrono::seconds kRankFailureGrace{10};

// Who each rank is (host name, pid, weight bytes), exchanged once when the leader and the
// followers start, so a failure can say which ranks did not answer and metrics can show each
// rank's share of the model.
struct RankIdentity {
  std::string host;
  int64_t pid = 0;
  uint64_t weight_bytes = 0;
};

// Rank 0's collective work in one engine step (its communicator's counters, before and after).
struct StepComm {
  double seconds = 0;
  uint64_t bytes = 0;
  uint64_t calls = 0;
};

// What rank 0's step leader shares with whoever serves: the first failure of the job, the ranks,
// their latest resident memory, and an observer of each step's collectives. Thread-safe.
class ParallelJob {
 public:
  // `on_failure` runs once, on the thread that records the first failure.
  explicit ParallelJob(std::function<void(const Status&)> on_failure = {});

  // Records `reason` (a Cancelled status naming the step and the ranks) unless a failure is
  // already recorded; returns whether this call recorded it.
  bool Fail(Status reason);
  std::optional<Status> failure() const;

  // The job's ranks (index = rank), known once the leader has started.
  void SetRanks(std::vector<RankIdentity> ranks);
  std::vector<RankIdentity> ranks() const;
  // What is known about each follower rank as seen from this host: "rank 1 (pid 123) has
  // exited", "... is stopped", "... is running", or "rank 2 (pid 77 on host b): on another
  // host"; joined with "; ".
  std::string DescribeRanks() const;
  // Whether a follower rank on this host has exited (looked up in /proc).
  bool LocalRankExited() const;

  // Every rank's resident set size in bytes (index = rank), gathered about once a second while
  // steps run; empty before the first gather.
  void SetRankMemory(std::vector<int64_t> bytes);
  std::vector<int64_t> rank_memory() const;

  // Called after every step on the leader's step thread (set before the leader starts).
  void SetStepObserver(std::function<void(const StepComm&)> observer);
  void ObserveStep(const StepComm& step) const;

 private:
  std::function<void(const Status&)> on_failure_;
  std::function<void(const StepComm&)> observer_;
  mutable std::mutex mu_;
  std::optional<Status> reason_;
  std::vector<RankIdentity> ranks_;
  std::vector<int64_t> rank_memory_;
};

// Every rank's identity, in rank order (collective: every rank calls it at once). `serve` calls
// it right after joining the job, so rank 0 can name the ranks while they load; MakeStepLeader
// and FollowSteps call it again with the weight bytes.
Result<std::vector<RankIdentity>> ExchangeRankIdentities(comm::Communicator& comm,
                                                         uint64_t weight_bytes);

// `inner` is rank 0's slice of the model; `comm` must outlive the returned model. A step that
// takes longer than `step_timeout`, or fails, records a failure in `job` (made here when null)
// and returns Cancelled; so does every later step.
std::unique_ptr<Model> MakeStepLeader(std::unique_ptr<Model> inner, comm::Communicator& comm,
                                      std::chrono::seconds step_timeout,
                                      std::shared_ptr<ParallelJob> job = nullptr);

// Runs the leader's steps on this rank until it stops. An error if a collective fails.
Status FollowSteps(Model& model, Backend& backend, comm::Communicator& comm);

}  // namespace dh
