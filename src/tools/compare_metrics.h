// `deepharness compare`, the measuring part: two completions of the same prompt and sampling
// parameters (one per deployment) -> agreement metrics; many of them -> overall figures and the
// pass/fail checks against the command line's thresholds. Pure functions over plain data, so
// they are unit-tested without a model or a server.
//
// Definitions (docs/migration.md has the long form):
// - first divergence: the first generated-token index where the two token strings differ (the
//   shorter length when one is a prefix of the other; none when equal). Up to it both sides
//   decoded from the same context, so only those positions are compared token by token.
// - token agreement: positions with equal tokens / the longer length (positional).
// - top-1 agreement: over the same-context positions (0 .. first divergence inclusive), the
//   fraction where both sides' best alternative (top_logprobs[0]) is the same token.
// - logprob difference: |logprob_a - logprob_b| of the same token at the same-context positions
//   before the divergence; mean and max.
// - in top-k (vLLM's check_logprobs_close): at the first divergence, whether A's token is among
//   B's top_logprobs and B's among A's. A run is "consistent" when it matches exactly or both
//   hold.
// - similarity: 1 - Levenshtein(text_a, text_b) / max(|text_a|, |text_b|) over bytes (1: equal).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dh::tools {

// One generated token as an OpenAI-compatible server reports it.
struct CompareToken {
  std::string token;
  double logprob = std::numeric_limits<double>::quiet_NaN();  // NaN: not reported
  std::vector<std::pair<std::string, double>> top;            // best first; may be empty
};

// One completion: the text and, when the server returned logprobs, its tokens.
struct CompareCompletion {
  std::string text;
  std::vector<CompareToken> tokens;
  bool has_tokens = false;  // the response carried per-token logprobs
  std::string finish_reason;
};

struct PairMetrics {
  bool exact = false;           // equal text (and equal tokens when both have them)
  int first_divergence = -1;    // token index; -1: none (or no tokens)
  int first_divergence_char = -1;  // byte index in the text; -1: equal texts
  int tokens_a = 0, tokens_b = 0;
  bool has_tokens = false;  // both sides reported tokens
  std::optional<double> token_agreement;
  std::optional<double> top1_agreement;  // needs top_logprobs on both sides
  std::optional<double> mean_logprob_diff, max_logprob_diff;  // needs same-context positions
  int logprob_positions = 0;  // positions the logprob difference is over
  // At the first divergence (both empty when there is none or no top_logprobs).
  std::string token_a, token_b;
  std::optional<bool> a_in_b_topk, b_in_a_topk;
  double similarity = 0;
  // exact, or diverging with each side's token in the other's top-k. nullopt: diverging and
  // the top-k is unknown (no top_logprobs).
  std::optional<bool> consistent;
};

PairMetrics ComparePair(const CompareCompletion& a, const CompareCompletion& b);

// 1 - edit distance / longer length, over bytes. Texts over `max_bytes` are compared on their
// first `max_bytes` bytes (the quadratic cost stays bounded).
double TextSimilarity(const std::string& a, const std::string& b, size_t max_bytes = 16384);

// Overall figures of one mode (greedy, or the sampled runs) over all prompts.
struct ModeSummary {
  int runs = 0;
  int exact = 0;
  double exact_match_rate = 0;
  std::optional<double> token_agreement;    // mean over runs that have tokens
  std::optional<double> top1_agreement;     // mean over runs that have it
  std::optional<double> mean_logprob_diff;  // mean over all compared positions
  std::optional<double> max_logprob_diff;
  int diverged_with_topk = 0;  // diverging runs whose top-k was known
  int diverged_in_topk = 0;    // ... of which both tokens were in the other's top-k
  std::optional<double> consistent_rate;  // (exact + diverged_in_topk) / runs with a known answer
  std::optional<double> mean_first_divergence;  // over diverging runs with tokens
  double similarity = 0;                        // mean
  double min_similarity = 0;
};

ModeSummary Summarize(const std::vector<PairMetrics>& runs);

// Thresholds given on the command line; an unset one is not checked.
struct CompareThresholds {
  std::optional<double> min_exact_match;          // greedy exact-match rate
  std::optional<double> min_consistent;           // greedy: exact or diverging within top-k
  std::optional<double> min_token_agreement;      // greedy mean
  std::optional<double> min_top1_agreement;       // greedy mean
  std::optional<double> max_mean_logprob_diff;    // greedy, over all compared positions
  std::optional<double> max_logprob_diff;         // greedy, the largest
  std::optional<double> min_similarity;           // greedy mean text similarity
  std::optional<double> min_sampled_exact_match;  // seeded sampled runs
};

struct CompareCheck {
  std::string name;  // the flag without dashes, e.g. "min-exact-match"
  double threshold = 0;
  std::optional<double> value;  // nullopt: could not be measured (no logprobs) -> fails
  bool pass = false;
  std::string note;  // why it could not be measured
};

std::vector<CompareCheck> RunChecks(const CompareThresholds& t, const ModeSummary& greedy,
                                    const ModeSummary& sampled);

}  // namespace dh::tools
