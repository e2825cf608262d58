// Rotary-embedding frequencies for every rope_scaling kind Hugging Face defines (default, linear,
// dynamic NTK, llama3, yarn), computed once per model (dynamic: per step, from the longest
// position). The rotation itself is the backend's Rope op.
#pragma once

#include <vector>

#include "io/model_config.h"

namespace dh {

struct RopeFrequencies {
  std::vector<float> inv_freq;     // [rot_dim / 2]
  float attention_factor = 1.0f;  // multiplies cos and sin (yarn)
};

// `seq_len` only matters for "dynamic" (HF recomputes the base once the sequence outgrows
// max_position_embeddings).
RopeFrequencies ComputeRopeFrequencies(const ModelConfig& config, int rot_dim, double theta,
                                       int64_t seq_len);

// YaRN's mscale: 0.1 * mscale * ln(factor) + 1 for factor > 1, else 1.
double YarnMscale(double factor, double mscale);

}  // namespace dh
