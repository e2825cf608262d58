// `deepharness profile`: a prefill of -p tokens and -n decode steps after it, through a
// TracingBackend, then the time per op class, per layer type and per kernel against the
// machine's measured read bandwidth and FMA peak (the probes `bench` uses). Without
// --model-path the embedded model is profiled.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "apps/command.h"
#include "apps/default_model.h"
#include "apps/model_options.h"
#include "backend/cpu/membw.h"
#include "base/thread_pool.h"
#include "tools/bench_model.h"
#include "tools/profile.h"

namespace dh::app {
namespace {

struct ProfileArgs {
  ModelOptions model;
  int prompt = 512, gen = 64, batch = 1;
  int membw_mib = 512;
  bool json = false;
};

int Profile(ProfileArgs& a) {
  if (a.prompt < 0 || a.gen < 0 || a.batch < 1) {
    return ReportError(InvalidArgument("-p and -n: expected >= 0; --batch: expected >= 1"));
  }
  if (a.membw_mib < 0) return ReportError(InvalidArgument("--membw-mib: expected >= 0"));
  if (a.model.model_path.empty()) {
    a.model.model_path = DefaultModelPath();
    if (a.model.model_path.empty()) {
      return ReportError(
          NotFound("no --model-path given and no embedded model found (looked in {})",
                   DefaultModelCandidates()));
    }
  }
  if (a.json) a.model.quiet = true;
  a.model.observe.profile = true;
  auto loaded = LoadFromOptions(a.model);
  if (!loaded.ok()) return ReportError(loaded.status());
  TracingBackend* traced = loaded->observability->tracing_backend();

  tools::ProfileReport report;
  report.label = fmt::format("{} (batch {}, pp{}, tg{})",
                             std::filesystem::path(a.model.model_path).filename().string(), a.batch,
                             a.prompt, a.gen);
  const int threads = loaded->parallel.threads > 0 ? loaded->parallel.threads : AvailableCpus();
  {
    ThreadPool pool(threads);
    if (a.membw_mib > 0) {
      report.bandwidth_gbs = MeasureReadBandwidthGBs(pool, static_cast<size_t>(a.membw_mib) << 20);
    }
    report.peak_gflops = MeasureFmaPeakGflops(pool);
  }
  // One untimed decode step first, so first-touch costs stay out of both phases.
  tools::ModelBenchOptions warm;
  warm.prompt = 0;
  warm.gen = 1;
  warm.batches = {a.batch};
  warm.repeat = 1;
  warm.warmup = 0;
  if (auto r = tools::RunModelBench(*loaded->model, *loaded->backend, warm); !r.ok()) {
    return ReportError(r.status());
  }
  // The decode steps run after the prompt's prefill (untimed, as bench's --depth), as they do
  // when serving: attention reads the prompt's keys.
  struct Phase {
    const char* name;
    int prompt, gen, depth;
  };
  for (const Phase& ph :
       {Phase{"prefill", a.prompt, 0, 0}, Phase{"decode", 0, a.gen, a.prompt}}) {
    if (ph.prompt == 0 && ph.gen == 0) continue;
    tools::ModelBenchOptions o = warm;
    o.prompt = ph.prompt;
    o.gen = ph.gen;
    o.depth = ph.depth;
    auto start = std::chrono::steady_clock::now();
    o.before_timed = [&] {
      traced->ResetTotals();
      start = std::chrono::steady_clock::now();
    };
    auto r = tools::RunModelBench(*loaded->model, *loaded->backend, o);
    if (!r.ok()) return ReportError(r.status());
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    report.phases.push_back(tools::SummarizeProfile(ph.name, wall, traced->Totals(),
                                                    report.bandwidth_gbs, report.peak_gflops));
  }
  if (!IsLeadRank(*loaded)) return kExitOk;
  if (a.json) {
    std::printf("%s\n", tools::ProfileJson(report).dump(2).c_str());
  } else {
    std::fputs(tools::FormatProfile(report).c_str(), stdout);
  }
  return kExitOk;
}

std::function<int()> SetupProfile(CLI::App* sub) {
  auto a = std::make_shared<ProfileArgs>();
  AddModelOptions(sub, &a->model, /*require_model=*/false);
  AddObservabilityOptions(sub, &a->model.observe, kPluginFlags);
  sub->add_option("-p,--prompt", a->prompt,
                  "Prompt tokens per sequence of the prefill (default 512; 0 skips)");
  sub->add_option("-n,--gen", a->gen,
                  "Decode steps after the prompt's prefill (default 64; 0 skips)");
  sub->add_option("--batch", a->batch, "Sequences per step (default 1)");
  sub->add_option("--membw-mib", a->membw_mib,
                  "Buffer of the read-bandwidth probe in MiB (default 512; 0 skips it)");
  sub->add_flag("--json", a->json, "Print JSON");
  return [a]() -> int { return Profile(*a); };
}

DH_REGISTER_COMMAND(kProfile, "profile",
                    "Time per op class and layer type against measured bandwidth and peak",
                    SetupProfile);

}  // namespace
}  // namespace dh::app
