// `deepharness run`: one-shot completion of --prompt, or an interactive chat (--chat) through the
// model's chat template. Text streams to stdout as it is generated. Without --model-path the
// embedded Shakespeare model is used.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "apps/command.h"
#include "apps/default_model.h"
#include "apps/model_options.h"
#include "apps/serve_parallel.h"
#include "base/mapped_file.h"
#include "chat/chat_template.h"
#include "engine/engine.h"
#include "io/model_config.h"
#include "tokenizer/tokenizer.h"

namespace dh::app {
namespace {

struct RunArgs {
  ModelOptions model;
  std::string prompt;
  bool chat = false;
  std::string system;
  int max_tokens = 200;
  std::optional<double> temperature, top_p;
  int top_k = 0;
  std::optional<uint64_t> seed;
  bool raw = false;
  int max_seq_len = 0;
};

// Streams one request's text to stdout; returns the full text.
Result<std::string> Stream(Engine& engine, std::vector<int32_t> ids, const SamplingParams& sp) {
  Request req;
  req.prompt_token_ids = std::move(ids);
  req.sampling = sp;
  DH_ASSIGN_OR_RETURN(auto handle, engine.Submit(std::move(req)));
  std::string text;
  while (true) {
    auto out = handle->Next(std::chrono::milliseconds(100));
    if (!out) continue;
    std::fwrite(out->text.data(), 1, out->text.size(), stdout);
    std::fflush(stdout);
    text += out->text;
    if (out->finished) {
      if (!out->error.ok()) return out->error;
      break;
    }
  }
  return text;
}

int Run(RunArgs& a) {
  if (a.model.model_path.empty()) {
    a.model.model_path = DefaultModelPath();
    if (a.model.model_path.empty()) {
      return ReportError(NotFound("no --model-path given and no embedded model found (looked in {})",
                                  DefaultModelCandidates()));
    }
  }
  if (!a.chat && a.prompt.empty()) {
    return ReportError(InvalidArgument("give --prompt TEXT, or --chat for an interactive chat"));
  }
  auto tokenizer = Tokenizer::Load(a.model.model_path);
  if (!tokenizer.ok()) return ReportError(tokenizer.status());
  auto gen = LoadGenerationConfig(a.model.model_path);
  if (!gen.ok()) return ReportError(gen.status());
  auto loaded = LoadFromOptions(a.model);
  if (!loaded.ok()) return ReportError(loaded.status());
  // --tp-size N under mpirun: rank 0 runs the engine, the other ranks follow its steps.
  if (auto done = LeadOrFollow(*loaded, std::chrono::seconds(600))) return *done;

  SamplingParams sp;
  sp.temperature = static_cast<float>(a.temperature.value_or(gen->temperature.value_or(1.0)));
  sp.top_p = static_cast<float>(a.top_p.value_or(gen->top_p.value_or(1.0)));
  sp.top_k = a.top_k;
  sp.seed = a.seed;
  sp.max_tokens = a.max_tokens;
  Status valid = sp.Validate(loaded->model->config().vocab_size, true);
  if (!valid.ok()) return ReportError(valid);

  EngineOptions eo;
  eo.max_model_len = a.max_seq_len;
  const int64_t ctx = a.max_seq_len > 0 ? a.max_seq_len
                                        : loaded->model->config().max_position_embeddings;
  eo.num_kv_blocks = static_cast<int>((std::min<int64_t>(ctx, 1 << 20) + 15) / 16 + 1);
  eo.max_num_seqs = 1;
  eo.num_speculative_tokens = SpeculativeTokens(a.model);
  Backend& backend = *loaded->backend;
  Engine engine(eo, std::move(loaded->model), backend, tokenizer->get());
  Status st = engine.Start();
  if (!st.ok()) return ReportError(st);

  if (!a.chat) {
    auto ids = (*tokenizer)->Encode(a.prompt, /*add_special_tokens=*/true);
    if (!ids.ok()) return ReportError(ids.status().WithContext("--prompt"));
    if (!a.raw) {
      std::fwrite(a.prompt.data(), 1, a.prompt.size(), stdout);
    }
    auto text = Stream(engine, std::move(*ids), sp);
    std::printf("\n");
    std::fflush(stdout);
    if (eo.num_speculative_tokens > 0 && !a.model.quiet) {
      std::fprintf(stderr, "%s\n", SpeculativeSummary(engine.GetStats()).c_str());
    }
    return text.ok() ? kExitOk : ReportError(text.status());
  }

  // Interactive chat through the template.
  auto config_text = ReadTextFile(a.model.model_path + "/tokenizer_config.json");
  if (!config_text.ok()) return ReportError(config_text.status());
  auto config = nlohmann::ordered_json::parse(*config_text, nullptr, false);
  if (config.is_discarded()) {
    return ReportError(InvalidArgument("{}/tokenizer_config.json: invalid JSON", a.model.model_path));
  }
  auto tc = chat::ChatTemplateFromTokenizerConfig(config);
  if (!tc.ok()) return ReportError(tc.status());
  if (tc->chat_template.empty()) {
    return ReportError(InvalidArgument("{}: the tokenizer config has no chat_template",
                                       a.model.model_path));
  }
  auto tmpl = chat::ChatTemplate::Parse(tc->chat_template);
  if (!tmpl.ok()) return ReportError(tmpl.status());
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  std::fprintf(stderr, "chat with %s — an empty line or Ctrl-D ends it\n", a.model.model_path.c_str());
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    messages.push_back({{"role", "user"}, {"content", line}});
    nlohmann::ordered_json ctx = {{"messages", messages},
                                  {"add_generation_prompt", true},
                                  {"bos_token", tc->bos_token},
                                  {"eos_token", tc->eos_token}};
    auto rendered = tmpl->Render(ctx);
    if (!rendered.ok()) return ReportError(rendered.status());
    auto ids = (*tokenizer)->Encode(*rendered, /*add_special_tokens=*/false);
    if (!ids.ok()) return ReportError(ids.status());
    auto reply = Stream(engine, std::move(*ids), sp);
    std::printf("\n");
    std::fflush(stdout);  // the reply's line ends before the next "> " prompt on stderr
    if (!reply.ok()) return ReportError(reply.status());
    messages.push_back({{"role", "assistant"}, {"content", *reply}});
  }
  return kExitOk;
}

std::function<int()> SetupRun(CLI::App* sub) {
  auto a = std::make_shared<RunArgs>();
  AddModelOptions(sub, &a->model, /*require_model=*/false);
  AddObservabilityOptions(sub, &a->model.observe, kTraceFlags | kDumpFlags | kPluginFlags);
  AddKvCacheOptions(sub, &a->model);
  AddSpeculativeOptions(sub, &a->model);
  sub->add_option("--prompt,-p", a->prompt, "Text to complete (one shot)");
  sub->add_flag("--chat", a->chat, "Interactive chat through the model's chat template");
  sub->add_option("--system", a->system, "System message for --chat");
  sub->add_option("--max-tokens,-n", a->max_tokens, "Tokens to generate per reply (default 200)");
  sub->add_option("--temperature,-t", a->temperature,
                  "Sampling temperature; 0 = greedy (default: generation_config.json, else 1)");
  sub->add_option("--top-p", a->top_p, "Nucleus sampling (default: generation_config.json, else 1)");
  sub->add_option("--top-k", a->top_k, "Top-k sampling (default 0 = off)");
  sub->add_option("--seed", a->seed, "Sampling seed (default: random)");
  sub->add_option("--max-seq-len,--max-model-len", a->max_seq_len,
                  "Context limit (default: max_position_embeddings)");
  sub->add_flag("--raw", a->raw, "Print only the completion, not the prompt");
  return [a]() -> int { return Run(*a); };
}

DH_REGISTER_COMMAND(kRun, "run", "Complete a prompt, or chat interactively (--chat)", SetupRun);

}  // namespace
}  // namespace dh::app
