// `deepharness bench --model-path DIR ...`: the offline llama-bench-style benchmark (pp prefill
// and tg decode tokens/s over repeats, at several batch sizes) plus the machine's measured read
// bandwidth and the fraction of it decoding achieves. Runs when `bench` is given no benchmark name.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "apps/bench_commands.h"
#include "apps/model_options.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/membw.h"
#include "backend/cpu/quant_vnni.h"
#include "base/thread_pool.h"
#include "tools/bench_model.h"
#include "tools/report_html.h"

namespace dh::app {
namespace {

Result<std::vector<int>> ParseBatchList(const std::string& text) {
  std::vector<int> out;
  DH_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIdList(text, "--batch"));
  for (int32_t v : ids) {
    if (v < 1 || v > 4096)
      return InvalidArgument("--batch: expected sizes in [1, 4096], got {}", v);
    out.push_back(v);
  }
  return out;
}

std::function<int()> SetupModelBench(CLI::App* sub) {
  struct Args {
    ModelOptions model;
    tools::ModelBenchOptions bench;
    std::string batch = "1";
    int membw_mib = 512;
    bool no_peak = false;
    bool json = false;
    std::string report;
    std::vector<std::string> compare;
  };
  auto a = std::make_shared<Args>();
  AddModelOptions(sub, &a->model, /*require_model=*/false);
  AddObservabilityOptions(sub, &a->model.observe, kTraceFlags | kPluginFlags);
  AddKvCacheOptions(sub, &a->model);
  sub->add_option("--prompt,-p", a->bench.prompt,
                  "pp: prompt tokens per sequence, one forward (default 512; 0 skips)");
  sub->add_option("--gen,-n", a->bench.gen,
                  "tg: tokens generated one at a time per sequence (default 128; 0 skips)");
  sub->add_option("--depth,-d", a->bench.depth,
                  "Tokens already in each sequence's KV cache (prefilled once, untimed) before "
                  "pp and tg run; rows are named e.g. tg32 @ d4096 (default 0)");
  sub->add_option("--batch,-b", a->batch,
                  "Comma-separated numbers of sequences run together (default 1)");
  sub->add_option("--repeat,-r", a->bench.repeat, "Timed repeats of each test (default 3)");
  sub->add_option("--warmup", a->bench.warmup, "Untimed runs before each test (default 1)");
  sub->add_option("--seed", a->bench.seed, "Seed for the random prompt tokens (default 0)");
  sub->add_flag("--no-peak", a->no_peak,
               "Skip the f32 FMA and bf16 dot peak probes (pp rows then show GFLOP/s without peak "
               "fractions)");
  sub->add_option("--membw-mib", a->membw_mib,
                  "Buffer for the read-bandwidth probe in MiB (default 512; 0 skips it)");
  sub->add_flag("--json", a->json, "Print the result as JSON");
  sub->add_option("--report", a->report,
                  "Also write an HTML report with charts (tokens/s per test and batch, "
                  "bandwidth and peak fractions) to this file");
  sub->add_option("--compare", a->compare,
                  "Do not run: write the --report of these saved JSON results (bench --json or "
                  "bench serve --json) side by side")
      ->expected(1, -1);
  return [a]() -> int {
    if (!a->compare.empty()) {
      if (a->report.empty())
        return ReportError(InvalidArgument("--compare: expected --report FILE.html to write"));
      auto runs = tools::LoadReportRuns(a->compare);
      if (!runs.ok()) return ReportError(runs.status());
      Status st = tools::WriteReportFile(a->report, tools::BenchReportHtml(*runs, "Benchmark comparison"));
      if (!st.ok()) return ReportError(st);
      std::fprintf(stderr, "wrote %s (%zu results)\n", a->report.c_str(), runs->size());
      return kExitOk;
    }
    if (a->model.model_path.empty()) {
      return ReportError(
          InvalidArgument("bench: --model-path is required (or name a benchmark, "
                          "e.g. bench serve)"));
    }
    if (!a->report.empty()) {
      if (Status st = tools::CheckReportPath(a->report); !st.ok()) return ReportError(st);
    }
    auto batches = ParseBatchList(a->batch);
    if (!batches.ok()) return ReportError(batches.status());
    a->bench.batches = *batches;
    if (a->membw_mib < 0) return ReportError(InvalidArgument("--membw-mib: expected >= 0"));
    if (a->bench.repeat < 1) return ReportError(InvalidArgument("--repeat: expected >= 1"));
    if (a->bench.warmup < 0) return ReportError(InvalidArgument("--warmup: expected >= 0"));
    if (a->bench.prompt < 0 || a->bench.gen < 0 || a->bench.depth < 0) {
      return ReportError(InvalidArgument("--prompt, --gen and --depth: expected >= 0"));
    }
    if (a->json) a->model.quiet = true;
    auto loaded = LoadFromOptions(a->model);
    if (!loaded.ok()) return ReportError(loaded.status());
    const int threads = loaded->parallel.threads > 0 ? loaded->parallel.threads : AvailableCpus();
    if (a->membw_mib > 0) {
      ThreadPool pool(threads);
      a->bench.bandwidth_gbs =
          MeasureReadBandwidthGBs(pool, static_cast<size_t>(a->membw_mib) << 20);
    }
    if (!a->no_peak) {
      ThreadPool pool(threads);
      a->bench.peak_gflops = MeasureFmaPeakGflops(pool);
      a->bench.bf16_peak_gflops = MeasureBf16PeakGflops(pool);  // 0 without AVX512-BF16
    }
    auto result = tools::RunModelBench(*loaded->model, *loaded->backend, a->bench);
    if (!result.ok()) return ReportError(result.status());
    std::string label = std::filesystem::path(a->model.model_path).filename().string();
    if (label.empty()) {
      label = std::filesystem::path(a->model.model_path).parent_path().filename().string();
    }
    if (!a->report.empty()) {
      nlohmann::json j = tools::ModelBenchJson(*result, *loaded->model, label, threads);
      j["device"] = a->model.device;
      Status st = tools::WriteReportFile(a->report, tools::BenchReportHtml({{label, j}}, "bench: " + label));
      if (!st.ok()) return ReportError(st);
    }
    // The kernels the cpu device runs (DH_CPU_TIER / DH_INTEGER_DOT can change them).
    const bool cpu_device = a->model.device.empty() || a->model.device == "cpu";
    const std::string simd = cpu_device ? cpu::DispatchedTargetName() : "";
    const char* dot_env = std::getenv("DH_INTEGER_DOT");
    const bool dot_off = dot_env != nullptr && std::string(dot_env) == "off";
    const std::string int_dot = !cpu_device                          ? ""
                                : dot_off                    ? "off (f32 products)"
                                : cpu::IntegerDotAvailable() ? cpu::IntegerDotName()
                                                             : "none";
    // bf16 weights with 4+ rows of x: vdpbf16ps where the CPU and the dispatched target have it.
    cpu::GemmArgs bf16_call;
    bf16_call.m = 8;
    bf16_call.k = 64;
    bf16_call.wtype = cpu::WType::kBF16;
    const std::string bf16_dot = !cpu_device ? ""
                                 : cpu::UseBf16Dot(bf16_call)
                                     ? "vdpbf16ps (x rounded to bf16)"
                                     : (cpu::Bf16DotAvailable() ? "off (f32 FMA, x exact)"
                                                                : "none (f32 FMA, x exact)");
    if (a->json) {
      nlohmann::json j = tools::ModelBenchJson(*result, *loaded->model, label, threads);
      j["device"] = a->model.device;
      if (cpu_device) {
        j["simd_target"] = simd;
        j["integer_dot_kernel"] = int_dot;
        j["bf16_dot_kernel"] = bf16_dot;
      }
      j["load_seconds"] = loaded->load_seconds;
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("%s", tools::FormatModelBench(*result, *loaded->model, label, threads).c_str());
      if (cpu_device) {
        std::printf("kernels: SIMD target %s, int8/int4 integer dot %s (DH_INTEGER_DOT=%s), "
                    "bf16 GEMM %s (DH_BF16_DOT=%s)\n",
                    simd.c_str(), int_dot.c_str(),
                    std::getenv("DH_INTEGER_DOT") ? std::getenv("DH_INTEGER_DOT") : "auto",
                    bf16_dot.c_str(),
                    std::getenv("DH_BF16_DOT") ? std::getenv("DH_BF16_DOT") : "auto");
      }
    }
    if (const comm::Communicator* comm = loaded->parallel.comm.get(); comm && IsLeadRank(*loaded)) {
      // --tp-size N: what rank 0 spent in collectives over the whole run (warm-ups included).
      const comm::CommStats& cs = comm->Stats();
      std::fprintf(stderr, "collectives (rank 0 of %d): %llu calls, %.1f MiB, %.3f s, %.1f us per "
                   "call\n", comm->Size(), static_cast<unsigned long long>(cs.calls),
                   cs.bytes / 1048576.0, cs.seconds,
                   cs.calls > 0 ? 1e6 * cs.seconds / static_cast<double>(cs.calls) : 0.0);
    }
    return kExitOk;
  };
}

DH_REGISTER_BENCH_COMMAND(kModelBench, "", "Offline pp/tg throughput of a model", SetupModelBench);

}  // namespace
}  // namespace dh::app
