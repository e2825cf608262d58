// `deepharness make-model --preset NAME --output DIR`: writes a random checkpoint of a known shape
// (config.json + safetensors) for demos, tests and benchmarks.
#include <charconv>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/model_options.h"  // ReportError
#include "tools/random_model.h"

namespace dh::app {
namespace {

std::function<int()> SetupMakeModel(CLI::App* sub) {
  struct Args {
    tools::RandomModelOptions options;
    std::string output;
    std::string dtype = "bf16";
    std::vector<std::string> sets;
    bool quiet = false;
  };
  auto a = std::make_shared<Args>();
  std::string presets;
  for (const std::string& p : tools::RandomModelPresets()) {
    presets += (presets.empty() ? "" : ", ") + p;
  }
  sub->add_option("--preset", a->options.preset, "Model shape: " + presets)->required();
  sub->add_option("--output,-o", a->output, "Directory to write (created if missing)")->required();
  CLI::Option* layers =
      sub->add_option("--layers", a->options.layers, "Override the preset's layer count");
  sub->add_option("--vocab-size", a->options.vocab_size,
                  "Override the preset's vocabulary size (e.g. to match a tokenizer copied in)");
  sub->add_option("--dtype", a->dtype, "Weight dtype: bf16 (default) or f32");
  sub->add_option("--seed", a->options.seed, "Random seed (default 0)");
  sub->add_option("--mtp-layers", a->options.mtp_layers,
                  "tiny-v3: multi-token-prediction layers to add, 0 (default) or 1 (for "
                  "--speculative mtp; docs/mtp.md)");
  sub->add_option("--set", a->sets,
                  "Replace an integer field of the preset's config.json before the tensors are "
                  "made, KEY=N (repeatable; e.g. --set hidden_size=1024 --set n_routed_experts=128)");
  sub->add_flag("--quiet,-q", a->quiet, "Print nothing on success");
  return [a, layers]() -> int {
    if (a->dtype == "bf16" || a->dtype == "bfloat16") {
      a->options.dtype = DType::kBF16;
    } else if (a->dtype == "f32" || a->dtype == "float32") {
      a->options.dtype = DType::kF32;
    } else {
      return ReportError(InvalidArgument("--dtype: expected bf16 or f32, got '{}'", a->dtype));
    }
    for (const std::string& kv : a->sets) {
      const size_t eq = kv.find('=');
      int64_t value = 0;
      const char* end = kv.data() + kv.size();
      if (eq == std::string::npos || eq == 0 ||
          std::from_chars(kv.data() + eq + 1, end, value).ptr != end || eq + 1 == kv.size()) {
        return ReportError(InvalidArgument("--set: expected KEY=N (an integer), got '{}'", kv));
      }
      a->options.overrides.emplace_back(kv.substr(0, eq), value);
    }
    if (layers->count() > 0 && a->options.layers < 1) {
      return ReportError(InvalidArgument("--layers: expected >= 1, got {}", a->options.layers));
    }
    const auto start = std::chrono::steady_clock::now();
    auto summary = tools::WriteRandomModel(a->options, a->output);
    if (!summary.ok()) return ReportError(summary.status());
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!a->quiet) {
      std::printf(
          "wrote %s: preset %s, %lld tensors, %.2f M parameters, %.3f GiB in %d file(s), "
          "%.1f s\n",
          a->output.c_str(), a->options.preset.c_str(),
          static_cast<long long>(summary->num_tensors), summary->num_parameters / 1e6,
          summary->bytes / (1024.0 * 1024.0 * 1024.0), summary->num_files, s);
    }
    return kExitOk;
  };
}

DH_REGISTER_COMMAND(kMakeModel, "make-model",
                    "Write a random checkpoint of a known shape (tiny-llama, qwen2-1.5b, v2-lite, "
                    "tiny-v3)",
                    SetupMakeModel);

}  // namespace
}  // namespace dh::app
