// `serve --tp-size N`: under mpirun, rank 0 serves and the other ranks follow its engine steps
// (model/step_broadcast.h); without mpirun, serve re-executes itself under `mpirun -np N` so the
// one-line command works as written.
#pragma once

#include <chrono>
#include <optional>

#include "apps/model_options.h"
#include "apps/self_check.h"

namespace dh::app {

enum class ServeRole { kLeader, kFollower, kLauncherDone };

// Under mpirun: joins the job and says whether this rank leads. Without: runs
// `mpirun -np N <this binary> <same arguments>` and waits for it (kLauncherDone; the exit code
// of mpirun is then this process's, via std::exit).
Result<ServeRole> StartServeRanks(const ModelOptions& model);

// Rank 0 of a job the launcher started (StartServeRanks without mpirun) leaves its exit status
// for the launcher in the file named by $DEEPHARNESS_TP_EXIT_FILE: mpirun runs there with
// orte_abort_on_non_zero_status 0 and then exits 0 whatever its ranks return. Nothing on other
// ranks or without that variable. Rank 0's failure paths that end with _Exit(1) leave no status,
// which the launcher reads as 1.
void ReportLeaderExit(int code);

// A follower rank: loads its slice of the model, runs the start-up self-check with the other
// ranks (RunSelfCheckOnRanks; unless `self_check` is kOff) and then rank 0's steps until rank 0
// stops. A failed self-check ends it with status 2 and no output (rank 0 reports it).
int FollowLeader(const ModelOptions& model, SelfCheckMode self_check);

// For engine commands (`run`) after LoadFromOptions with --tp-size > 1: on rank 0 wraps the
// model as the step leader and returns nullopt (carry on); on the other ranks follows rank 0's
// steps until it stops and returns the exit code. Nothing with --tp-size 1.
std::optional<int> LeadOrFollow(LoadedModel& loaded, std::chrono::seconds step_timeout);

}  // namespace dh::app
