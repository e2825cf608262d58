// `deepharness bench --model-path DIR ...`: the offline llama-bench-style benchmark (pp prefill
// and tg decode tokens/s over repeats, at several batch sizes) plus the machine's measured read
// bandwidth and the fraction of it decoding achieves. Runs when `bench` is given no benchmark name.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "apps/bench_commands.h"
#include "apps/model_options.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/membw.h"
#include "backend/cpu/quant_vnni.h"
#include "base/memory_info.h"
#include "base/thread_pool.h"
#include "engine/engine.h"
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

// A non-owning view of a loaded model, so that engines can run it one after another.
class BorrowedModel : public Model {
 public:
  explicit BorrowedModel(Model& m) : m_(m) {}
  const ModelConfig& config() const override { return m_.config(); }
  KvCacheSpec kv_spec() const override { return m_.kv_spec(); }
  const ModelInfo& info() const override { return m_.info(); }
  Status Forward(const Batch& b, KvStorage& kv, std::vector<float>* logits) override {
    return m_.Forward(b, kv, logits);
  }
  bool has_mtp() const override { return m_.has_mtp(); }
  std::span<const float> last_hidden() const override { return m_.last_hidden(); }
  Status ForwardMtp(const Batch& b, KvStorage& kv, std::span<const float> hidden,
                    std::vector<float>* logits) override {
    return m_.ForwardMtp(b, kv, hidden, logits);
  }

 private:
  Model& m_;
};

struct SpecDecodeRun {
  int k = 0;
  double decode_seconds = 0;  // first to last token, timed repeats together
  int64_t tokens = 0;         // decoded after the first, timed repeats together
  int64_t steps = 0;          // decode forward steps (verifications and plain steps)
  int64_t drafts = 0, drafted = 0, accepted = 0;
  std::vector<int64_t> accepted_per_pos;
};

// Batch-1 greedy decode of `gen` tokens after `prompt` through the engine with k drafts per
// step (0: none), warmup + repeat requests, prefix caching off (every request prefills).
Result<SpecDecodeRun> RunSpecDecode(Model& model, Backend& backend,
                                    const std::vector<int32_t>& prompt, int gen, int k,
                                    int warmup, int repeat) {
  EngineOptions eo;
  eo.max_num_seqs = 1;
  eo.max_model_len = static_cast<int>(prompt.size()) + gen + 1;
  eo.num_kv_blocks = eo.max_model_len / 16 + 2;
  eo.enable_prefix_caching = false;
  eo.num_speculative_tokens = k;
  Engine engine(eo, std::make_unique<BorrowedModel>(model), backend, nullptr);
  DH_RETURN_IF_ERROR(engine.Start());
  SpecDecodeRun run;
  run.k = k;
  run.accepted_per_pos.assign(static_cast<size_t>(k), 0);
  for (int i = 0; i < warmup + repeat; ++i) {
    const EngineStats before = engine.GetStats();
    Request r;
    r.prompt_token_ids = prompt;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = gen;
    r.sampling.ignore_eos = true;
    DH_ASSIGN_OR_RETURN(auto handle, engine.Submit(std::move(r)));
    const RequestOutput out = handle->WaitFinished();
    if (!out.error.ok()) return out.error;
    if (i < warmup) continue;
    const EngineStats after = engine.GetStats();
    const int64_t tokens = static_cast<int64_t>(out.token_ids.size()) - 1;
    const int64_t accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
    run.decode_seconds +=
        std::chrono::duration<double>(out.timing.last_token - out.timing.first_token).count();
    run.tokens += tokens;
    run.steps += tokens - accepted;  // a verification emits accepted + 1 tokens, a plain step 1
    run.drafts += after.spec_num_drafts - before.spec_num_drafts;
    run.drafted += after.spec_draft_tokens - before.spec_draft_tokens;
    run.accepted += accepted;
    for (int j = 0; j < k; ++j) {
      run.accepted_per_pos[j] += after.spec_accepted_per_pos[j] - before.spec_accepted_per_pos[j];
    }
  }
  return run;
}

// `bench --speculative mtp --num-speculative-tokens K`: K' = 0 .. K in turn.
int RunSpeculativeBench(LoadedModel& loaded, const tools::ModelBenchOptions& o, int max_k,
                        bool json) {
  if (o.gen < 2) return ReportError(InvalidArgument("--gen: expected >= 2 with --speculative"));
  Model& model = *loaded.model;
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> prompt(static_cast<size_t>(std::max(o.prompt, 1)));
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % model.config().vocab_size);
  std::vector<SpecDecodeRun> runs;
  for (int k = 0; k <= max_k; ++k) {
    auto run = RunSpecDecode(model, *loaded.backend, prompt, o.gen, k, o.warmup, o.repeat);
    if (!run.ok()) return ReportError(run.status());
    runs.push_back(std::move(*run));
  }
  const SpecDecodeRun& base = runs[0];
  const double base_step =
      base.decode_seconds / static_cast<double>(std::max<int64_t>(base.steps, 1));
  const double base_tps = static_cast<double>(base.tokens) / base.decode_seconds;
  nlohmann::json rows = nlohmann::json::array();
  std::string text = fmt::format(
      "speculative decoding (mtp), batch 1, greedy: prompt {} random tokens, {} generated, "
      "{} timed repeats\n{:>2} {:>10} {:>8} {:>9} {:>10} {:>11} {:>11}  {}\n",
      prompt.size(), o.gen, o.repeat, "K", "decode t/s", "speed-up", "step ms", "tok/step",
      "acceptance", "break-even", "acceptance per position");
  for (const SpecDecodeRun& r : runs) {
    const double tps = static_cast<double>(r.tokens) / r.decode_seconds;
    const double step = r.decode_seconds / static_cast<double>(std::max<int64_t>(r.steps, 1));
    const double per_step =
        static_cast<double>(r.tokens) / static_cast<double>(std::max<int64_t>(r.steps, 1));
    const double acceptance = r.drafted > 0 ? static_cast<double>(r.accepted) / r.drafted : 0.0;
    // Accepted drafts per verification that would make a step as fast as plain decoding, as a
    // fraction of the K drafts.
    const double break_even = r.k > 0 ? (step / base_step - 1.0) / r.k : 0.0;
    std::vector<double> per_pos;
    std::string per_pos_text;
    for (int64_t a : r.accepted_per_pos) {
      per_pos.push_back(r.drafts > 0 ? static_cast<double>(a) / r.drafts : 0.0);
      per_pos_text += fmt::format(" {:.1f}%", 100.0 * per_pos.back());
    }
    text += fmt::format("{:>2} {:>10.1f} {:>7.2f}x {:>9.3f} {:>10.2f} {:>10.1f}% {:>10.1f}% {}\n",
                        r.k, tps, tps / base_tps, 1e3 * step, per_step, 100.0 * acceptance,
                        100.0 * break_even, r.k > 0 ? per_pos_text : std::string(" -"));
    rows.push_back({{"k", r.k},
                    {"decode_tokens_per_second", tps},
                    {"speedup", tps / base_tps},
                    {"step_seconds", step},
                    {"tokens_per_step", per_step},
                    {"drafted", r.drafted},
                    {"accepted", r.accepted},
                    {"acceptance", acceptance},
                    {"acceptance_per_position", per_pos},
                    {"break_even_acceptance", break_even}});
  }
  if (json) {
    std::printf("%s\n", nlohmann::json{{"speculative", rows}}.dump(2).c_str());
  } else {
    std::printf("%s", text.c_str());
  }
  return kExitOk;
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
  AddSpeculativeOptions(sub, &a->model);
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
  sub->add_flag("--interleave", a->bench.interleave,
                "Run each test's repeats round by round across the --batch sizes (every batch's "
                "KV cache held at once) and print each batch's tokens/s over the smallest "
                "batch's, paired by round, with their median");
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
    if (SpeculativeTokens(a->model) > 0) {  // batch-1 decode through the engine, K = 0 .. K
      return RunSpeculativeBench(*loaded, a->bench, SpeculativeTokens(a->model), a->json);
    }
    const int threads = loaded->parallel.threads > 0 ? loaded->parallel.threads : AvailableCpus();
    if (a->membw_mib > 0) {
      ThreadPool pool(threads);
      const ReadBandwidth bw = MeasureReadBandwidth(pool, static_cast<size_t>(a->membw_mib) << 20);
      a->bench.bandwidth_gbs = bw.best_gbs;
      a->bench.bandwidth_median_gbs = bw.median_gbs;
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
    // bf16 weights with 4+ rows of x, FP8 weights at every row count: vdpbf16ps where the CPU and
    // the dispatched target have it.
    cpu::GemmArgs bf16_call;
    bf16_call.m = 8;
    bf16_call.k = 64;
    bf16_call.wtype = cpu::WType::kBF16;
    const std::string bf16_dot = !cpu_device ? ""
                                 : cpu::UseBf16Dot(bf16_call)
                                     ? "vdpbf16ps (x rounded to bf16)"
                                     : (cpu::Bf16DotAvailable() ? "off (f32 FMA, x exact)"
                                                                : "none (f32 FMA, x exact)");
    // Resident memory after the runs, and its share in 2 MiB pages (decode reads weights faster
    // from them; a nearly full machine may grant few).
    const std::optional<ResidentMemory> resident = ReadResidentMemory();
    if (a->json) {
      nlohmann::json j = tools::ModelBenchJson(*result, *loaded->model, label, threads);
      j["device"] = a->model.device;
      if (cpu_device) {
        j["simd_target"] = simd;
        j["integer_dot_kernel"] = int_dot;
        j["bf16_dot_kernel"] = bf16_dot;
      }
      if (resident) {
        j["resident_bytes"] = resident->rss;
        j["anonymous_bytes"] = resident->anonymous;
        j["anonymous_huge_page_bytes"] = resident->anon_huge;
      }
      j["load_seconds"] = loaded->load_seconds;
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("%s", tools::FormatModelBench(*result, *loaded->model, label, threads).c_str());
      if (cpu_device) {
        std::printf("kernels: SIMD target %s, int8/int4 integer dot %s (DH_INTEGER_DOT=%s), "
                    "bf16 and FP8 weights %s (DH_BF16_DOT=%s)\n",
                    simd.c_str(), int_dot.c_str(),
                    std::getenv("DH_INTEGER_DOT") ? std::getenv("DH_INTEGER_DOT") : "auto",
                    bf16_dot.c_str(),
                    std::getenv("DH_BF16_DOT") ? std::getenv("DH_BF16_DOT") : "auto");
      }
      if (resident) {
        std::printf("memory: %s resident, %s anonymous of which %s in 2 MiB pages\n",
                    FormatBytes(resident->rss).c_str(), FormatBytes(resident->anonymous).c_str(),
                    FormatBytes(resident->anon_huge).c_str());
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
