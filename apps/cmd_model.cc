// Offline model commands: `logits` (all-position logits as .npy), `generate` (token ids in, new
// token ids out, incremental decoding with the KV cache) and `info`.
#include <cmath>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "apps/command.h"
#include "apps/default_model.h"
#include "apps/memory_plan.h"
#include "base/memory_info.h"
#include "apps/model_options.h"
#include "engine/engine.h"
#include "io/npy.h"
#include "model/sequence_runner.h"

namespace dh::app {
namespace {

// Without --model-path these commands use the embedded model, as run and serve do.
Status UseEmbeddedModelIfUnset(ModelOptions& o) {
  if (!o.model_path.empty()) return Status::Ok();
  o.model_path = DefaultModelPath();
  if (o.model_path.empty()) {
    return NotFound("no --model-path given and no embedded model found (looked in {})",
                    DefaultModelCandidates());
  }
  return Status::Ok();
}

std::function<int()> SetupLogits(CLI::App* sub) {
  struct Args {
    ModelOptions model;
    std::string ids, output;
  };
  auto a = std::make_shared<Args>();
  AddModelOptions(sub, &a->model, /*require_model=*/false);
  AddObservabilityOptions(sub, &a->model.observe, kTraceFlags | kDumpFlags | kPluginFlags);
  AddKvCacheOptions(sub, &a->model);
  sub->add_option("--token-ids", a->ids, "Comma-separated prompt token ids")->required();
  sub->add_option("--output,-o", a->output, "Output .npy file: float32 [n_tokens, vocab_size]")
      ->required();
  return [a]() -> int {
    auto ids = ParseIdList(a->ids, "--token-ids");
    if (!ids.ok()) return ReportError(ids.status());
    if (Status st = UseEmbeddedModelIfUnset(a->model); !st.ok()) return ReportError(st);
    auto loaded = LoadFromOptions(a->model);
    if (!loaded.ok()) return ReportError(loaded.status());
    auto runner = SequenceRunner::Create(*loaded->model, *loaded->backend,
                                         static_cast<int>(ids->size()));
    if (!runner.ok()) return ReportError(runner.status());
    auto logits = (*runner)->Feed(*ids, /*all_logits=*/true);
    if (!logits.ok()) return ReportError(logits.status());
    const int64_t shape[] = {static_cast<int64_t>(ids->size()),
                             loaded->model->config().vocab_size};
    if (!IsLeadRank(*loaded)) return kExitOk;  // every rank has the same logits
    Status st = WriteNpy(a->output, DType::kF32, logits->data(), shape);
    if (!st.ok()) return ReportError(st);
    return kExitOk;
  };
}

struct GenerateArgs {
  ModelOptions model;
  std::string ids;
  int max_tokens = 16;
  double temperature = 0.0;
  uint64_t seed = 0;
  bool json = false;
  bool ignore_eos = false;
};

void PrintIds(const std::vector<int32_t>& ids, bool json) {
  if (json) {
    std::printf("%s\n", nlohmann::json{{"ids", ids}}.dump().c_str());
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
    std::printf("\n");
  }
}

// `generate --speculative mtp`: one request through an engine with k drafts per step; returns
// the generated ids and the engine's counters.
Result<std::pair<std::vector<int32_t>, EngineStats>> GenerateWithEngine(
    LoadedModel& loaded, const std::vector<int32_t>& prompt, const GenerateArgs& a, int k) {
  const int64_t len = static_cast<int64_t>(prompt.size()) + a.max_tokens + 1;
  if (len > loaded.model->config().max_position_embeddings) {
    return InvalidArgument("--max-tokens: {} prompt + {} new tokens exceed the context of {}",
                           prompt.size(), a.max_tokens,
                           loaded.model->config().max_position_embeddings);
  }
  EngineOptions eo;
  eo.max_num_seqs = 1;
  eo.max_model_len = static_cast<int>(len);
  eo.num_kv_blocks = static_cast<int>(len / 16 + 2);
  eo.num_speculative_tokens = k;
  Engine engine(eo, std::move(loaded.model), *loaded.backend, nullptr);
  DH_RETURN_IF_ERROR(engine.Start());
  Request req;
  req.prompt_token_ids = prompt;
  req.sampling.temperature = static_cast<float>(a.temperature);
  req.sampling.seed = a.seed;
  req.sampling.max_tokens = a.max_tokens;
  req.sampling.ignore_eos = a.ignore_eos;
  DH_ASSIGN_OR_RETURN(auto handle, engine.Submit(std::move(req)));
  RequestOutput done = handle->WaitFinished();
  if (!done.error.ok()) return done.error;
  return std::make_pair(std::move(done.token_ids), engine.GetStats());
}

std::function<int()> SetupGenerate(CLI::App* sub) {
  using Args = GenerateArgs;
  auto a = std::make_shared<Args>();
  AddModelOptions(sub, &a->model, /*require_model=*/false);
  AddObservabilityOptions(sub, &a->model.observe, kTraceFlags | kDumpFlags | kPluginFlags);
  AddKvCacheOptions(sub, &a->model);
  AddSpeculativeOptions(sub, &a->model);
  sub->add_option("--token-ids", a->ids, "Comma-separated prompt token ids")->required();
  sub->add_option("--max-tokens", a->max_tokens, "New tokens to generate (default 16)");
  sub->add_option("--temperature", a->temperature, "0 = greedy (default); > 0 samples");
  sub->add_option("--seed", a->seed, "Sampling seed (default 0)");
  sub->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the end-of-sequence token");
  sub->add_flag("--json", a->json, "Print {\"ids\": [...]} instead of space-separated ids");
  return [a]() -> int {
    auto ids = ParseIdList(a->ids, "--token-ids");
    if (!ids.ok()) return ReportError(ids.status());
    if (a->max_tokens < 0) {
      return ReportError(InvalidArgument("--max-tokens: expected >= 0, got {}", a->max_tokens));
    }
    if (!(a->temperature >= 0.0) || !std::isfinite(a->temperature)) {
      return ReportError(InvalidArgument("--temperature: expected >= 0"));
    }
    if (Status st = UseEmbeddedModelIfUnset(a->model); !st.ok()) return ReportError(st);
    auto loaded = LoadFromOptions(a->model);
    if (!loaded.ok()) return ReportError(loaded.status());
    std::vector<int32_t> out;
    if (SpeculativeTokens(a->model) > 0) {
      // Through the engine, which drafts and verifies (greedy: the same ids as below; sampled:
      // the same distribution, drawn differently).
      auto result = GenerateWithEngine(*loaded, *ids, *a, SpeculativeTokens(a->model));
      if (!result.ok()) return ReportError(result.status());
      out = std::move(result->first);
      if (!a->model.quiet) std::fprintf(stderr, "%s\n", SpeculativeSummary(result->second).c_str());
      PrintIds(out, a->json);
      return kExitOk;
    }
    Model& model = *loaded->model;
    auto runner = SequenceRunner::Create(model, *loaded->backend,
                                         static_cast<int>(ids->size()) + a->max_tokens);
    if (!runner.ok()) return ReportError(runner.status());
    std::mt19937_64 rng(a->seed);
    std::span<const int32_t> next = *ids;
    int32_t token = 0;
    const auto& eos = model.config().eos_token_ids;
    for (int step = 0; step < a->max_tokens; ++step) {
      auto logits = (*runner)->Feed(next, /*all_logits=*/false);
      if (!logits.ok()) return ReportError(logits.status());
      if (a->temperature == 0.0) {
        token = ArgMax(*logits);
      } else {
        std::vector<double> p(logits->size());
        const float mx = (*logits)[ArgMax(*logits)];
        for (size_t i = 0; i < p.size(); ++i) {
          p[i] = std::exp(((*logits)[i] - mx) / a->temperature);
        }
        std::discrete_distribution<int32_t> dist(p.begin(), p.end());
        token = dist(rng);
      }
      out.push_back(token);
      if (!a->ignore_eos && std::find(eos.begin(), eos.end(), token) != eos.end()) break;
      next = std::span<const int32_t>(&token, 1);
    }
    PrintIds(out, a->json);
    return kExitOk;
  };
}

std::function<int()> SetupInfo(CLI::App* sub) {
  struct Args {
    ModelOptions model;
    int max_seq_len = 0;
    bool json = false;
    bool plan = false;
    int max_num_seqs = 64;
    std::string kv_cache_memory;
  };
  auto a = std::make_shared<Args>();
  AddModelOptions(sub, &a->model, /*require_model=*/false);
  AddKvCacheOptions(sub, &a->model);
  sub->add_option("--max-seq-len", a->max_seq_len,
                  "Context for the KV figure (default: max_position_embeddings)");
  sub->add_flag("--json", a->json, "Print JSON");
  sub->add_flag("--plan", a->plan,
                "Print the memory plan (weights in the chosen format, KV pool, activations) "
                "against the available memory, without loading the model");
  sub->add_option("--max-num-seqs", a->max_num_seqs, "With --plan: sequences batched (default 64)");
  sub->add_option("--kv-cache-memory", a->kv_cache_memory,
                  "With --plan: KV pool size (default: as serve chooses)");
  return [a]() -> int {
    if (Status st = UseEmbeddedModelIfUnset(a->model); !st.ok()) return ReportError(st);
    if (a->plan) {
      PlanInputs in;
      in.model = a->model;
      in.max_seq_len = a->max_seq_len;
      in.max_num_seqs = a->max_num_seqs;
      if (!a->kv_cache_memory.empty()) {
        auto bytes = ParseByteSizeText(a->kv_cache_memory);
        if (!bytes) {
          return ReportError(InvalidArgument("--kv-cache-memory: '{}': expected a size (e.g. 2GiB)",
                                             a->kv_cache_memory));
        }
        in.kv_cache_memory = *bytes;
      }
      auto plan = PlanMemory(in);
      if (!plan.ok()) return ReportError(plan.status());
      std::fputs(FormatPlan(*plan).c_str(), stdout);
      return kExitOk;
    }
    auto loaded = LoadFromOptions(a->model);
    if (!loaded.ok()) return ReportError(loaded.status());
    const Model& m = *loaded->model;
    const ModelInfo& info = m.info();
    const ModelConfig& c = m.config();
    const int64_t ctx = a->max_seq_len > 0 ? a->max_seq_len : c.max_position_embeddings;
    const double kv_per_seq = static_cast<double>(info.kv_bytes_per_token) * ctx;
    nlohmann::json j = {
        {"architecture", info.architecture},
        {"parameters", info.num_parameters},
        {"tensors", info.num_tensors},
        {"skipped_tensors", info.skipped_tensors},
        {"bytes_by_dtype", info.bytes_by_dtype},
        {"weight_bytes", info.weight_bytes},
        {"active_weight_bytes_per_token", info.active_weight_bytes_per_token},
        {"kv_bytes_per_token", info.kv_bytes_per_token},
        {"kv_cache_dtype", std::string(KvCacheDtypeName(m.kv_spec().dtype))},
        {"kv_bytes_per_sequence", kv_per_seq},
        {"context", ctx},
        {"layers", c.num_hidden_layers},
        {"hidden_size", c.hidden_size},
        {"vocab_size", c.vocab_size},
        {"load_seconds", loaded->load_seconds},
    };
    // With --tp-size N the figures above are rank 0's; the weights of every rank, gathered.
    std::vector<uint64_t> rank_bytes{info.weight_bytes};
    if (comm::Communicator* comm = loaded->parallel.comm.get()) {
      rank_bytes.resize(static_cast<size_t>(comm->Size()));
      const uint64_t mine = info.weight_bytes;
      if (Status st = comm->AllGather(&mine, sizeof(mine), rank_bytes.data()); !st.ok()) {
        return ReportError(st);
      }
      j["tp_size"] = comm->Size();
      j["weight_bytes_per_rank"] = rank_bytes;
    }
    if (a->json) {
      std::printf("%s\n", j.dump(2).c_str());
      return kExitOk;
    }
    auto gib = [](double b) { return b / (1024.0 * 1024.0 * 1024.0); };
    std::printf("architecture       %s\n", info.architecture.c_str());
    std::printf("parameters         %lld (%.3f B)\n", static_cast<long long>(info.num_parameters),
                info.num_parameters / 1e9);
    std::printf("tensors            %lld (%lld skipped)\n",
                static_cast<long long>(info.num_tensors),
                static_cast<long long>(info.skipped_tensors));
    for (const auto& [dtype, bytes] : info.bytes_by_dtype) {
      std::printf("dtype %-12s %.3f GiB\n", dtype.c_str(), gib(static_cast<double>(bytes)));
    }
    std::printf("weights            %.3f GiB (%.3f GiB read per decoded token)\n",
                gib(static_cast<double>(info.weight_bytes)),
                gib(static_cast<double>(info.active_weight_bytes_per_token)));
    std::printf("kv cache           %zu bytes per token (--kv-cache-dtype %s), %.3f GiB per "
                "%lld-token sequence\n",
                info.kv_bytes_per_token, std::string(KvCacheDtypeName(m.kv_spec().dtype)).c_str(),
                gib(kv_per_seq), static_cast<long long>(ctx));
    if (rank_bytes.size() > 1) {
      std::printf("tensor parallel    %zu ranks; figures above are rank 0's\n", rank_bytes.size());
      for (size_t r = 0; r < rank_bytes.size(); ++r) {
        std::printf("weights rank %-5zu %.3f GiB (%.1f MiB)\n", r,
                    gib(static_cast<double>(rank_bytes[r])), rank_bytes[r] / 1048576.0);
      }
    }
    return kExitOk;
  };
}

DH_REGISTER_COMMAND(kLogits, "logits", "Write float32 logits for every prompt position (.npy)",
                    SetupLogits);
DH_REGISTER_COMMAND(kGenerate, "generate", "Generate token ids from prompt token ids",
                    SetupGenerate);
DH_REGISTER_COMMAND(kInfo, "info", "Architecture, parameters, dtypes and memory of a model",
                    SetupInfo);

}  // namespace
}  // namespace dh::app
