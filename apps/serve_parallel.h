// `serve --tp-size N`: under mpirun, rank 0 serves and the other ranks follow its engine steps
// (model/step_broadcast.h); without mpirun, serve re-executes itself under `mpirun -np N` so the
// one-line command works as written.
#pragma once

#include <chrono>
#include <optional>

#include "apps/model_options.h"

namespace dh::app {

enum class ServeRole { kLeader, kFollower, kLauncherDone };

// Under mpirun: joins the job and says whether this rank leads. Without: runs
// `mpirun -np N <this binary> <same arguments>` and waits for it (kLauncherDone; the exit code
// of mpirun is then this process's, via std::exit).
Result<ServeRole> StartServeRanks(const ModelOptions& model);

// A follower rank: loads its slice of the model and runs rank 0's steps until rank 0 stops.
int FollowLeader(const ModelOptions& model);

// For engine commands (`run`) after LoadFromOptions with --tp-size > 1: on rank 0 wraps the
// model as the step leader and returns nullopt (carry on); on the other ranks follows rank 0's
// steps until it stops and returns the exit code. Nothing with --tp-size 1.
std::optional<int> LeadOrFollow(LoadedModel& loaded, std::chrono::seconds step_timeout);

}  // namespace dh::app
