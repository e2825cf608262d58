// Bad input through the real binary: malformed checkpoints, configs and ids generated here with
// plain file writes must make `info` and `logits` exit with code 2 and print exactly one line on
// stderr that names the file, tensor or field at fault — never crash.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal
  int signal = 0;
  std::string err;
};

// Runs DH_BINARY with `args`, stdout discarded, stderr captured.
RunResult RunBinary(const std::vector<std::string>& args) {
  int pipe_fds[2];
  EXPECT_EQ(::pipe(pipe_fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipe_fds[1], 2);
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    std::vector<char*> argv;
    std::string bin = DH_BINARY;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(pipe_fds[1]);
  RunResult r;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0) r.err.append(buf, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// A tensor to store: name, safetensors dtype, shape, raw bytes.
struct RawTensor {
  std::string name;
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  std::string bytes;
};

RawTensor F32Tensor(const std::string& name, std::vector<int64_t> shape, uint32_t seed) {
  RawTensor t{name, "F32", std::move(shape), ""};
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.bytes.resize(static_cast<size_t>(n) * 4);
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    float v = (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 0.2f;
    std::memcpy(&t.bytes[static_cast<size_t>(i) * 4], &v, 4);
  }
  return t;
}

// The header JSON text for `tensors` stored back to back.
std::string HeaderFor(const std::vector<RawTensor>& tensors) {
  json h = json::object();
  uint64_t off = 0;
  for (const auto& t : tensors) {
    h[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  return h.dump();
}

std::string SafetensorsBytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string SafetensorsBytes(const std::vector<RawTensor>& tensors) {
  std::string data;
  for (const auto& t : tensors) data += t.bytes;
  return SafetensorsBytes(HeaderFor(tensors), data);
}

// The tiny Llama of the brief: vocab 32, hidden 8, 1 layer, 2 heads, 1 kv head (head_dim 4),
// intermediate 16, untied embeddings, F32.
json TinyConfig() {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"vocab_size", 32},
              {"hidden_size", 8},
              {"intermediate_size", 16},
              {"num_hidden_layers", 1},
              {"num_attention_heads", 2},
              {"num_key_value_heads", 1},
              {"max_position_embeddings", 64},
              {"rms_norm_eps", 1e-5},
              {"rope_theta", 10000.0},
              {"tie_word_embeddings", false},
              {"torch_dtype", "float32"},
              {"bos_token_id", 1},
              {"eos_token_id", 2}};
}

std::vector<RawTensor> TinyTensors() {
  const std::string l = "model.layers.0.";
  uint32_t seed = 1;
  return {
      F32Tensor("model.embed_tokens.weight", {32, 8}, seed++),
      F32Tensor(l + "input_layernorm.weight", {8}, seed++),
      F32Tensor(l + "self_attn.q_proj.weight", {8, 8}, seed++),
      F32Tensor(l + "self_attn.k_proj.weight", {4, 8}, seed++),
      F32Tensor(l + "self_attn.v_proj.weight", {4, 8}, seed++),
      F32Tensor(l + "self_attn.o_proj.weight", {8, 8}, seed++),
      F32Tensor(l + "post_attention_layernorm.weight", {8}, seed++),
      F32Tensor(l + "mlp.gate_proj.weight", {16, 8}, seed++),
      F32Tensor(l + "mlp.up_proj.weight", {16, 8}, seed++),
      F32Tensor(l + "mlp.down_proj.weight", {8, 16}, seed++),
      F32Tensor("model.norm.weight", {8}, seed++),
      F32Tensor("lm_head.weight", {32, 8}, seed++),
  };
}

RawTensor* FindTensor(std::vector<RawTensor>& ts, const std::string& name) {
  for (auto& t : ts) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// A model directory: config.json plus model.safetensors, with `edit` applied.
struct ModelFiles {
  json config = TinyConfig();
  std::vector<RawTensor> tensors = TinyTensors();
  // Extra files (name -> bytes) written after the others, replacing them when names match.
  std::vector<std::pair<std::string, std::string>> files;
  bool write_config = true;
  bool write_model = true;
};

struct BadCase {
  std::string name;
  std::function<void(ModelFiles&)> edit;
  std::vector<std::string> expected;  // substrings of the error line
};
// gtest prints the parameter in failure messages and --gtest_list_tests; the name says it all.
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

// A temporary model directory and the checks every bad-input case shares.
class ModelDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "dh_bad_input_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  void Write(const ModelFiles& m) {
    if (m.write_config) WriteFile(dir_ + "/config.json", m.config.dump(2));
    if (m.write_model) WriteFile(dir_ + "/model.safetensors", SafetensorsBytes(m.tensors));
    for (const auto& [name, bytes] : m.files) WriteFile(dir_ + "/" + name, bytes);
  }
  void ExpectBadInput(const std::vector<std::string>& args,
                      const std::vector<std::string>& expected) {
    SCOPED_TRACE(::testing::PrintToString(args));
    RunResult r = RunBinary(args);
    EXPECT_EQ(r.signal, 0) << "crashed: " << r.err;
    EXPECT_EQ(r.exit_code, 2) << r.err;
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.back(), '\n');
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "expected one line, got:\n" << r.err;
    for (const auto& e : expected) EXPECT_THAT(r.err, HasSubstr(e));
  }
  std::string dir_;
};

class BadInputTest : public ModelDirTest, public ::testing::WithParamInterface<BadCase> {};

TEST_P(BadInputTest, InfoAndLogitsRefuse) {
  ModelFiles m;
  GetParam().edit(m);
  Write(m);
  ExpectBadInput({"info", "--model-path", dir_}, GetParam().expected);
  ExpectBadInput(
      {"logits", "--model-path", dir_, "--token-ids", "1,2", "--output", dir_ + "/out.npy"},
      GetParam().expected);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out.npy"));
}

std::string ValidModelBytes() { return SafetensorsBytes(TinyTensors()); }

const std::vector<BadCase>& Cases() {
  static const std::vector<BadCase> cases = {
      {"TruncatedFile",
       [](ModelFiles& m) {
         std::string b = ValidModelBytes();
         m.files.emplace_back("model.safetensors", b.substr(0, b.size() - 100));
       },
       {"model.safetensors"}},
      {"FileShorterThanLength",
       [](ModelFiles& m) { m.files.emplace_back("model.safetensors", "abc"); },
       {"model.safetensors"}},
      {"HeaderLengthBeyondFile",
       [](ModelFiles& m) {
         std::string b = ValidModelBytes();
         b[5] = 1;  // declared header length now ~2^40
         m.files.emplace_back("model.safetensors", b);
       },
       {"model.safetensors", "header length"}},
      {"HeaderNotJson",
       [](ModelFiles& m) {
         m.files.emplace_back("model.safetensors", SafetensorsBytes("{\"a\": nope}", ""));
       },
       {"model.safetensors", "JSON"}},
      {"OffsetsBeyondData",
       [](ModelFiles& m) {
         auto ts = TinyTensors();
         json h = json::parse(HeaderFor(ts));
         h["lm_head.weight"]["data_offsets"][1] = 1u << 30;
         std::string data;
         for (const auto& t : ts) data += t.bytes;
         m.files.emplace_back("model.safetensors", SafetensorsBytes(h.dump(), data));
       },
       {"model.safetensors", "lm_head.weight"}},
      {"OverlappingTensors",
       [](ModelFiles& m) {
         auto ts = TinyTensors();
         json h = json::parse(HeaderFor(ts));
         // model.norm.weight (32 bytes) re-pointed at the first 32 bytes of the file's data.
         h["model.norm.weight"]["data_offsets"] = {0, 32};
         std::string data;
         for (const auto& t : ts) data += t.bytes;
         m.files.emplace_back("model.safetensors", SafetensorsBytes(h.dump(), data));
       },
       {"model.safetensors", "overlap"}},
      {"LengthNotShapeTimesDType",
       [](ModelFiles& m) {
         auto ts = TinyTensors();
         json h = json::parse(HeaderFor(ts));
         h["model.norm.weight"]["shape"] = {9};
         std::string data;
         for (const auto& t : ts) data += t.bytes;
         m.files.emplace_back("model.safetensors", SafetensorsBytes(h.dump(), data));
       },
       {"model.safetensors", "model.norm.weight"}},
      {"UnknownDType",
       [](ModelFiles& m) { FindTensor(m.tensors, "model.norm.weight")->dtype = "F4"; },
       {"model.safetensors", "model.norm.weight", "F4"}},
      {"WrongShapeForConfig",
       [](ModelFiles& m) {
         *FindTensor(m.tensors, "model.embed_tokens.weight") =
             F32Tensor("model.embed_tokens.weight", {31, 8}, 99);
       },
       {"model.embed_tokens.weight", "[32, 8]"}},
      {"MissingTensor",
       [](ModelFiles& m) {
         auto& ts = m.tensors;
         std::erase_if(ts, [](const RawTensor& t) {
           return t.name == "model.layers.0.mlp.down_proj.weight";
         });
       },
       {"model.layers.0.mlp.down_proj.weight"}},
      {"WrongDTypeForWeight",
       [](ModelFiles& m) {
         FindTensor(m.tensors, "model.layers.0.self_attn.q_proj.weight")->dtype = "I32";
       },
       {"model.layers.0.self_attn.q_proj.weight", "I32"}},
      {"ZeroHeads",
       [](ModelFiles& m) { m.config["num_attention_heads"] = 0; },
       {"config.json", "num_attention_heads"}},
      {"NonDivisibleHeads",
       [](ModelFiles& m) {
         m.config["num_attention_heads"] = 3;
         m.config["num_key_value_heads"] = 3;
       },
       {"config.json", "num_attention_heads"}},
      {"NonDivisibleKvHeads",
       [](ModelFiles& m) { m.config["num_key_value_heads"] = 3; },
       {"config.json", "num_key_value_heads"}},
      {"StringForInt",
       [](ModelFiles& m) { m.config["hidden_size"] = "8"; },
       {"config.json", "hidden_size"}},
      {"MissingField",
       [](ModelFiles& m) { m.config.erase("vocab_size"); },
       {"config.json", "vocab_size"}},
      {"HugeLayerCount",
       [](ModelFiles& m) { m.config["num_hidden_layers"] = 1000000000; },
       {"config.json", "num_hidden_layers"}},
      {"ConfigNotJson",
       [](ModelFiles& m) { m.files.emplace_back("config.json", "{\"vocab_size\": 32,"); },
       {"config.json"}},
      {"MissingConfig", [](ModelFiles& m) { m.write_config = false; }, {"config.json"}},
      {"ShardEscapesDirectory",
       [](ModelFiles& m) {
         m.write_model = false;
         m.files.emplace_back("model-00001-of-00001.safetensors", ValidModelBytes());
         json wm = json::object();
         for (const auto& t : TinyTensors()) wm[t.name] = "model-00001-of-00001.safetensors";
         wm["lm_head.weight"] = "../model-00001-of-00001.safetensors";
         m.files.emplace_back("model.safetensors.index.json", json{{"weight_map", wm}}.dump());
       },
       {"model.safetensors.index.json", "../model-00001-of-00001.safetensors"}},
      {"ShardIsAbsolutePath",
       [](ModelFiles& m) {
         m.write_model = false;
         json wm = json::object();
         for (const auto& t : TinyTensors()) wm[t.name] = "/etc/passwd";
         m.files.emplace_back("model.safetensors.index.json", json{{"weight_map", wm}}.dump());
       },
       {"model.safetensors.index.json", "/etc/passwd"}},
      {"IndexNamesMissingShard",
       [](ModelFiles& m) {
         m.write_model = false;
         json wm = json::object();
         for (const auto& t : TinyTensors()) wm[t.name] = "model-00001-of-00002.safetensors";
         m.files.emplace_back("model.safetensors.index.json", json{{"weight_map", wm}}.dump());
       },
       {"model.safetensors.index.json", "model-00001-of-00002.safetensors"}},
      {"NoWeights", [](ModelFiles& m) { m.write_model = false; }, {"safetensors"}},
  };
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, BadInputTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return info.param.name;
                         });

class TokenIdsTest : public ModelDirTest {};

TEST_F(TokenIdsTest, ValidTinyModelWorks) {
  Write(ModelFiles{});
  RunResult info = RunBinary({"info", "--model-path", dir_});
  EXPECT_EQ(info.exit_code, 0) << info.err;
  RunResult logits = RunBinary(
      {"logits", "--model-path", dir_, "--token-ids", "1,2", "--output", dir_ + "/out.npy"});
  ASSERT_EQ(logits.exit_code, 0) << logits.err;
  std::ifstream in(dir_ + "/out.npy", std::ios::binary);
  std::string magic(6, '\0');
  in.read(magic.data(), 6);
  EXPECT_EQ(magic, "\x93NUMPY");
}

TEST_F(TokenIdsTest, RefusesBadIds) {
  Write(ModelFiles{});
  for (const char* ids : {"1,x", "1,,2", "", "-1", "99999999999999999999", "32"}) {
    ExpectBadInput(
        {"logits", "--model-path", dir_, "--token-ids", ids, "--output", dir_ + "/out.npy"},
        {"token"});
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out.npy"));
}

// --kv-cache-dtype is parsed before anything is loaded or allocated, in the planner too.
TEST_F(TokenIdsTest, RefusesBadKvCacheDtype) {
  Write(ModelFiles{});
  for (const char* dtype : {"fp16", "", "FP8", "int4"}) {
    const std::vector<std::string> expected = {"--kv-cache-dtype", "auto, bf16, fp8 or int8"};
    ExpectBadInput({"info", "--model-path", dir_, "--kv-cache-dtype", dtype}, expected);
    ExpectBadInput({"info", "--plan", "--model-path", dir_, "--kv-cache-dtype", dtype}, expected);
    ExpectBadInput({"logits", "--model-path", dir_, "--token-ids", "1,2", "--output",
                    dir_ + "/out.npy", "--kv-cache-dtype", dtype},
                   expected);
    ExpectBadInput({"serve", "--model-path", dir_, "--port", "0", "--kv-cache-dtype", dtype},
                   expected);
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out.npy"));
}

TEST_F(TokenIdsTest, RefusesMissingModelDirectory) {
  ExpectBadInput({"info", "--model-path", dir_ + "/does-not-exist"}, {"does-not-exist"});
}

}  // namespace
