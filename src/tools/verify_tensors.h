// verify's "tensors" check without loading anything: the architecture's own factory is run with
// a WeightLoader that only looks names, shapes and dtypes up in the checkpoint headers and hands
// back empty placeholders (no data is read, nothing is allocated), so a 600 GB checkpoint is
// checked in milliseconds. Every problem is collected (the real loader stops at the first):
// missing tensors, wrong shapes, dtypes no loader path accepts, FP8 weights without scales, and
// every checkpoint tensor the architecture does not use, by name.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "tools/verify.h"

namespace dh {

// `backend` only serves the few small tables a model builds at construction (rope); pass the
// reference backend.
std::vector<VerifyProblem> CheckExpectedTensors(const Checkpoint& checkpoint,
                                                const ModelConfig& config, Backend& backend);

}  // namespace dh
