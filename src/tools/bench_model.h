// Offline llama-bench-style model benchmark behind `deepharness bench`: prefill (pp) and decode
// (tg) throughput of random tokens through Model::Forward, at one or several batch sizes, with
// mean and stddev over repeats and the achieved fraction of the machine's read bandwidth.
#pragma once

#include <cstdint>
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
  std::vector<int> batches = {1};
  int repeat = 3;
  int warmup = 1;  // untimed runs of each test before the timed ones
  uint64_t seed = 0;
  // Read bandwidth of the machine in GB/s (measured by the caller); <= 0: unknown.
  double bandwidth_gbs = 0;
};

struct BenchStat {
  double mean = 0;
  double stddev = 0;  // sample stddev (0 for one sample)
  std::vector<double> samples;
};

BenchStat Summarize(std::vector<double> samples);

struct ModelBenchRow {
  std::string test;  // "pp512", "tg128"
  int batch = 1;
  int tokens_per_seq = 0;
  BenchStat tokens_per_s;   // aggregated over the batch
  double load_avg_1m = -1;  // getloadavg right after the row ran (-1: unavailable)
};

struct ModelBenchResult {
  std::vector<ModelBenchRow> rows;
  double bandwidth_gbs = 0;
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
