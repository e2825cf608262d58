// Shared model-loading flags and helpers for the subcommands.
#include "apps/model_options.h"

#include <chrono>
#include <cstdio>

#include "apps/command.h"
#include "backend/registry.h"
#include "base/log.h"
#include "engine/engine.h"

namespace dh::app {

void AddModelOptions(CLI::App* sub, ModelOptions* o, bool require_model) {
  auto* path = sub->add_option("--model-path,--model", o->model_path,
                               "Hugging Face model directory (config.json + *.safetensors)");
  if (require_model) path->required();
  sub->add_option("--device", o->device,
                  "Backend to run on (default cpu); registered in this build: " +
                      RegisteredBackendList());
  sub->add_option("--dtype", o->dtype,
                  "Weight dtype: auto (as stored, default), float32, bfloat16, float16");
  sub->add_option("--quant", o->quant,
                  "Quantize projection weights at load: none (default), int8 (symmetric, f16 "
                  "scale per 32; = int8-g32), int8-row (one scale per row), int4 (f16 scale + "
                  "4-bit zero point per 32; = int4-g32), int4-g128, fp8 (e4m3, 128x128 block "
                  "scales), or a dense dtype bf16, f16, f32. Embeddings, norms, the MoE router and "
                  "lm_head stay as stored; FORMAT,lm_head=FORMAT gives lm_head its own format "
                  "(e.g. int4,lm_head=int8)");
  sub->add_flag("--quant-lm-head", o->quant_lm_head, "With --quant, quantize lm_head too");
  sub->add_option("--policy", o->policy,
                  "Per-layer precision policy (instead of --quant): static:FORMAT, dynamic, or "
                  "custom:CLASS=FORMAT,... with classes embed, attn, mla, mlp, experts, shared, "
                  "gate, lm_head, other, default, layers.A-B[.CLASS] and formats auto, f32, bf16, "
                  "f16, int8, int8-row, int4, int4-g128, fp8 (docs/quantization.md)");
  sub->add_option("--threads", o->threads, "Worker threads (default: all available CPUs)");
  sub->add_flag("--mmap", o->mmap,
                "Map the weight files instead of reading them into memory (faster start, but the "
                "page cache can evict weights under memory pressure)");
  sub->add_flag("--no-mmap", o->no_mmap,
                "Read weights into anonymous memory (the default; overrides --mmap)");
  sub->add_flag("--mlock", o->mlock, "Lock weights in RAM (needs RLIMIT_MEMLOCK)");
  sub->add_option("--compile-cache", o->compile_cache_dir,
                  "Directory of compiled weight caches written by `deepharness compile` "
                  "(default: $XDG_CACHE_HOME/deepharness or ~/.cache/deepharness)");
  sub->add_flag("--no-compile-cache", o->no_compile_cache,
                "Load from the checkpoint even when a compiled weight cache exists");
  sub->add_flag("--trace-kernels", o->trace_kernels, "Log the kernel chosen for each op and shape");
  sub->add_option("--tp-size,--tensor-parallel-size", o->tp_size,
                  "Tensor-parallel ranks: split the model over N processes started by "
                  "`mpirun -np N` (default 1; docs/parallel.md)");
  sub->add_option("--ep-size", o->ep_size,
                  "Expert-parallel groups for MoE models, a divisor of --tp-size: the routed "
                  "experts are dealt out to M groups of ranks, each expert split over its "
                  "group's ranks like a dense MLP (default: --tp-size, experts whole; 1: every "
                  "expert split over every rank)");
  sub->add_flag("--quiet,-q", o->quiet, "Only print errors on stderr");
}

void AddKvCacheOptions(CLI::App* sub, ModelOptions* o) {
  sub->add_option("--kv-cache-dtype", o->kv_cache_dtype,
                  "KV cache element type: auto (f32, exact; default), bf16, fp8 (e4m3) or int8; "
                  "fp8 and int8 keep one scale per token and head (MLA: for the latent and for "
                  "the rope key) and hold about 2x the tokens of bf16 (docs/kv-cache.md)");
}

void AddSpeculativeOptions(CLI::App* sub, ModelOptions* o) {
  sub->add_option("--speculative", o->speculative,
                  "Speculative decoding: mtp drafts with the model's multi-token-prediction layer "
                  "and verifies the drafts in one forward (DeepSeek-V3/R1; default off; "
                  "docs/mtp.md)");
  sub->add_option("--num-speculative-tokens", o->num_speculative_tokens,
                  "With --speculative: tokens drafted per step, 1..8 (default 1)");
}

std::string SpeculativeSummary(const EngineStats& s) {
  auto percent = [](int64_t part, int64_t whole) {
    return whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0;
  };
  std::string out = fmt::format(
      "speculative decoding (mtp, K {}): {} verifications, {} drafted, {} accepted ({:.1f}%); "
      "acceptance per position",
      s.num_speculative_tokens, s.spec_num_drafts, s.spec_draft_tokens, s.spec_accepted_tokens,
      percent(s.spec_accepted_tokens, s.spec_draft_tokens));
  for (int64_t n : s.spec_accepted_per_pos) {
    out += fmt::format(" {:.1f}%", percent(n, s.spec_num_drafts));
  }
  return out;
}

WeightFlags WeightFlagsOf(const ModelOptions& o) {
  return {.dtype = o.dtype, .quant = o.quant, .quant_lm_head = o.quant_lm_head, .policy = o.policy};
}

Result<LoadedModel> LoadFromOptions(const ModelOptions& o, const BackendWrapper& wrap) {
  if (o.quiet) SetLogLevel(LogLevel::kError);
  if (o.threads < 0) return InvalidArgument("--threads: expected >= 0, got {}", o.threads);
  LoadOptions lo;
  // The one parse of the weight flags; nothing below sees the strings.
  DH_ASSIGN_OR_RETURN(lo.plan, ParseWeightPlan(WeightFlagsOf(o)));
  DH_ASSIGN_OR_RETURN(lo.kv_cache_dtype, ParseKvCacheDtype(o.kv_cache_dtype));
  if (!o.speculative.empty()) {
    if (o.speculative != "mtp") {
      return InvalidArgument("--speculative: expected mtp, got '{}'", o.speculative);
    }
    if (o.num_speculative_tokens < 1 || o.num_speculative_tokens > kMaxSpeculativeTokens) {
      return InvalidArgument("--num-speculative-tokens: expected 1..{}, got {}",
                             kMaxSpeculativeTokens, o.num_speculative_tokens);
    }
    if (o.tp_size > 1) {
      return InvalidArgument("--speculative: not available with --tp-size {} (one rank only)",
                             o.tp_size);
    }
    lo.load_mtp = true;
  }
  LoadedModel loaded;
  DH_ASSIGN_OR_RETURN(loaded.parallel, StartParallel(o.tp_size, o.ep_size, o.threads));
  BackendOptions bo;
  bo.num_threads = loaded.parallel.threads;
  bo.trace_kernels = o.trace_kernels;
  DH_ASSIGN_OR_RETURN(loaded.backend, CreateBackend(o.device, bo));
  DH_ASSIGN_OR_RETURN(loaded.observability,
                      Observability::Start(o.observe, loaded.parallel.options.rank, o.quiet));
  // Innermost the plugins (so the self-check compares their ops too), outermost the tracer.
  if (!o.observe.plugins.empty()) {
    DH_ASSIGN_OR_RETURN(std::unique_ptr<PluginBackend> plugins,
                        PluginBackend::Create(std::move(loaded.backend), o.observe.plugins));
    loaded.observability->set_plugin_backend(plugins.get());
    loaded.backend = std::move(plugins);
  }
  if (wrap) loaded.backend = wrap(std::move(loaded.backend));
  if (o.observe.tracing()) {
    auto traced = std::make_unique<TracingBackend>(std::move(loaded.backend));
    loaded.observability->set_tracing_backend(traced.get());
    loaded.backend = std::move(traced);
  }
  lo.file.use_mmap = o.mmap && !o.no_mmap;
  lo.file.mlock = o.mlock;
  lo.show_progress = !o.quiet && IsLeadRank(loaded);
  lo.parallel = loaded.parallel.options;
  // Each rank copies only its slices out of the mapped files (replicated tensors stay mapped),
  // so a rank's resident weights are about 1/N of the split parts.
  if (o.tp_size > 1) lo.file.use_mmap = true;
  if (!o.no_compile_cache) {
    lo.compile_cache.dir =
        o.compile_cache_dir.empty() ? DefaultCompileCacheDir() : o.compile_cache_dir;
  }
  lo.compile_cache.write = o.compile_cache_write;
  lo.compile_cache.force = o.compile_cache_force;
  lo.compile_cache.compile_only = o.compile_only;
  lo.compile_cache.result = &loaded.compile_cache;
  const auto start = std::chrono::steady_clock::now();
  DH_ASSIGN_OR_RETURN(loaded.model, LoadModel(o.model_path, *loaded.backend, lo));
  if (lo.load_mtp && !loaded.model->has_mtp()) {
    return InvalidArgument("--speculative mtp: {} has no MTP layer (config.json "
                           "num_nextn_predict_layers {})",
                           o.model_path, loaded.model->config().num_nextn_predict_layers);
  }
  loaded.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return loaded;
}

Result<std::vector<int32_t>> ParseIdList(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    size_t end = text.find(',', i);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(i, end - i);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty() || item.size() > 10 ||
        item.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgument("{}: '{}' is not a token id (expected non-negative integers "
                             "separated by commas)", flag, item);
    }
    const long long v = std::stoll(item);
    if (v > INT32_MAX) return InvalidArgument("{}: token id {} is too large", flag, item);
    ids.push_back(static_cast<int32_t>(v));
    i = end + 1;
  }
  return ids;
}

int ReportError(const Status& status) {
  std::string msg = status.message();
  for (char& c : msg) {
    if (c == '\n') c = ' ';
  }
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  switch (status.code()) {
    case StatusCode::kInternal:
    case StatusCode::kCancelled:
    case StatusCode::kResourceExhausted: return kExitFailure;
    default: return kExitBadInput;
  }
}

}  // namespace dh::app
