// `deepharness perplexity`: mean negative log-likelihood (nats per token) and perplexity of a
// text file, over windows of --context tokens advanced by --stride (Hugging Face's "perplexity
// of fixed-length models" scheme: each window scores only the tokens not scored before; the
// first token of the text is never scored).
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "apps/command.h"
#include "apps/default_model.h"
#include "apps/model_options.h"
#include "base/mapped_file.h"
#include "base/progress.h"
#include "model/sequence_runner.h"
#include "tokenizer/tokenizer.h"

namespace dh::app {
namespace {

// -log softmax(logits)[target], in double.
double TokenNll(std::span<const float> logits, int32_t target) {
  float mx = logits[0];
  for (float v : logits) mx = std::max(mx, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  return std::log(sum) + mx - logits[target];
}

std::function<int()> SetupPerplexity(CLI::App* sub) {
  struct Args {
    ModelOptions model;
    std::string file;
    int context = 0;
    int stride = 0;
    bool add_special_tokens = false;
    bool json = false;
    int64_t max_tokens = 0;
  };
  auto a = std::make_shared<Args>();
  AddModelOptions(sub, &a->model, /*require_model=*/false);
  AddObservabilityOptions(sub, &a->model.observe, kTraceFlags | kDumpFlags | kPluginFlags);
  AddKvCacheOptions(sub, &a->model);
  sub->add_option("--file", a->file, "UTF-8 text file to score")->required();
  sub->add_option("--context", a->context,
                  "Tokens per window (default: min(max_position_embeddings, 2048))");
  sub->add_option("--stride", a->stride, "Tokens the window advances by (default: --context)");
  sub->add_flag("--add-special-tokens", a->add_special_tokens,
                "Tokenize with the tokenizer's special tokens (e.g. BOS) added once at the start");
  sub->add_option("--max-tokens", a->max_tokens, "Score only the first N tokens of the file");
  sub->add_flag("--json", a->json, "Print JSON");
  return [a]() -> int {
    if (a->model.model_path.empty()) {
      a->model.model_path = DefaultModelPath();
      if (a->model.model_path.empty()) {
        return ReportError(NotFound("no --model-path given and no embedded model found (looked "
                                    "in {})", DefaultModelCandidates()));
      }
    }
    auto text = ReadTextFile(a->file, size_t{1} << 30);
    if (!text.ok()) return ReportError(text.status());
    auto tok = Tokenizer::Load(a->model.model_path);
    if (!tok.ok()) return ReportError(tok.status());
    auto ids = (*tok)->Encode(*text, a->add_special_tokens);
    if (!ids.ok()) return ReportError(ids.status().WithContext(a->file));
    if (a->max_tokens > 0 && static_cast<int64_t>(ids->size()) > a->max_tokens) {
      ids->resize(static_cast<size_t>(a->max_tokens));
    }
    if (ids->size() < 2) {
      return ReportError(InvalidArgument("{}: needs at least 2 tokens, got {}", a->file,
                                         ids->size()));
    }
    auto loaded = LoadFromOptions(a->model);
    if (!loaded.ok()) return ReportError(loaded.status());
    Model& model = *loaded->model;
    const int64_t max_pos = model.config().max_position_embeddings;
    const int context = a->context > 0 ? a->context
                                       : static_cast<int>(std::min<int64_t>(max_pos, 2048));
    const int stride = a->stride > 0 ? a->stride : context;
    if (context < 2 || stride > context) {
      return ReportError(InvalidArgument("--context {} / --stride {}: need context >= 2 and "
                                         "0 < stride <= context", context, stride));
    }
    auto runner = SequenceRunner::Create(model, *loaded->backend, context);
    if (!runner.ok()) return ReportError(runner.status());
    const int64_t n = static_cast<int64_t>(ids->size());
    const int64_t vocab = model.config().vocab_size;
    double nll = 0;
    int64_t scored = 0, prev_end = 0;
    ProgressBar progress("perplexity", static_cast<uint64_t>(n), !a->json && !a->model.quiet);
    for (int64_t begin = 0; begin < n; begin += stride) {
      const int64_t end = std::min<int64_t>(begin + context, n);
      const int64_t first_target = std::max<int64_t>(prev_end, begin + 1);
      (*runner)->Reset();
      auto logits = (*runner)->Feed(std::span(*ids).subspan(begin, end - begin), true);
      if (!logits.ok()) return ReportError(logits.status());
      for (int64_t t = first_target; t < end; ++t) {
        const int64_t row = t - 1 - begin;  // the position that predicts token t
        nll += TokenNll(std::span(*logits).subspan(row * vocab, vocab), (*ids)[t]);
        ++scored;
      }
      prev_end = end;
      progress.Update(static_cast<uint64_t>(end));
      if (end == n) break;
    }
    progress.Finish();
    const double mean = nll / static_cast<double>(scored);
    nlohmann::json j = {{"file", a->file},           {"tokens", n},
                        {"scored_tokens", scored},   {"context", context},
                        {"stride", stride},          {"mean_nll", mean},
                        {"perplexity", std::exp(mean)}};
    if (a->json) {
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("perplexity %.4f  mean loss %.5f nats/token  (%lld tokens scored, context %d, "
                  "stride %d)\n", std::exp(mean), mean, static_cast<long long>(scored), context,
                  stride);
    }
    return kExitOk;
  };
}

DH_REGISTER_COMMAND(kPerplexity, "perplexity",
                    "Perplexity and mean loss (nats/token) of a text file", SetupPerplexity);

}  // namespace
}  // namespace dh::app
