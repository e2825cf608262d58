// pp/tg throughput through Model::Forward with a private paged KV cache: sequence s of a batch owns
// blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq), and every repeat restarts at position
// --depth (0 by default), after the depth tokens prefilled once.
#include "tools/bench_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

#include "base/stats.h"

namespace dh::tools {

namespace {

constexpr int kBlockSize = 16;

double LoadAverage1m() {
  double load[1];
  return getloadavg(load, 1) == 1 ? load[0] : -1.0;
}

struct BatchCache {
  std::unique_ptr<KvStorage> kv;
  int blocks_per_seq = 0;
  std::vector<int32_t> table;  // [batch * blocks_per_seq]

  std::span<const int32_t> SeqTable(int s, int tokens) const {
    const int used = (tokens + kBlockSize - 1) / kBlockSize;
    return std::span<const int32_t>(table).subspan(static_cast<size_t>(s) * blocks_per_seq, used);
  }
};

Result<BatchCache> MakeCache(Model& model, Backend& backend, int batch, int max_tokens) {
  BatchCache c;
  c.blocks_per_seq = (max_tokens + kBlockSize - 1) / kBlockSize;
  const int64_t blocks = static_cast<int64_t>(c.blocks_per_seq) * batch;
  if (blocks > (1 << 30))
    return InvalidArgument("bench: KV cache of {} blocks is too large", blocks);
  DH_ASSIGN_OR_RETURN(
      c.kv, KvStorage::Allocate(backend, model.kv_spec(), static_cast<int>(blocks), kBlockSize));
  c.table.resize(blocks);
  std::iota(c.table.begin(), c.table.end(), 0);
  return c;
}

std::vector<int32_t> RandomTokens(std::mt19937_64& rng, int64_t vocab, int n) {
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = dist(rng);
  return ids;
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One prefill of `prompt` tokens for each of `batch` sequences in a single forward, after the
// `first_pos` tokens each already has in the cache.
Result<double> RunPrefill(Model& model, Backend& backend, BatchCache& cache, std::mt19937_64& rng,
                          int batch, int prompt, int first_pos) {
  Batch b;
  const int64_t vocab = model.config().vocab_size;
  for (int s = 0; s < batch; ++s) {
    const std::vector<int32_t> ids = RandomTokens(rng, vocab, prompt);
    b.AddSequence(ids, first_pos, cache.SeqTable(s, first_pos + prompt), kBlockSize,
                  /*all_logits=*/false);
  }
  std::vector<float> logits;
  const auto start = std::chrono::steady_clock::now();
  DH_RETURN_IF_ERROR(model.Forward(b, *cache.kv, &logits));
  backend.Synchronize();  // a device backend may still be running the step
  return Seconds(start);
}

// `gen` decode steps after `first_pos` cached tokens; each step feeds one token of every sequence.
Result<double> RunDecode(Model& model, Backend& backend, BatchCache& cache, std::mt19937_64& rng,
                         int batch, int gen, int first_pos) {
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> tokens = RandomTokens(rng, vocab, batch * gen);
  std::vector<float> logits;
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < gen; ++step) {
    Batch b;
    for (int s = 0; s < batch; ++s) {
      b.AddSequence(std::span<const int32_t>(&tokens[static_cast<size_t>(step) * batch + s], 1),
                    first_pos + step, cache.SeqTable(s, first_pos + step + 1), kBlockSize,
                    /*all_logits=*/false);
    }
    DH_RETURN_IF_ERROR(model.Forward(b, *cache.kv, &logits));
  }
  backend.Synchronize();
  return Seconds(start);
}

}  // namespace

BenchStat Summarize(std::vector<double> samples) {
  BenchStat s;
  s.samples = std::move(samples);
  if (s.samples.empty()) return s;
  s.mean = std::accumulate(s.samples.begin(), s.samples.end(), 0.0) / s.samples.size();
  if (s.samples.size() > 1) {
    double ss = 0;
    for (double v : s.samples) ss += (v - s.mean) * (v - s.mean);
    s.stddev = std::sqrt(ss / (s.samples.size() - 1));
  }
  return s;
}

double PromptFlops(const Model& model, int64_t tokens) {
  const ModelInfo& info = model.info();
  const ModelConfig& c = model.config();
  if (info.active_parameters_per_token <= 0 || tokens <= 0) return 0;
  // Every prompt token multiplies the active weights but lm_head, which only the last one does.
  const double table = static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size);
  const double per_token =
      2.0 * std::max(0.0, static_cast<double>(info.active_parameters_per_token) - table);
  const bool mla = c.kv_lora_rank > 0;
  const double dk = mla ? static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim)
                        : static_cast<double>(c.head_dim);
  const double dv = mla ? static_cast<double>(c.v_head_dim) : static_cast<double>(c.head_dim);
  const double t = static_cast<double>(tokens);
  const double attention = 2.0 * (dk + dv) * static_cast<double>(c.num_attention_heads) *
                           static_cast<double>(c.num_hidden_layers) * t * (t + 1) / 2;
  return per_token * t + 2.0 * table + attention;
}

Result<ModelBenchResult> RunModelBench(Model& model, Backend& backend, const ModelBenchOptions& o) {
  if (o.prompt < 0 || o.gen < 0 || o.depth < 0) {
    return InvalidArgument("bench: --prompt, --gen and --depth must be >= 0 (got {}, {} and {})",
                           o.prompt, o.gen, o.depth);
  }
  if (o.repeat < 1) return InvalidArgument("bench: --repeat: expected >= 1, got {}", o.repeat);
  if (o.warmup < 0) return InvalidArgument("bench: --warmup: expected >= 0, got {}", o.warmup);
  if (o.batches.empty()) return InvalidArgument("bench: --batch: expected at least one size");
  const int64_t max_pos = model.config().max_position_embeddings;
  const int64_t longest = static_cast<int64_t>(o.depth) + std::max(o.prompt, o.gen);
  if (longest > max_pos) {
    return OutOfRange("bench: {} tokens per sequence exceed the model's context of {}", longest,
                      max_pos);
  }
  ModelBenchResult result;
  result.bandwidth_gbs = o.bandwidth_gbs;
  result.bandwidth_median_gbs = o.bandwidth_median_gbs;
  result.peak_gflops = o.peak_gflops;
  result.bf16_peak_gflops = o.bf16_peak_gflops;
  result.active_weight_bytes_per_token = model.info().active_weight_bytes_per_token;
  for (int batch : o.batches) {
    if (batch < 1 || batch > 4096) {
      return InvalidArgument("bench: --batch: expected sizes in [1, 4096], got {}", batch);
    }
  }
  std::mt19937_64 rng(o.seed);
  struct Test {
    const char* kind;
    int tokens;
  };
  const Test tests[] = {{"pp", o.prompt}, {"tg", o.gen}};
  // "pp512", "tg32 @ d4096": a row's test, and its ratios'.
  auto test_name = [&](const Test& t) {
    return o.depth > 0 ? fmt::format("{}{} @ d{}", t.kind, t.tokens, o.depth)
                       : fmt::format("{}{}", t.kind, t.tokens);
  };
  // A cache for `batch` sequences, with the context every timed run starts from (the runs only
  // write after it).
  auto make_cache = [&](int batch) -> Result<BatchCache> {
    DH_ASSIGN_OR_RETURN(BatchCache cache, MakeCache(model, backend, batch,
                                                    o.depth + std::max({o.prompt, o.gen, 1})));
    if (o.depth > 0) {
      DH_RETURN_IF_ERROR(RunPrefill(model, backend, cache, rng, batch, o.depth, 0).status());
    }
    return cache;
  };
  // One run of test t at `batch`, in tokens/s aggregated over the batch.
  auto run = [&](const Test& t, int batch, BatchCache& cache) -> Result<double> {
    DH_ASSIGN_OR_RETURN(double s, t.kind[0] == 'p' ? RunPrefill(model, backend, cache, rng, batch,
                                                                t.tokens, o.depth)
                                                   : RunDecode(model, backend, cache, rng, batch,
                                                               t.tokens, o.depth));
    return static_cast<double>(t.tokens) * batch / std::max(s, 1e-9);
  };
  auto add_row = [&](const Test& t, int batch, std::vector<double> tps) {
    const bool pp = t.kind[0] == 'p';
    ModelBenchRow row;
    row.test = test_name(t);
    row.depth = o.depth;
    row.batch = batch;
    row.tokens_per_seq = t.tokens;
    row.tokens_per_s = Summarize(std::move(tps));
    row.load_avg_1m = LoadAverage1m();
    if (pp && o.depth == 0) {  // PromptFlops counts attention from position 0
      row.gflops = PromptFlops(model, t.tokens) * row.tokens_per_s.mean / t.tokens / 1e9;
      if (o.peak_gflops > 0) row.peak_fraction = row.gflops / o.peak_gflops;
      if (o.bf16_peak_gflops > 0) row.bf16_peak_fraction = row.gflops / o.bf16_peak_gflops;
    } else if (o.bandwidth_gbs > 0) {
      row.bandwidth_fraction = static_cast<double>(result.active_weight_bytes_per_token) *
                               row.tokens_per_s.mean / batch / 1e9 / o.bandwidth_gbs;
    }
    if (!pp && batch == 1) {
      result.tg_weight_gbs =
          static_cast<double>(result.active_weight_bytes_per_token) * row.tokens_per_s.mean / 1e9;
      if (o.bandwidth_gbs > 0)
        result.tg_bandwidth_fraction = result.tg_weight_gbs / o.bandwidth_gbs;
    }
    result.rows.push_back(std::move(row));
  };
  if (!o.interleave) {
    for (int batch : o.batches) {
      DH_ASSIGN_OR_RETURN(BatchCache cache, make_cache(batch));
      for (const Test& t : tests) {
        if (t.tokens == 0) continue;
        std::vector<double> tps;
        for (int r = -o.warmup; r < o.repeat; ++r) {
          if (r == 0 && o.before_timed) o.before_timed();
          DH_ASSIGN_OR_RETURN(double v, run(t, batch, cache));
          if (r >= 0) tps.push_back(v);
        }
        add_row(t, batch, std::move(tps));
      }
    }
    return result;
  }
  // Interleaved: every batch's cache first, then each test round by round over the batches.
  const size_t nb = o.batches.size();
  std::vector<BatchCache> caches;
  for (int batch : o.batches) {
    DH_ASSIGN_OR_RETURN(BatchCache cache, make_cache(batch));
    caches.push_back(std::move(cache));
  }
  std::vector<std::vector<double>> tps[2];  // [test][batch index][round]
  for (int ti = 0; ti < 2; ++ti) {
    const Test& t = tests[ti];
    tps[ti].assign(nb, {});
    if (t.tokens == 0) continue;
    for (int r = -o.warmup; r < o.repeat; ++r) {
      if (r == 0 && o.before_timed) o.before_timed();
      for (size_t bi = 0; bi < nb; ++bi) {
        DH_ASSIGN_OR_RETURN(double v, run(t, o.batches[bi], caches[bi]));
        if (r >= 0) tps[ti][bi].push_back(v);
      }
    }
  }
  for (size_t bi = 0; bi < nb; ++bi) {
    for (int ti = 0; ti < 2; ++ti) {
      if (tests[ti].tokens != 0) add_row(tests[ti], o.batches[bi], tps[ti][bi]);
    }
  }
  const size_t base = static_cast<size_t>(
      std::min_element(o.batches.begin(), o.batches.end()) - o.batches.begin());
  for (int ti = 0; ti < 2; ++ti) {
    if (tests[ti].tokens == 0) continue;
    for (size_t bi = 0; bi < nb; ++bi) {
      if (o.batches[bi] == o.batches[base]) continue;
      BatchRatio ratio;
      ratio.test = test_name(tests[ti]);
      ratio.batch = o.batches[bi];
      ratio.base = o.batches[base];
      for (int r = 0; r < o.repeat; ++r) {
        ratio.rounds.push_back(tps[ti][bi][r] / std::max(tps[ti][base][r], 1e-12));
      }
      ratio.median = Median(ratio.rounds);
      result.ratios.push_back(std::move(ratio));
    }
  }
  return result;
}

std::string FormatModelBench(const ModelBenchResult& r, const Model& model,
                             const std::string& label, int threads) {
  const ModelInfo& info = model.info();
  std::string out;
  const std::string params = info.num_parameters >= 1'000'000'000
                                 ? fmt::format("{:.2f} B", info.num_parameters / 1e9)
                                 : fmt::format("{:.2f} M", info.num_parameters / 1e6);
  out += "| model | arch | params | weights GiB | threads | test | batch | t/s | GFLOP/s | "
         "% peak | % bf16 peak | % read bw | load 1m |\n";
  out += "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
         "|\n";
  auto percent = [](double f) { return f >= 0 ? fmt::format("{:.1f}", 100.0 * f) : "-"; };
  for (const ModelBenchRow& row : r.rows) {
    const std::string gflops = row.gflops >= 0 ? fmt::format("{:.1f}", row.gflops) : "-";
    out += fmt::format(
        "| {} | {} | {} | {:.2f} | {} | {} | {} | {:.2f} ± {:.2f} | {} | {} | {} | {} | {:.1f} "
        "|\n",
        label, info.architecture, params, info.weight_bytes / (1024.0 * 1024.0 * 1024.0), threads,
        row.test, row.batch, row.tokens_per_s.mean, row.tokens_per_s.stddev, gflops,
        percent(row.peak_fraction), percent(row.bf16_peak_fraction),
        percent(row.bandwidth_fraction), row.load_avg_1m);
  }
  out += fmt::format("\nactive weight bytes per token: {:.1f} MB\n",
                     r.active_weight_bytes_per_token / 1e6);
  out += fmt::format("kv cache: --kv-cache-dtype {}, {} bytes per token\n",
                     KvCacheDtypeName(model.kv_spec().dtype), model.kv_spec().BytesPerToken());
  for (const BatchRatio& q : r.ratios) {
    std::string rounds;
    for (double v : q.rounds) rounds += fmt::format(" {:.2f}", v);
    out += fmt::format("{}: batch {} / batch {} = {:.2f}x tokens/s (median of {} interleaved "
                       "rounds:{})\n",
                       q.test, q.batch, q.base, q.median, q.rounds.size(), rounds);
  }
  if (r.bandwidth_gbs > 0) {
    out += fmt::format("measured read bandwidth ({} threads): {:.2f} GB/s", threads,
                       r.bandwidth_gbs);
    if (r.bandwidth_median_gbs > 0) {
      out += fmt::format(" (best run; median run {:.2f} GB/s)", r.bandwidth_median_gbs);
    }
    out += "\n";
  }
  if (r.peak_gflops > 0) {
    out += fmt::format("measured f32 FMA peak ({} threads): {:.1f} GFLOP/s\n", threads,
                       r.peak_gflops);
  }
  if (r.bf16_peak_gflops > 0) {
    out += fmt::format("measured bf16 dot peak, vdpbf16ps ({} threads): {:.1f} GFLOP/s\n",
                       threads, r.bf16_peak_gflops);
  }
  if (r.tg_weight_gbs > 0) {
    out += fmt::format("tg at batch 1 reads weights at {:.2f} GB/s", r.tg_weight_gbs);
    if (r.tg_bandwidth_fraction >= 0) {
      out += fmt::format(" = {:.1f}% of the measured bandwidth", 100.0 * r.tg_bandwidth_fraction);
    }
    if (r.bandwidth_median_gbs > 0) {
      out += fmt::format(" ({:.1f}% of the median run)",
                         100.0 * r.tg_weight_gbs / r.bandwidth_median_gbs);
    }
    out += "\n";
  }
  return out;
}

nlohmann::json ModelBenchJson(const ModelBenchResult& r, const Model& model,
                              const std::string& label, int threads) {
  const ModelInfo& info = model.info();
  nlohmann::json rows = nlohmann::json::array();
  for (const ModelBenchRow& row : r.rows) {
    rows.push_back({{"test", row.test},
                    {"batch", row.batch},
                    {"tokens_per_seq", row.tokens_per_seq},
                    {"depth", row.depth},
                    {"tokens_per_s_mean", row.tokens_per_s.mean},
                    {"tokens_per_s_stddev", row.tokens_per_s.stddev},
                    {"tokens_per_s_samples", row.tokens_per_s.samples},
                    {"load_avg_1m", row.load_avg_1m},
                    {"gflops", row.gflops >= 0 ? nlohmann::json(row.gflops) : nullptr},
                    {"peak_fraction",
                     row.peak_fraction >= 0 ? nlohmann::json(row.peak_fraction) : nullptr},
                    {"bf16_peak_fraction", row.bf16_peak_fraction >= 0
                                               ? nlohmann::json(row.bf16_peak_fraction)
                                               : nullptr},
                    {"bandwidth_fraction", row.bandwidth_fraction >= 0
                                               ? nlohmann::json(row.bandwidth_fraction)
                                               : nullptr}});
  }
  nlohmann::json j = {{"model", label},
                      {"architecture", info.architecture},
                      {"parameters", info.num_parameters},
                      {"weight_bytes", info.weight_bytes},
                      {"active_weight_bytes_per_token", r.active_weight_bytes_per_token},
                      {"threads", threads},
                      {"kv_cache_dtype", std::string(KvCacheDtypeName(model.kv_spec().dtype))},
                      {"kv_bytes_per_token", model.kv_spec().BytesPerToken()},
                      {"results", rows}};
  nlohmann::json ratios = nlohmann::json::array();
  for (const BatchRatio& q : r.ratios) {
    ratios.push_back({{"test", q.test},
                      {"batch", q.batch},
                      {"base_batch", q.base},
                      {"rounds", q.rounds},
                      {"median", q.median}});
  }
  j["batch_ratios"] = ratios;
  j["fma_peak_gflops"] = r.peak_gflops > 0 ? nlohmann::json(r.peak_gflops) : nullptr;
  j["bf16_peak_gflops"] = r.bf16_peak_gflops > 0 ? nlohmann::json(r.bf16_peak_gflops) : nullptr;
  j["read_bandwidth_gbs"] = r.bandwidth_gbs > 0 ? nlohmann::json(r.bandwidth_gbs) : nullptr;
  j["read_bandwidth_median_gbs"] =
      r.bandwidth_median_gbs > 0 ? nlohmann::json(r.bandwidth_median_gbs) : nullptr;
  j["tg_weight_read_gbs"] = r.tg_weight_gbs > 0 ? nlohmann::json(r.tg_weight_gbs) : nullptr;
  j["tg_bandwidth_fraction"] =
      r.tg_bandwidth_fraction >= 0 ? nlohmann::json(r.tg_bandwidth_fraction) : nullptr;
  return j;
}

}  // namespace dh::tools
