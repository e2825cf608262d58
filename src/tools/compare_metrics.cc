// Agreement metrics of two completions and their summaries (definitions in compare_metrics.h).
#include "tools/compare_metrics.h"

#include <algorithm>

namespace dh::tools {
namespace {

bool InTop(const std::string& token, const CompareToken& other) {
  for (const auto& [t, lp] : other.top)
    if (t == token) return true;
  return false;
}

std::optional<double> Mean(double sum, int n) {
  if (n == 0) return std::nullopt;
  return sum / n;
}

}  // namespace

double TextSimilarity(const std::string& a_in, const std::string& b_in, size_t max_bytes) {
  const std::string_view a = std::string_view(a_in).substr(0, max_bytes);
  const std::string_view b = std::string_view(b_in).substr(0, max_bytes);
  const size_t longer = std::max(a.size(), b.size());
  if (longer == 0) return 1.0;
  // Two-row Levenshtein distance.
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({sub, prev[j] + 1, cur[j - 1] + 1});
    }
    std::swap(prev, cur);
  }
  return 1.0 - static_cast<double>(prev[b.size()]) / static_cast<double>(longer);
}

PairMetrics ComparePair(const CompareCompletion& a, const CompareCompletion& b) {
  PairMetrics m;
  m.similarity = TextSimilarity(a.text, b.text);
  const size_t common_chars = std::min(a.text.size(), b.text.size());
  size_t c = 0;
  while (c < common_chars && a.text[c] == b.text[c]) ++c;
  if (c < a.text.size() || c < b.text.size()) m.first_divergence_char = static_cast<int>(c);
  m.exact = a.text == b.text;
  m.has_tokens = a.has_tokens && b.has_tokens;
  m.tokens_a = static_cast<int>(a.tokens.size());
  m.tokens_b = static_cast<int>(b.tokens.size());
  if (!m.has_tokens) {
    if (m.exact) m.consistent = true;
    return m;
  }
  const size_t na = a.tokens.size(), nb = b.tokens.size();
  const size_t common = std::min(na, nb);
  size_t d = 0;
  while (d < common && a.tokens[d].token == b.tokens[d].token) ++d;
  const bool diverged = d < na || d < nb;
  m.exact = m.exact && !diverged;
  if (diverged) m.first_divergence = static_cast<int>(d);

  int equal = 0;
  for (size_t i = 0; i < common; ++i) equal += a.tokens[i].token == b.tokens[i].token;
  const size_t longer = std::max(na, nb);
  m.token_agreement = longer == 0 ? 1.0 : static_cast<double>(equal) / static_cast<double>(longer);

  // Same-context positions: 0 .. d (inclusive when both sides have a token there).
  const size_t same_context = std::min(common, d + 1);
  int top1_n = 0, top1_equal = 0;
  for (size_t i = 0; i < same_context; ++i) {
    if (a.tokens[i].top.empty() || b.tokens[i].top.empty()) continue;
    ++top1_n;
    top1_equal += a.tokens[i].top[0].first == b.tokens[i].top[0].first;
  }
  if (top1_n > 0) m.top1_agreement = static_cast<double>(top1_equal) / top1_n;

  double sum = 0, max = 0;
  int n = 0;
  for (size_t i = 0; i < d; ++i) {
    const double la = a.tokens[i].logprob, lb = b.tokens[i].logprob;
    if (std::isnan(la) || std::isnan(lb)) continue;
    const double diff = std::fabs(la - lb);
    sum += diff;
    max = std::max(max, diff);
    ++n;
  }
  m.logprob_positions = n;
  if (n > 0) {
    m.mean_logprob_diff = sum / n;
    m.max_logprob_diff = max;
  }

  if (!diverged) {
    m.consistent = true;
  } else if (d < common) {
    const CompareToken& ta = a.tokens[d];
    const CompareToken& tb = b.tokens[d];
    m.token_a = ta.token;
    m.token_b = tb.token;
    if (!ta.top.empty() && !tb.top.empty()) {
      m.a_in_b_topk = InTop(ta.token, tb);
      m.b_in_a_topk = InTop(tb.token, ta);
      m.consistent = *m.a_in_b_topk && *m.b_in_a_topk;
    }
  } else {
    // One side stopped where the other went on: the stop (EOS or a stop string) has no token to
    // look up, so the continuing side's token is judged alone by the stopped side's top-k.
    const bool a_longer = na > nb;
    const CompareToken& t = a_longer ? a.tokens[d] : b.tokens[d];
    (a_longer ? m.token_a : m.token_b) = t.token;
    m.consistent = false;
  }
  return m;
}

ModeSummary Summarize(const std::vector<PairMetrics>& runs) {
  ModeSummary s;
  s.runs = static_cast<int>(runs.size());
  if (runs.empty()) return s;
  double agree_sum = 0, top1_sum = 0, lp_sum = 0, lp_max = 0, sim_sum = 0, div_sum = 0;
  int agree_n = 0, top1_n = 0, lp_n = 0, div_n = 0, unknown = 0;
  s.min_similarity = 1.0;
  for (const PairMetrics& m : runs) {
    s.exact += m.exact;
    if (m.token_agreement) agree_sum += *m.token_agreement, ++agree_n;
    if (m.top1_agreement) top1_sum += *m.top1_agreement, ++top1_n;
    if (m.mean_logprob_diff) {
      lp_sum += *m.mean_logprob_diff * m.logprob_positions;
      lp_n += m.logprob_positions;
      lp_max = std::max(lp_max, *m.max_logprob_diff);
    }
    if (m.first_divergence >= 0) div_sum += m.first_divergence, ++div_n;
    if (!m.exact) {
      if (m.consistent.has_value()) {
        ++s.diverged_with_topk;
        s.diverged_in_topk += *m.consistent;
      } else {
        ++unknown;
      }
    }
    sim_sum += m.similarity;
    s.min_similarity = std::min(s.min_similarity, m.similarity);
  }
  s.exact_match_rate = static_cast<double>(s.exact) / s.runs;
  s.token_agreement = Mean(agree_sum, agree_n);
  s.top1_agreement = Mean(top1_sum, top1_n);
  s.mean_logprob_diff = Mean(lp_sum, lp_n);
  if (lp_n > 0) s.max_logprob_diff = lp_max;
  s.mean_first_divergence = Mean(div_sum, div_n);
  if (unknown == 0) {
    s.consistent_rate = static_cast<double>(s.exact + s.diverged_in_topk) / s.runs;
  }
  s.similarity = sim_sum / s.runs;
  return s;
}

std::vector<CompareCheck> RunChecks(const CompareThresholds& t, const ModeSummary& greedy,
                                    const ModeSummary& sampled) {
  std::vector<CompareCheck> checks;
  auto add = [&](const char* name, const std::optional<double>& threshold,
                 std::optional<double> value, bool at_least, const char* missing) {
    if (!threshold) return;
    CompareCheck c;
    c.name = name;
    c.threshold = *threshold;
    c.value = value;
    if (!value) {
      c.note = missing;
    } else {
      c.pass = at_least ? *value >= *threshold : *value <= *threshold;
    }
    checks.push_back(std::move(c));
  };
  const char* no_logprobs = "not measured: a target returned no logprobs";
  const char* no_top = "not measured: a target returned no top_logprobs";
  add("min-exact-match", t.min_exact_match, greedy.exact_match_rate, true, "");
  add("min-consistent", t.min_consistent, greedy.consistent_rate, true,
      "not measured: a diverging run has no top_logprobs");
  add("min-token-agreement", t.min_token_agreement, greedy.token_agreement, true, no_logprobs);
  add("min-top1-agreement", t.min_top1_agreement, greedy.top1_agreement, true, no_top);
  // No compared position (every run diverged at its first token) measures a difference of 0:
  // the divergence itself is judged by the other checks.
  const bool any_tokens = greedy.token_agreement.has_value();
  const std::optional<double> mean_lp =
      greedy.mean_logprob_diff ? greedy.mean_logprob_diff
                               : (any_tokens ? std::optional<double>(0.0) : std::nullopt);
  const std::optional<double> max_lp =
      greedy.max_logprob_diff ? greedy.max_logprob_diff
                              : (any_tokens ? std::optional<double>(0.0) : std::nullopt);
  add("max-mean-logprob-diff", t.max_mean_logprob_diff, mean_lp, false, no_logprobs);
  add("max-logprob-diff", t.max_logprob_diff, max_lp, false, no_logprobs);
  add("min-similarity", t.min_similarity, greedy.similarity, true, "");
  add("min-sampled-exact-match", t.min_sampled_exact_match,
      sampled.runs > 0 ? std::optional<double>(sampled.exact_match_rate) : std::nullopt, true,
      "not measured: --samples 0");
  return checks;
}

}  // namespace dh::tools
