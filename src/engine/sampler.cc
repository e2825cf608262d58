// Sampler: penalties, filters and the per-sequence seeded draw (see sampler.h).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

namespace dh {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int32_t Argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

// Orders (logit, id) best first; ties go to the lower id so the order is total.
bool Better(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

SequenceSampler::SequenceSampler(const SamplingParams& params, uint64_t seed,
                                 std::span<const int32_t> prompt)
    : params_(params), rng_(seed) {
  if (params_.repetition_penalty != 1.0f) seen_.insert(prompt.begin(), prompt.end());
}

void SequenceSampler::Accept(int32_t token) {
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    ++output_counts_[token];
  }
  if (params_.repetition_penalty != 1.0f) seen_.insert(token);
}

void SequenceSampler::ApplyPenalties(std::span<float> logits) const {
  const auto vocab = static_cast<int32_t>(logits.size());
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id >= 0 && id < vocab) logits[id] += bias;
  }
  const float rep = params_.repetition_penalty;
  for (int32_t id : seen_) {
    if (id < 0 || id >= vocab) continue;
    logits[id] = logits[id] > 0 ? logits[id] / rep : logits[id] * rep;
  }
  for (const auto& [id, count] : output_counts_) {
    if (id < 0 || id >= vocab) continue;
    logits[id] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
  }
}

bool SequenceSampler::BuildCandidates(std::span<const float> logits) {
  const auto vocab = static_cast<int32_t>(logits.size());
  const float inv_t = 1.0f / params_.temperature;
  const float max_logit = logits[Argmax(logits)];
  const bool top_k_on = params_.top_k > 0 && params_.top_k < vocab;
  const bool sorted = top_k_on || params_.top_p < 1.0f;
  // Candidates as (probability weight, id): unnormalized exp((l - max) / T).
  std::vector<std::pair<float, int32_t>>& cand = cand_;
  cand.clear();
  cand.reserve(logits.size());
  for (int32_t i = 0; i < vocab; ++i) {
    if (logits[i] == kNegInf) continue;
    cand.emplace_back(std::exp((logits[i] - max_logit) * inv_t), i);
  }
  if (cand.empty()) return false;
  if (sorted) {
    if (top_k_on && static_cast<size_t>(params_.top_k) < cand.size()) {
      std::partial_sort(cand.begin(), cand.begin() + params_.top_k, cand.end(), Better);
      cand.resize(params_.top_k);
    } else {
      std::sort(cand.begin(), cand.end(), Better);
    }
    if (params_.top_p < 1.0f) {
      double total = 0;
      for (const auto& c : cand) total += c.first;
      // Keep the smallest prefix whose mass reaches top_p (at least one token).
      double mass = 0;
      size_t keep = 0;
      while (keep < cand.size()) {
        mass += cand[keep].first;
        ++keep;
        if (mass >= params_.top_p * total) break;
      }
      cand.resize(keep);
    }
  }
  if (params_.min_p > 0.0f) {
    float p_max = 0;
    for (const auto& c : cand) p_max = std::max(p_max, c.first);
    const float threshold = params_.min_p * p_max;
    std::erase_if(cand, [&](const auto& c) { return c.first < threshold; });
  }
  return true;
}

double SequenceSampler::Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t SequenceSampler::Sample(std::span<float> logits, std::span<const int32_t> suppressed) {
  ApplyPenalties(logits);
  const auto vocab = static_cast<int32_t>(logits.size());
  for (int32_t id : suppressed) {
    if (id >= 0 && id < vocab) logits[id] = kNegInf;
  }
  if (params_.temperature == 0.0f) return Argmax(logits);
  // Everything suppressed: fall back deterministically.
  if (!BuildCandidates(logits)) return Argmax(logits);
  double total = 0;
  for (const auto& c : cand_) total += c.first;
  const double target = Uniform() * total;
  double acc = 0;
  for (const auto& c : cand_) {
    acc += c.first;
    if (target < acc) return c.second;
  }
  return cand_.back().second;
}

int32_t SequenceSampler::SampleWithDraft(std::span<float> logits,
                                         std::span<const int32_t> suppressed, int32_t draft) {
  if (params_.temperature == 0.0f) return Sample(logits, suppressed);
  ApplyPenalties(logits);
  const auto vocab = static_cast<int32_t>(logits.size());
  for (int32_t id : suppressed) {
    if (id >= 0 && id < vocab) logits[id] = kNegInf;
  }
  if (!BuildCandidates(logits)) return Argmax(logits);
  double total = 0, draft_weight = 0;
  for (const auto& c : cand_) {
    total += c.first;
    if (c.second == draft) draft_weight = c.first;
  }
  // Accept with probability p(draft) = draft_weight / total.
  if (Uniform() * total < draft_weight) return draft;
  // Rejected: draw from p with the draft removed (max(0, p - q), renormalized).
  const double rest = total - draft_weight;
  const double target = Uniform() * rest;
  double acc = 0;
  int32_t last = cand_.back().second;
  for (const auto& c : cand_) {
    if (c.second == draft) continue;
    acc += c.first;
    last = c.second;
    if (target < acc) return c.second;
  }
  return last;
}

TokenLogprob ComputeLogprob(std::span<const float> logits, int32_t token, int top_n) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  const float lse = max_logit + static_cast<float>(std::log(sum));
  TokenLogprob out;
  out.token_id = token;
  out.logprob = logits[token] - lse;
  int32_t rank = 1;
  for (size_t i = 0; i < logits.size(); ++i) {
    const bool better = logits[i] > logits[token] ||
                        (logits[i] == logits[token] && static_cast<int32_t>(i) < token);
    if (better) ++rank;
  }
  out.rank = rank;
  if (top_n > 0) {
    const auto n = std::min<size_t>(static_cast<size_t>(top_n), logits.size());
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(),
                      [&](int32_t a, int32_t b) {
                        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    for (size_t i = 0; i < n; ++i) out.top.push_back({ids[i], logits[ids[i]] - lse});
  }
  return out;
}

}  // namespace dh
