// Offline llama-bench-style model benchmark behind `deepharness bench`: prefill (pp) and decode
// (tg) throughput of random tokens through Model::Forward, at one or several batch sizes and an
// optional context depth, with mean and stddev over repeats and the achieved fraction of the
// machine's read bandwidth.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "model/model.h"

namespace dh::tools {

struct ModelBenchOptions {
  int prompt = 512;  // pp: tokens per sequence in one forward (0: skip)
  int gen = 128;     // tg: tokens per sequence, one forward per token (0: skip)
  // Tokens of every sequence already in the KV cache (prefilled once, untimed) before pp and tg
  // run (llama-bench's -d): attention then reads depth + position keys per token.
  int depth = 0;
  std::vector<int> batches = {1};
  // Each test's repeats round by round across the batch sizes (batch 1, batch 8, batch 1, ...),
  // every batch's KV cache held at once, instead of all of one batch's repeats before the next
  // batch's: the rows' samples are then taken side by side, and BatchRatio pairs them by round.
  bool interleave = false;
  int repeat = 3;
  int warmup = 1;  // untimed runs of each test before the timed ones
  uint64_t seed = 0;
  // Read bandwidth of the machine in GB/s (measured by the caller): the probe's best run, which
  // "% read bw" divides by, and its median run (shown beside it); <= 0: unknown.
  double bandwidth_gbs = 0;
  double bandwidth_median_gbs = 0;
  // f32 FMA peak of the machine in GFLOP/s on the same threads (measured by the caller); <= 0:
  // unknown.
  double peak_gflops = 0;
  // bf16 dot-product peak (vdpbf16ps) in GFLOP/s on the same threads; <= 0: unknown / no such
  // instruction.
  double bf16_peak_gflops = 0;
  // Called right before each test's timed runs (after the depth prefill and the warm-up runs);
  // `profile` resets its op totals there so that only the timed runs count.
  std::function<void()> before_timed;
};

struct BenchStat {
  double mean = 0;
  double stddev = 0;  // sample stddev (0 for one sample)
  std::vector<double> samples;
};

BenchStat Summarize(std::vector<double> samples);

struct ModelBenchRow {
  std::string test;  // "pp512", "tg128", "tg32 @ d4096"
  int depth = 0;
  int batch = 1;
  int tokens_per_seq = 0;
  BenchStat tokens_per_s;   // aggregated over the batch
  double load_avg_1m = -1;  // getloadavg right after the row ran (-1: unavailable)
  // pp rows: achieved GFLOP/s (PromptFlops / time) and its fraction of the FMA peak (< 0: not
  // measured / not a pp row).
  double gflops = -1;
  double peak_fraction = -1;
  double bf16_peak_fraction = -1;  // pp rows: of the bf16 dot peak (< 0: not measured)
  // tg rows: weight bytes read per step (active bytes/token; a step of a batch reads them once
  // for all its sequences) x steps/s / the read bandwidth (< 0: not measured / a pp row).
  double bandwidth_fraction = -1;
};

// Floating-point operations of one pp forward of `tokens` prompt tokens of one sequence:
// 2 x (active parameters per token - the vocab x hidden tables a prompt token does not multiply)
// per token, + 2 x vocab x hidden for the logits of the last token, + the attention products
// (QK^T and PV, causal: T(T+1)/2 query-key pairs per head and layer, head dims as the config
// defines them; MLA counted in its plain, not absorbed, form). Active parameters per token =
// active_weight_bytes_per_token x num_parameters / weight_bytes (exact for a single-dtype model).
double PromptFlops(const Model& model, int64_t tokens);

// With ModelBenchOptions::interleave and several batch sizes: a test's tokens/s at `batch`
// over its tokens/s at `base` (the smallest batch size asked for), one ratio per round (the two
// runs of a round are adjacent in time), and their median (base/stats.h).
struct BatchRatio {
  std::string test;  // the rows' test, e.g. "tg32"
  int batch = 0;
  int base = 0;
  std::vector<double> rounds;
  double median = 0;
};

struct ModelBenchResult {
  std::vector<ModelBenchRow> rows;
  std::vector<BatchRatio> ratios;  // interleaved runs only
  double bandwidth_gbs = 0;
  double bandwidth_median_gbs = 0;
  double peak_gflops = 0;
  double bf16_peak_gflops = 0;
  uint64_t active_weight_bytes_per_token = 0;
  // active bytes/token x tg tokens/s at batch 1 / bandwidth; < 0 when not measured.
  double tg_bandwidth_fraction = -1;
  double tg_weight_gbs = 0;  // active bytes/token x tg tokens/s at batch 1, in GB/s
};

// Runs every test; a row is skipped when its count is 0. The model must be loaded on `backend`.
Result<ModelBenchResult> RunModelBench(Model& model, Backend& backend,
                                       const ModelBenchOptions& options);

// llama-bench-like markdown table and summary lines. `label` names the model.
std::string FormatModelBench(const ModelBenchResult& result, const Model& model,
                             const std::string& label, int threads);
nlohmann::json ModelBenchJson(const ModelBenchResult& result, const Model& model,
                              const std::string& label, int threads);

}  // namespace dh::tools
