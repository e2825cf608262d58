// compare_report.h: JSON, Markdown and the terminal summary of a compare run.
#include "tools/compare_report.h"

#include <fmt/format.h>

namespace dh::tools {
namespace {

using Json = nlohmann::json;

Json Opt(const std::optional<double>& v) { return v ? Json(*v) : Json(); }
Json OptBool(const std::optional<bool>& v) { return v ? Json(*v) : Json(); }

std::string Fmt(const std::optional<double>& v, const char* spec = "{:.4f}") {
  return v ? fmt::format(fmt::runtime(spec), *v) : std::string("n/a");
}

std::string YesNo(const std::optional<bool>& v) { return v ? (*v ? "yes" : "no") : "n/a"; }

Json TargetJson(const CompareTargetSpec& t, const std::string& served) {
  Json j = {{"spec", t.text}, {"served_model", served}};
  if (t.local) {
    j["kind"] = "local";
    j["model_path"] = t.model_path;
    j["device"] = t.device;
    j["dtype"] = t.dtype;
    j["quant"] = t.quant;
    j["tp"] = t.tp;
  } else {
    j["kind"] = "url";
    j["url"] = t.url;
  }
  return j;
}

Json SummaryJson(const ModeSummary& s) {
  return {{"runs", s.runs},
          {"exact", s.exact},
          {"exact_match_rate", s.exact_match_rate},
          {"token_agreement", Opt(s.token_agreement)},
          {"top1_agreement", Opt(s.top1_agreement)},
          {"mean_logprob_diff", Opt(s.mean_logprob_diff)},
          {"max_logprob_diff", Opt(s.max_logprob_diff)},
          {"diverged_with_topk", s.diverged_with_topk},
          {"diverged_in_topk", s.diverged_in_topk},
          {"consistent_rate", Opt(s.consistent_rate)},
          {"mean_first_divergence", Opt(s.mean_first_divergence)},
          {"similarity", s.similarity},
          {"min_similarity", s.min_similarity}};
}

Json TokensJson(const CompareCompletion& c) {
  if (!c.has_tokens) return Json();
  Json out = Json::array();
  for (const CompareToken& t : c.tokens) {
    Json top = Json::array();
    for (const auto& [tok, lp] : t.top) top.push_back({tok, lp});
    out.push_back({{"token", t.token},
                   {"logprob", std::isnan(t.logprob) ? Json() : Json(t.logprob)},
                   {"top", std::move(top)}});
  }
  return out;
}

Json RunJson(const CompareRun& r) {
  const PairMetrics& m = r.metrics;
  return {{"mode", r.mode},
          {"seed", r.seed},
          {"exact", m.exact},
          {"first_divergence", m.first_divergence < 0 ? Json() : Json(m.first_divergence)},
          {"first_divergence_char",
           m.first_divergence_char < 0 ? Json() : Json(m.first_divergence_char)},
          {"tokens_a", m.tokens_a},
          {"tokens_b", m.tokens_b},
          {"token_agreement", Opt(m.token_agreement)},
          {"top1_agreement", Opt(m.top1_agreement)},
          {"mean_logprob_diff", Opt(m.mean_logprob_diff)},
          {"max_logprob_diff", Opt(m.max_logprob_diff)},
          {"logprob_positions", m.logprob_positions},
          {"token_a_at_divergence", m.token_a},
          {"token_b_at_divergence", m.token_b},
          {"a_in_b_topk", OptBool(m.a_in_b_topk)},
          {"b_in_a_topk", OptBool(m.b_in_a_topk)},
          {"consistent", OptBool(m.consistent)},
          {"similarity", m.similarity},
          {"text_a", r.a.text},
          {"text_b", r.b.text},
          {"finish_reason_a", r.a.finish_reason},
          {"finish_reason_b", r.b.finish_reason},
          {"logprobs_a", TokensJson(r.a)},
          {"logprobs_b", TokensJson(r.b)}};
}

// Text for a Markdown table cell or a terminal line: control characters escaped, '|' escaped.
std::string Visible(const std::string& s, size_t max_bytes = 60) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_bytes; ++i) {
    const char c = s[i];
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '|') {
      out += "\\|";
    } else if (c == '`') {
      out += "'";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  if (s.size() > max_bytes) out += "…";
  return out;
}

// The generated text up to the divergence (its last `context` tokens), then each side's token.
std::string WhereItDiverged(const CompareRun& r, int context = 8) {
  const PairMetrics& m = r.metrics;
  if (m.first_divergence >= 0) {
    std::string prefix;
    const int from = std::max(0, m.first_divergence - context);
    for (int i = from; i < m.first_divergence; ++i) prefix += r.a.tokens[i].token;
    return fmt::format("token {}: `{}{}` then A `{}` / B `{}`", m.first_divergence,
                       from > 0 ? "…" : "", Visible(prefix), Visible(m.token_a, 24),
                       Visible(m.token_b, 24));
  }
  if (m.first_divergence_char >= 0) {
    const int c = m.first_divergence_char;
    const int from = std::max(0, c - 40);
    return fmt::format("byte {}: `{}` then A `{}` / B `{}`", c,
                       Visible(r.a.text.substr(from, c - from)),
                       Visible(r.a.text.substr(c, 12)), Visible(r.b.text.substr(c, 12)));
  }
  return "";
}

std::string CheckLine(const CompareCheck& c) {
  const bool at_least = c.name.rfind("min-", 0) == 0;
  return fmt::format("{} {} {} {:g}: {}{}", c.name, Fmt(c.value), at_least ? ">=" : "<=",
                     c.threshold, c.pass ? "pass" : "FAIL", c.note.empty() ? "" : " (" + c.note + ")");
}

}  // namespace

Json CompareReportJson(const CompareReportInput& in) {
  const CompareResult& r = *in.result;
  const CompareOptions& o = *in.options;
  Json checks = Json::array();
  for (const CompareCheck& c : in.checks) {
    checks.push_back({{"name", c.name},
                      {"threshold", c.threshold},
                      {"value", Opt(c.value)},
                      {"pass", c.pass},
                      {"note", c.note}});
  }
  Json prompts = Json::array();
  for (const ComparePromptResult& p : r.prompts) {
    Json runs = Json::array();
    for (const CompareRun& run : p.runs) runs.push_back(RunJson(run));
    Json entry = {{"id", p.prompt->id}, {"line", p.prompt->line}, {"runs", std::move(runs)}};
    if (p.prompt->chat) {
      entry["messages"] = p.prompt->messages;
    } else {
      entry["prompt"] = p.prompt->prompt;
    }
    prompts.push_back(std::move(entry));
  }
  return {{"pass", in.pass},
          {"a", TargetJson(*in.a, r.model_a)},
          {"b", TargetJson(*in.b, r.model_b)},
          {"config",
           {{"prompts_file", in.prompts_file},
            {"prompts", r.prompts.size()},
            {"max_tokens", o.max_tokens},
            {"top_logprobs", o.top_logprobs},
            {"samples", o.samples},
            {"seed", o.seed},
            {"temperature", o.temperature},
            {"top_p", o.top_p},
            {"concurrency", o.concurrency}}},
          {"seconds", r.seconds},
          {"checks", std::move(checks)},
          {"overall", {{"greedy", SummaryJson(r.greedy)}, {"sampled", SummaryJson(r.sampled)}}},
          {"prompts", std::move(prompts)}};
}

std::string CompareReportMarkdown(const CompareReportInput& in) {
  const CompareResult& r = *in.result;
  const CompareOptions& o = *in.options;
  std::string md = "# deepharness compare\n\n";
  md += fmt::format("- A: `{}` (model `{}`)\n- B: `{}` (model `{}`)\n", in.a->text, r.model_a,
                    in.b->text, r.model_b);
  md += fmt::format(
      "- prompts: `{}` ({}), max_tokens {}, top_logprobs {}, {} seeded sampled run(s) per prompt "
      "(seed {}+i, temperature {:g}, top_p {:g}), {:.1f} s\n",
      in.prompts_file, r.prompts.size(), o.max_tokens, o.top_logprobs, o.samples, o.seed,
      o.temperature, o.top_p, r.seconds);
  md += fmt::format("\n**Result: {}**\n\n", in.pass ? "PASS" : "FAIL");
  if (!in.checks.empty()) {
    md += "| check | value | threshold | result |\n|---|---|---|---|\n";
    for (const CompareCheck& c : in.checks) {
      const bool at_least = c.name.rfind("min-", 0) == 0;
      md += fmt::format("| {} | {} | {} {:g} | {}{} |\n", c.name, Fmt(c.value),
                        at_least ? "≥" : "≤", c.threshold, c.pass ? "pass" : "**FAIL**",
                        c.note.empty() ? "" : " (" + c.note + ")");
    }
  }
  md += "\n## Overall\n\n| | greedy | sampled |\n|---|---|---|\n";
  const ModeSummary &g = r.greedy, &s = r.sampled;
  auto row = [&](const char* name, const std::string& a, const std::string& b) {
    md += fmt::format("| {} | {} | {} |\n", name, a, s.runs ? b : "-");
  };
  row("runs", std::to_string(g.runs), std::to_string(s.runs));
  row("exact-match rate", fmt::format("{:.4f} ({}/{})", g.exact_match_rate, g.exact, g.runs),
      fmt::format("{:.4f} ({}/{})", s.exact_match_rate, s.exact, s.runs));
  row("consistent (exact or both tokens in the other's top-k)", Fmt(g.consistent_rate),
      Fmt(s.consistent_rate));
  row("mean first divergence (token)", Fmt(g.mean_first_divergence, "{:.1f}"),
      Fmt(s.mean_first_divergence, "{:.1f}"));
  row("token agreement", Fmt(g.token_agreement), Fmt(s.token_agreement));
  row("top-1 agreement", Fmt(g.top1_agreement), Fmt(s.top1_agreement));
  row("mean logprob diff", Fmt(g.mean_logprob_diff, "{:.3g}"), Fmt(s.mean_logprob_diff, "{:.3g}"));
  row("max logprob diff", Fmt(g.max_logprob_diff, "{:.3g}"), Fmt(s.max_logprob_diff, "{:.3g}"));
  row("text similarity (mean / min)", fmt::format("{:.4f} / {:.4f}", g.similarity, g.min_similarity),
      fmt::format("{:.4f} / {:.4f}", s.similarity, s.min_similarity));

  md += "\n## Per prompt (greedy)\n\n";
  md += "| prompt | exact | first divergence | token agr. | top-1 agr. | mean / max lp diff | "
        "A in B top-k | B in A top-k | similarity | sampled exact |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const ComparePromptResult& p : r.prompts) {
    const CompareRun& gr = p.runs[0];
    const PairMetrics& m = gr.metrics;
    int sampled_exact = 0;
    for (size_t i = 1; i < p.runs.size(); ++i) sampled_exact += p.runs[i].metrics.exact;
    md += fmt::format(
        "| {} | {} | {} | {} | {} | {} / {} | {} | {} | {:.3f} | {} |\n", Visible(p.prompt->id, 40),
        m.exact ? "yes" : "**no**",
        m.first_divergence >= 0 ? std::to_string(m.first_divergence)
                                : (m.first_divergence_char >= 0
                                       ? "byte " + std::to_string(m.first_divergence_char)
                                       : "-"),
        Fmt(m.token_agreement, "{:.3f}"), Fmt(m.top1_agreement, "{:.3f}"),
        Fmt(m.mean_logprob_diff, "{:.3g}"), Fmt(m.max_logprob_diff, "{:.3g}"),
        YesNo(m.a_in_b_topk), YesNo(m.b_in_a_topk), m.similarity,
        p.runs.size() > 1 ? fmt::format("{}/{}", sampled_exact, p.runs.size() - 1) : "-");
  }
  bool any = false;
  for (const ComparePromptResult& p : r.prompts) {
    const CompareRun& gr = p.runs[0];
    if (gr.metrics.exact) continue;
    if (!any) md += "\n## Where the greedy answers diverge\n\n";
    any = true;
    md += fmt::format("- **{}** — {}\n  - A: `{}`\n  - B: `{}`\n", Visible(p.prompt->id, 40),
                      WhereItDiverged(gr), Visible(gr.a.text, 160), Visible(gr.b.text, 160));
  }
  return md;
}

std::string CompareReportText(const CompareReportInput& in) {
  const CompareResult& r = *in.result;
  const ModeSummary &g = r.greedy, &s = r.sampled;
  std::string out = fmt::format("compare: A {} ({})\n         B {} ({})\n", in.a->text, r.model_a,
                                in.b->text, r.model_b);
  out += fmt::format("{} prompts, {} runs each ({} greedy + {} sampled), {:.1f} s\n\n",
                     r.prompts.size(), 1 + in.options->samples, 1, in.options->samples, r.seconds);
  out += fmt::format("{:<9} {:>11} {:>10} {:>9} {:>9} {:>13} {:>13} {:>10}\n", "mode", "exact",
                     "consistent", "tok.agr", "top1.agr", "mean lp diff", "max lp diff",
                     "similarity");
  auto line = [&](const char* mode, const ModeSummary& m) {
    if (m.runs == 0) return;
    out += fmt::format("{:<9} {:>11} {:>10} {:>9} {:>9} {:>13} {:>13} {:>10.4f}\n", mode,
                       fmt::format("{}/{}", m.exact, m.runs), Fmt(m.consistent_rate, "{:.3f}"),
                       Fmt(m.token_agreement, "{:.3f}"), Fmt(m.top1_agreement, "{:.3f}"),
                       Fmt(m.mean_logprob_diff, "{:.3g}"), Fmt(m.max_logprob_diff, "{:.3g}"),
                       m.similarity);
  };
  line("greedy", g);
  line("sampled", s);
  bool header = false;
  int shown = 0;
  for (const ComparePromptResult& p : r.prompts) {
    const CompareRun& gr = p.runs[0];
    if (gr.metrics.exact) continue;
    if (!header) out += "\ngreedy divergences:\n";
    header = true;
    if (++shown > 10) {
      out += "  … (all of them in --markdown / --json)\n";
      break;
    }
    out += fmt::format("  {}: {}\n", Visible(p.prompt->id, 40), WhereItDiverged(gr, 4));
  }
  out += "\n";
  for (const CompareCheck& c : in.checks) out += "check " + CheckLine(c) + "\n";
  out += fmt::format("result: {}\n", in.pass ? "PASS" : "FAIL");
  return out;
}

}  // namespace dh::tools
