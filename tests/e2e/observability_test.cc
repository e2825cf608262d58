// Tensor dumps, diff-dumps and --trace-out through the real binary on the embedded model
// (docs/observability.md): cpu vs reference taps agree, bf16 vs int4 weights differ first at
// the first quantized projection, filters and step ranges, the trace parses and holds engine
// steps, layers, ops and request phases, --trace-max-events bounds it, bad input exits 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "e2e/server_fixture.h"

namespace dh::e2e {
namespace {

namespace fs = std::filesystem;

const std::string kModel = std::string(DH_SOURCE_DIR) + "/models/shakespeare-v3";

class Observability : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dh_obs_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `generate` of 3 tokens after a 5-token prompt (3 steps: the prefill and 2 decodes), dumped.
  CliRun Dump(const std::string& name, const std::string& extra, const std::string& env = "") {
    return RunCli("generate -q --threads 1 --model-path " + kModel +
                      " --token-ids 0,17,42,99,7 --max-tokens 3 --ignore-eos --no-compile-cache "
                      "--dump-tensors " +
                      (dir_ / name).string() + " " + extra,
                  env);
  }
  std::vector<std::vector<std::string>> Manifest(const std::string& name) {
    std::ifstream f(dir_ / name / "manifest.tsv");
    std::vector<std::vector<std::string>> rows;
    std::string line;
    while (std::getline(f, line)) {
      std::vector<std::string> cols;
      std::stringstream ss(line);
      std::string c;
      while (std::getline(ss, c, '\t')) cols.push_back(c);
      rows.push_back(cols);
    }
    return rows;
  }
  CliRun DiffDumps(const std::string& a, const std::string& b, const std::string& extra = "") {
    return RunCli("diff-dumps " + (dir_ / a).string() + " " + (dir_ / b).string() + " " + extra);
  }

  fs::path dir_;
};

TEST_F(Observability, DumpNamesFollowHuggingFaceModules) {
  ASSERT_EQ(Dump("cpu", "").exit_code, 0);
  std::set<std::string> step0;
  int steps = 0;
  for (const auto& row : Manifest("cpu")) {
    if (row[0] == "step") continue;
    ASSERT_EQ(row.size(), 5u);
    EXPECT_TRUE(fs::exists(dir_ / "cpu" / row[4])) << row[4];
    if (row[0] == "0") step0.insert(row[1]);
    steps = std::max(steps, std::stoi(row[0]) + 1);
  }
  EXPECT_EQ(steps, 3);
  for (const char* tap : {"model.embed_tokens",
                          "model.layers.0.input_layernorm",
                          "model.layers.0.self_attn.q_a_proj",
                          "model.layers.0.self_attn.q_a_layernorm",
                          "model.layers.0.self_attn.q_b_proj",
                          "model.layers.0.self_attn.kv_a_proj_with_mqa",
                          "model.layers.0.self_attn.kv_a_layernorm",
                          "model.layers.0.self_attn.query_states",
                          "model.layers.0.self_attn.k_pe",
                          "model.layers.0.self_attn.kv_b_proj",
                          "model.layers.0.self_attn.o_proj",
                          "model.layers.0.self_attn",
                          "model.layers.0.post_attention_layernorm",
                          "model.layers.0.mlp.gate_proj",
                          "model.layers.0.mlp",
                          "model.layers.1.mlp.gate",
                          "model.layers.1.mlp.gate.topk_idx",
                          "model.layers.1.mlp.gate.topk_weight",
                          "model.layers.1.mlp.shared_experts.down_proj",
                          "model.layers.2.mlp",
                          "model.norm",
                          "logits"}) {
    EXPECT_TRUE(step0.count(tap)) << tap;
  }
}

TEST_F(Observability, CpuAndReferenceTapsMatch) {
  // Exact x on the CPU (DH_BF16_DOT=off: bf16 weights do not round x to bf16 there), as in the
  // reference: the same products, summed in another order.
  ASSERT_EQ(Dump("cpu", "", "DH_BF16_DOT=off").exit_code, 0);
  ASSERT_EQ(Dump("ref", "--device reference").exit_code, 0);
  const CliRun r = DiffDumps("cpu", "ref", "--rtol 1e-4 --atol 1e-5");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("taps in both dumps match"), std::string::npos) << r.out;
}

// Llama-style attention taps q and k after the rotary embedding (HF's query_states and
// key_states), and they agree between the CPU and the reference backends.
TEST_F(Observability, LlamaTapsRotatedQueryAndKey) {
  const std::string model = (dir_ / "tiny-llama").string();
  ASSERT_EQ(RunCli("make-model --preset tiny-llama --output " + model).exit_code, 0);
  for (const std::string dev : {"cpu", "reference"}) {
    const CliRun r = RunCli("generate -q --threads 1 --model-path " + model +
                                " --token-ids 1,2,3,4,5 --max-tokens 2 --ignore-eos "
                                "--no-compile-cache --device " + dev + " --dump-tensors " +
                                (dir_ / dev).string(),
                            "DH_BF16_DOT=off");  // exact x on the CPU, as in the reference
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  std::set<std::string> taps;
  for (const auto& row : Manifest("cpu")) taps.insert(row[1]);
  EXPECT_TRUE(taps.count("model.layers.1.self_attn.query_states"));
  EXPECT_TRUE(taps.count("model.layers.1.self_attn.key_states"));
  const CliRun d = DiffDumps("cpu", "reference", "--rtol 1e-4 --atol 1e-5");
  EXPECT_EQ(d.exit_code, 0) << d.out;
}

TEST_F(Observability, Bf16AndInt4DifferFirstAtTheFirstQuantizedProjection) {
  ASSERT_EQ(Dump("bf16", "--dtype bfloat16").exit_code, 0);
  ASSERT_EQ(Dump("int4", "--quant int4").exit_code, 0);
  const CliRun r = DiffDumps("bf16", "int4", "--rtol 1e-3 --atol 1e-4");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  // The embedding and the first norm are not quantized; q_a_proj is the first int4 matrix.
  EXPECT_NE(r.out.find("first differing tap: step 0 model.layers.0.self_attn.q_a_proj"),
            std::string::npos)
      << r.out;
}

TEST_F(Observability, FilterAndStepsChooseWhatIsWritten) {
  ASSERT_EQ(Dump("f", "--dump-filter 'logits,model.layers.1.mlp.gate*' --dump-steps 1-2").exit_code,
            0);
  std::set<std::string> seen;
  for (const auto& row : Manifest("f")) {
    if (row[0] != "step") seen.insert(row[0] + " " + row[1]);
  }
  EXPECT_EQ(seen,
            (std::set<std::string>{
                "1 logits", "1 model.layers.1.mlp.gate", "1 model.layers.1.mlp.gate.topk_idx",
                "1 model.layers.1.mlp.gate.topk_weight", "2 logits", "2 model.layers.1.mlp.gate",
                "2 model.layers.1.mlp.gate.topk_idx", "2 model.layers.1.mlp.gate.topk_weight"}));
}

TEST_F(Observability, TraceHoldsStepsLayersOpsAndRequestPhases) {
  const fs::path trace = dir_ / "t.json";
  const CliRun r = RunCli("run -q --threads 1 --model-path " + kModel +
                          " --prompt 'To be' --max-tokens 4 --temperature 0 --no-compile-cache "
                          "--trace-out " +
                          trace.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream f(trace);
  const Json j = Json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  std::set<std::string> names, cats, matmul_kernels;
  bool matmul_has_args = false;
  for (const Json& e : j.at("traceEvents")) {
    names.insert(e.at("name").get<std::string>());
    if (e.contains("cat")) cats.insert(e.at("cat").get<std::string>());
    if (e.at("name") == "MatMul" && e.at("ph") == "X") {
      const Json& a = e.at("args");
      matmul_has_args = a.contains("x") && a.contains("format") &&
                        a.at("flops").get<double>() > 0 && a.at("bytes").get<double>() > 0;
      // The kernel the CPU backend chose, then the Highway target it runs on.
      const std::string kernel = a.value("kernel", "");
      matmul_kernels.insert(kernel.substr(0, kernel.find(' ')));
      EXPECT_NE(kernel.find(' '), std::string::npos) << kernel;
    }
  }
  // Names from CpuBackend::MatMul's table; the prompt (3 rows) and the decode steps (1 row)
  // take the GEMV kernel.
  const std::set<std::string> known = {
      "gemv",         "gemm",           "gemm-tiled",         "gemm-panels",
      "gemm-bf16dot", "gemv-int-dot",   "gemm-int-dot",       "gemv-quant-f32",
      "gemv-fp8",           "gemm-fp8",       "gemv-dequant",       "gemm-dequant",
      "gemv-fp8-bf16dot",   "gemm-fp8-bf16dot", "gemm-panels-fp8-bf16dot",
      "gemm-tiled-dequant", "gemm-panels-dequant", "reference"};
  EXPECT_TRUE(matmul_kernels.count("gemv"));
  for (const std::string& k : matmul_kernels) EXPECT_TRUE(known.count(k)) << "'" << k << "'";
  for (const char* n : {"engine.step", "forward", "embedding", "model.layers.0", "model.layers.2",
                        "attention.mla", "ffn.mlp", "ffn.moe", "head", "MatMul", "Attention",
                        "MoeGate", "MoeExperts", "queued", "prefill", "prefill chunk", "decode"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
  EXPECT_TRUE(cats.count("request"));
  EXPECT_TRUE(matmul_has_args);
  EXPECT_EQ(j.at("otherData").at("dropped_events"), 0);
}

TEST_F(Observability, TraceIsBoundedByMaxEvents) {
  const fs::path trace = dir_ / "t.json";
  const CliRun r = RunCli("generate -q --threads 1 --model-path " + kModel +
                          " --token-ids 0,17,42 --max-tokens 4 --ignore-eos --no-compile-cache "
                          "--trace-out " +
                          trace.string() + " --trace-max-events 40");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream f(trace);
  const Json j = Json::parse(f, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j.at("traceEvents").size(), 41u);  // 40 + the process name
  EXPECT_GT(j.at("otherData").at("dropped_events").get<int>(), 0);
}

// `profile` on the embedded model: both phases, a row per op and kernel, and the decode steps
// run after the prompt's prefill (attention reads the prompt's keys: more bytes than after an
// empty prompt).
TEST_F(Observability, ProfileNamesKernelsAndDecodesAfterThePrompt) {
  auto profile = [](int prompt) {
    const CliRun r = RunCli("profile --json --threads 1 --membw-mib 0 --no-compile-cache "
                            "--model-path " + kModel + " -n 4 -p " + std::to_string(prompt));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return Json::parse(r.out, nullptr, false);
  };
  auto row = [](const Json& phase, const char* table, const std::string& name) {
    for (const Json& r : phase.at(table)) {
      if (r.at("name") == name) return r;
    }
    return Json();
  };
  const Json with_prompt = profile(40), without = profile(0);
  ASSERT_FALSE(with_prompt.is_discarded());
  ASSERT_FALSE(without.is_discarded());
  const Json& phases = with_prompt.at("phases");
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_EQ(phases[0].at("name"), "prefill");
  EXPECT_EQ(phases[1].at("name"), "decode");
  bool gemm = false;
  for (const Json& r : phases[0].at("by_kernel")) {
    const std::string name = r.at("name").get<std::string>();
    gemm = gemm || name.rfind("MatMul gemm-tiled ", 0) == 0 ||
           name.rfind("MatMul gemm-panels ", 0) == 0 || name.rfind("MatMul gemm-bf16dot ", 0) == 0;
  }
  // 40 prompt rows: the tiled GEMM, its packed panels on a 16-register target, or the
  // AVX512-BF16 GEMM for the bf16 weights.
  EXPECT_TRUE(gemm) << phases[0].at("by_kernel").dump();
  const Json decode = row(phases[1], "by_op", "Attention");
  const Json decode_empty = row(without.at("phases")[0], "by_op", "Attention");
  ASSERT_FALSE(decode.is_null());
  ASSERT_FALSE(decode_empty.is_null());
  EXPECT_EQ(decode.at("calls"), decode_empty.at("calls"));
  EXPECT_GT(decode.at("bytes").get<double>(), 5 * decode_empty.at("bytes").get<double>());
}

TEST_F(Observability, PluginRmsNormIsUsedAndMatchesTheBuiltInOp) {
  const std::string plugin = std::string(DH_PLUGIN_DIR) + "/rms_norm_plugin.so";
  ASSERT_EQ(Dump("builtin", "").exit_code, 0);
  const CliRun r = RunCli("generate --threads 1 --model-path " + kModel +
                          " --token-ids 0,17,42,99,7 --max-tokens 3 --ignore-eos "
                          "--no-compile-cache --dump-tensors " +
                          (dir_ / "plugin").string() + " --plugin " + plugin);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Layer 0's input norm and MLA's two latent norms per layer: 7 RmsNorm calls a step, 3 steps.
  EXPECT_NE(r.err.find("plugin: rms_norm from rms_norm_plugin.so: 21 calls"), std::string::npos)
      << r.err;
  // The plugin sums squares in double, the built-in op in f32 lanes: equal to f32 rounding.
  const CliRun d = DiffDumps("builtin", "plugin", "--rtol 1e-5 --atol 1e-6");
  EXPECT_EQ(d.exit_code, 0) << d.out;
}

TEST_F(Observability, BrokenPluginsAreRefusedWithTheReason) {
  const std::string dir = std::string(DH_PLUGIN_DIR) + "/";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"wrong_abi_plugin.so", "plugin ABI version 2, this deepharness expects 1"},
      {"missing_symbol_plugin.so", "missing symbol dh_plugin_register"},
      {"unknown_op_plugin.so", "registers unknown op 'fused_everything'"},
      {"no_such_plugin.so", "cannot load"}};
  for (const auto& [file, reason] : cases) {
    const CliRun r =
        RunCli("generate --model-path " + kModel + " --token-ids 1 --plugin " + dir + file);
    EXPECT_EQ(r.exit_code, 2) << file << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("--plugin " + dir + file + ": " + reason), std::string::npos) << r.err;
  }
}

TEST(OpMetrics, ServeExportsOpTimesAndRoutedTokensPerExpert) {
  ServerProcess server;
  // The fixture serves TestModelDir(): the embedded model when its weights exist.
  ASSERT_TRUE(server.Start({"--op-metrics", "--threads", "1"}))
      << server.log();
  const Json req = {{"model", ServedModel(server)},
                    {"prompt", "To be"},
                    {"max_tokens", 4},
                    {"temperature", 0},
                    {"ignore_eos", true}};
  const HttpResult r = server.PostJson("/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const auto m = server.Metrics();
  EXPECT_GT(m.at("op_seconds_total{op=\"MatMul\"}"), 0);
  EXPECT_GT(m.at("op_calls_total{op=\"MoeExperts\"}"), 0);
  // Every token the MoE layers saw went to top_k = 2 experts: per layer the counts sum to
  // 2 x (prompt tokens + decode steps), the same for layers 1 and 2 (layer 0 is dense).
  const int64_t tokens = r.json()["usage"]["prompt_tokens"].get<int64_t>() + 4 - 1;
  for (int layer : {1, 2}) {
    double sum = 0;
    for (int e = 0; e < 8; ++e) {
      const std::string key = "moe_routed_tokens_total{layer=\"" + std::to_string(layer) +
                              "\",expert=\"" + std::to_string(e) + "\"}";
      ASSERT_TRUE(m.count(key)) << key;
      sum += m.at(key);
    }
    EXPECT_EQ(sum, 2.0 * tokens) << "layer " << layer;
  }
  EXPECT_FALSE(m.count("moe_routed_tokens_total{layer=\"0\",expert=\"0\"}"));
}

TEST_F(Observability, BadInputExitsTwoWithOneLine) {
  for (const std::string& args :
       {"generate --model-path " + kModel + " --token-ids 1 --dump-tensors " +
            (dir_ / "d").string() + " --dump-steps 3-1",
        "generate --model-path " + kModel + " --token-ids 1 --dump-steps 1",
        "generate --model-path " + kModel + " --token-ids 1 --trace-out " +
            (dir_ / "missing" / "t.json").string(),
        "diff-dumps " + (dir_ / "nope").string() + " " + (dir_ / "nope2").string()}) {
    const CliRun r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
  }
}

}  // namespace
}  // namespace dh::e2e
