// `serve --tp-size N`: under mpirun, rank 0 serves and the other ranks follow its engine steps
// (model/step_broadcast.h); without mpirun, serve re-executes itself under `mpirun -np N` so the
// one-line command works as written.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "apps/model_options.h"
#include "apps/self_check.h"
#include "model/step_broadcast.h"

namespace dh::app {

enum class ServeRole { kLeader, kFollower, kLauncherDone };

// Under mpirun: joins the job, exchanges the ranks' identities (host, pid; into `ranks` when
// given, for rank 0's start-up watch, and the communicator into `comm`) and says whether this
// rank leads. Without: runs
// `mpirun -np N <this binary> <same arguments>` and waits for it (kLauncherDone; the exit code
// of mpirun is then this process's, via std::exit).
Result<ServeRole> StartServeRanks(const ModelOptions& model,
                                  std::vector<RankIdentity>* ranks = nullptr,
                                  std::shared_ptr<comm::Communicator>* comm = nullptr);

// Rank 0 of `serve --tp-size N` from the identity exchange until it serves (loading, the
// self-check), when no engine step's deadline applies yet: a thread looks at the ranks every
// 0.1 s and ends the job when one on this host has exited, or (once Bound() is called, after
// the ranks have all loaded) when rank 0 has waited longer than `bound` inside one collective
// (a rank hangs, or left the collective sequence after an error). It then prints one line
// naming the phase and each rank's state (ParallelJob::DescribeRanks) and ends the process with
// status 1 (MPI cannot be finalized with a rank out of step); the launcher or mpirun ends the
// rest of the job. Destroying the watch stops it.
class StartupWatch {
 public:
  StartupWatch(std::shared_ptr<ParallelJob> job, const comm::Communicator& comm,
               std::chrono::seconds bound);
  ~StartupWatch();
  StartupWatch(const StartupWatch&) = delete;
  StartupWatch& operator=(const StartupWatch&) = delete;

  // What the ranks are doing now, for the message ("loading the model", ...).
  void SetPhase(std::string phase);
  // From now on a collective call may take at most the bound.
  void Bound();

 private:
  void Run();

  std::shared_ptr<ParallelJob> job_;
  const comm::Communicator& comm_;
  const std::chrono::seconds bound_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, bounded_ = false;
  std::string phase_ = "loading the model";
  std::thread thread_;
};

// Rank 0 of a job the launcher started (StartServeRanks without mpirun) leaves its exit status
// for the launcher in the file named by $DEEPHARNESS_TP_EXIT_FILE: mpirun runs there with
// orte_abort_on_non_zero_status 0 and then exits 0 whatever its ranks return. Nothing on other
// ranks or without that variable. Rank 0's failure paths that end with _Exit(1) leave no status,
// which the launcher reads as 1.
void ReportLeaderExit(int code);

// A follower rank: loads its slice of the model, runs the start-up self-check with the other
// ranks (RunSelfCheckOnRanks; unless `self_check` is kOff) and then rank 0's steps until rank 0
// stops. A failed self-check ends it with status 2 and no output (rank 0 reports it); a forward
// step of the check that returns an error ends it at once with that error and status 1 (the
// ranks are out of step; rank 0's StartupWatch sees this rank exit and ends the job).
int FollowLeader(const ModelOptions& model, SelfCheckMode self_check);

// For engine commands (`run`) after LoadFromOptions with --tp-size > 1: on rank 0 wraps the
// model as the step leader and returns nullopt (carry on); on the other ranks follows rank 0's
// steps until it stops and returns the exit code. Nothing with --tp-size 1.
std::optional<int> LeadOrFollow(LoadedModel& loaded, std::chrono::seconds step_timeout);

}  // namespace dh::app
