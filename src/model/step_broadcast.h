// Serving with tensor parallelism: rank 0 owns the engine (scheduler, sampling, HTTP) and the
// other ranks follow its steps. The leader's model is wrapped so that every Forward first
// broadcasts the step's batch (token ids, positions, sequence boundaries, block tables, slots,
// logits rows) and the KV pool geometry; each follower receives it, runs the same Forward on its
// own slice of the model and its own KV pool (its kv heads), and drops the logits. Destroying the
// leader's model tells the followers to stop.
#pragma once

#include <chrono>
#include <memory>

#include "comm/communicator.h"
#include "model/model.h"

namespace dh {

// `inner` is rank 0's slice of the model; `comm` must outlive the returned model. When a step
// (broadcast + forward with its all-reduces) takes longer than `step_timeout` — a rank died or
// hangs — the process logs which step and exits with status 1 rather than wait forever.
std::unique_ptr<Model> MakeStepLeader(std::unique_ptr<Model> inner, comm::Communicator& comm,
                                      std::chrono::seconds step_timeout);

// Runs the leader's steps on this rank until it stops. An error if a collective fails.
Status FollowSteps(Model& model, Backend& backend, comm::Communicator& comm);

}  // namespace dh
