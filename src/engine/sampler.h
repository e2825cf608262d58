// Sampler: turns one row of logits into a token for one sequence. Each sequence owns its RNG
// (std::mt19937_64 seeded from the request seed, advanced by exactly one draw per sampled token),
// so its output does not depend on what else shares the batch.
//
// Order: logit_bias, repetition penalty (prompt + output), presence/frequency penalties
// (output), suppressed ids -> -inf; then greedy argmax when temperature == 0, else
// temperature -> top_k -> top_p -> min_p -> one draw.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/types.h"

namespace dh {

class SequenceSampler {
 public:
  SequenceSampler(const SamplingParams& params, uint64_t seed, std::span<const int32_t> prompt);

  // Samples from `logits` (one vocab row; modified in place). `suppressed` ids can not be drawn
  // (EOS and stop ids before min_tokens).
  int32_t Sample(std::span<float> logits, std::span<const int32_t> suppressed);
  // Speculative decoding's verification of one draft token (docs/mtp.md): the target p is what
  // Sample would draw from (same penalties, suppression and filters); the draft came from a
  // point mass q = [draft]. Greedy: returns Sample's argmax (the draft when it agrees). Else
  // accepts the draft with probability min(1, p(draft)/q(draft)) = p(draft), and on rejection
  // draws from norm(max(0, p - q)), i.e. p without the draft, so the result is distributed as p.
  int32_t SampleWithDraft(std::span<float> logits, std::span<const int32_t> suppressed,
                          int32_t draft);
  // Records a generated token for the penalties.
  void Accept(int32_t token);

 private:
  void ApplyPenalties(std::span<float> logits) const;
  // The temperature/top-k/top-p/min-p candidates into cand_
  // (unnormalized weights). Returns false when nothing is left (Sample then takes the argmax).
  bool BuildCandidates(std::span<const float> logits);
  double Uniform();  // [0, 1), one draw

  std::vector<std::pair<float, int32_t>> cand_;  // reused across calls

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int> output_counts_;
  std::unordered_set<int32_t> seen_;  // prompt + output, for repetition_penalty
};

// Log-softmax of the raw logits at `token`, its 1-based rank and the `top_n` best alternatives.
TokenLogprob ComputeLogprob(std::span<const float> logits, int32_t token, int top_n);

}  // namespace dh
