// The decoder skeleton (model/layers/decoder.h) with stand-in attention and FFN blocks: the
// order it calls them in, the pre-norm residual wiring checked against a host computation, the
// tied lm_head fallback, and the active-weights figures from the blocks' InactivePerToken and
// the embedding table.
#include "model/layers/decoder.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/reference/reference_backend.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/sequence_runner.h"
#include "weights/weight_loader.h"

namespace dh {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kVocab = 7, kHidden = 4, kLayers = 2;
constexpr double kEps = 1e-6;

// Deterministic small values, different per tensor.
std::vector<float> Values(int64_t n, float seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(seed * 1.7f + static_cast<float>(i) * 0.9f);
  return v;
}

std::vector<double> RmsNormHost(const std::vector<double>& x, const std::vector<float>& w) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + kEps);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * r * w[i];
  return out;
}

// Stand-in blocks computing on the host (the reference backend's memory is host memory), each
// logging "attn<l>" / "ffn<l>" when called.
class FakeAttention final : public AttentionBlock {
 public:
  FakeAttention(int64_t layer, std::vector<std::string>* log) : layer_(layer), log_(log) {}
  Tensor Forward(Backend&, Arena& a, const StepInputs&, const RopeParams&, KvStorage&, int layer,
                 const Tensor& h) const override {
    EXPECT_EQ(layer, layer_);
    log_->push_back("attn" + std::to_string(layer));
    Tensor out = a.Alloc(DType::kF32, {h.dim(0), h.dim(1)});
    for (int64_t i = 0; i < h.numel(); ++i) {
      out.as<float>()[i] = Apply(h.as<const float>()[i], layer_);
    }
    return out;
  }
  static double Apply(double v, int64_t layer) { return 2.0 * v + 0.1 * (layer + 1); }

 private:
  int64_t layer_;
  std::vector<std::string>* log_;
};

class FakeFfn final : public FfnBlock {
 public:
  FakeFfn(int64_t layer, std::vector<std::string>* log) : layer_(layer), log_(log) {}
  Tensor Forward(Backend&, Arena& a, const Tensor& h) const override {
    log_->push_back("ffn" + std::to_string(layer_));
    Tensor out = a.Alloc(DType::kF32, {h.dim(0), h.dim(1)});
    for (int64_t i = 0; i < h.numel(); ++i) out.as<float>()[i] = Apply(h.as<const float>()[i]);
    return out;
  }
  Inactive InactivePerToken() const override { return {8, 2}; }
  static double Apply(double v) { return -0.5 * v * v + 0.25; }

 private:
  int64_t layer_;
  std::vector<std::string>* log_;
};

class DecoderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "dh_decoder_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    config_.architecture = "TestDecoder";
    config_.vocab_size = kVocab;
    config_.hidden_size = kHidden;
    config_.num_hidden_layers = kLayers;
    config_.num_attention_heads = 1;
    config_.num_key_value_heads = 1;
    config_.head_dim = kHidden;
    config_.max_position_embeddings = 64;
    config_.rms_norm_eps = kEps;
    float seed = 1;
    auto add = [&](const std::string& name, std::initializer_list<int64_t> dims) {
      int64_t n = 1;
      for (int64_t d : dims) n *= d;
      values_[name] = Values(n, seed++);
      shapes_[name] = dims;
    };
    add("model.embed_tokens.weight", {kVocab, kHidden});
    for (int64_t l = 0; l < kLayers; ++l) {
      add(fmt::format("model.layers.{}.input_layernorm.weight", l), {kHidden});
      add(fmt::format("model.layers.{}.post_attention_layernorm.weight", l), {kHidden});
    }
    add("model.norm.weight", {kHidden});
    add("lm_head.weight", {kVocab, kHidden});
  }
  void TearDown() override { fs::remove_all(dir_); }

  void WriteCheckpoint(bool with_lm_head) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (auto& [name, v] : values_) {
      if (name == "lm_head.weight" && !with_lm_head) continue;
      tensors.push_back({name, Tensor::FromDims(v.data(), DType::kF32, shapes_[name])});
    }
    ASSERT_TRUE(WriteSafetensors(dir_ + "/model.safetensors", tensors).ok());
  }

  Result<std::unique_ptr<Model>> Load(const Checkpoint& ckpt) {
    loader_ = std::make_unique<WeightLoader>(ckpt, config_, backend_, LoadOptions{});
    const KvCacheSpec kv{static_cast<int>(kLayers), 1, 2, 1, 2, DType::kF32};
    return Decoder::Load(config_, *loader_, backend_, kv, RopeSpec{2, RopeStyle::kHalf},
                         [&](WeightLoader&, int64_t l, const std::string& prefix,
                             DecoderLayer* layer) -> Status {
                           EXPECT_EQ(prefix, fmt::format("model.layers.{}", l));
                           layer->attn = std::make_unique<FakeAttention>(l, &log_);
                           layer->ffn = std::make_unique<FakeFfn>(l, &log_);
                           return Status::Ok();
                         });
  }

  // The skeleton's maths on the host, in double: logits [ids.size(), vocab].
  std::vector<double> Expected(const std::vector<int32_t>& ids, const std::string& lm_head) {
    std::vector<double> logits;
    for (int32_t id : ids) {
      std::vector<double> res(kHidden), x(kHidden, 0.0);
      const std::vector<float>& embed = values_["model.embed_tokens.weight"];
      for (int64_t i = 0; i < kHidden; ++i) res[i] = embed[id * kHidden + i];
      for (int64_t l = 0; l < kLayers; ++l) {
        const std::string p = fmt::format("model.layers.{}.", l);
        for (int64_t i = 0; i < kHidden; ++i) res[i] += x[i];
        auto h = RmsNormHost(res, values_[p + "input_layernorm.weight"]);
        for (int64_t i = 0; i < kHidden; ++i) res[i] += FakeAttention::Apply(h[i], l);
        h = RmsNormHost(res, values_[p + "post_attention_layernorm.weight"]);
        for (int64_t i = 0; i < kHidden; ++i) x[i] = FakeFfn::Apply(h[i]);
      }
      for (int64_t i = 0; i < kHidden; ++i) res[i] += x[i];
      const auto out = RmsNormHost(res, values_["model.norm.weight"]);
      const std::vector<float>& w = values_[lm_head];
      for (int64_t v = 0; v < kVocab; ++v) {
        double acc = 0;
        for (int64_t i = 0; i < kHidden; ++i) acc += out[i] * w[v * kHidden + i];
        logits.push_back(acc);
      }
    }
    return logits;
  }

  void ExpectLogits(Model& model, const std::string& lm_head) {
    const std::vector<int32_t> ids = {3, 0, 6, 3};
    auto runner = SequenceRunner::Create(model, backend_, 8);
    ASSERT_TRUE(runner.ok()) << runner.status().message();
    log_.clear();
    auto got = (*runner)->Feed(ids, /*all_logits=*/true);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(log_, (std::vector<std::string>{"attn0", "ffn0", "attn1", "ffn1"}));
    const std::vector<double> want = Expected(ids, lm_head);
    ASSERT_EQ(got->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR((*got)[i], want[i], 1e-5 * std::max(1.0, std::fabs(want[i]))) << "logit " << i;
    }
  }

  std::string dir_;
  ModelConfig config_;
  std::map<std::string, std::vector<float>> values_;
  std::map<std::string, std::vector<int64_t>> shapes_;
  ReferenceBackend backend_{BackendOptions{}};
  std::unique_ptr<WeightLoader> loader_;
  std::vector<std::string> log_;
};

TEST_F(DecoderTest, ForwardWiresNormsBlocksAndResidualInOrder) {
  WriteCheckpoint(/*with_lm_head=*/true);
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  auto model = Load(*ckpt);
  ASSERT_TRUE(model.ok()) << model.status().message();
  EXPECT_EQ((*model)->info().architecture, "TestDecoder");
  // Every tensor is f32: embed + lm_head + 2 norms per layer + the final norm.
  const uint64_t weights = (2 * kVocab * kHidden + (2 * kLayers + 1) * kHidden) * 4;
  EXPECT_EQ((*model)->info().weight_bytes, weights);
  // A decode step reads no more of the embedding table than its tokens' rows.
  EXPECT_EQ((*model)->info().active_weight_bytes_per_token,
            weights - 8 * kLayers - kVocab * kHidden * 4);
  EXPECT_EQ((*model)->info().active_parameters_per_token,
            (*model)->info().num_parameters - 2 * kLayers - kVocab * kHidden);
  EXPECT_EQ((*model)->info().kv_bytes_per_token, static_cast<size_t>(kLayers * 4 * 4));
  ExpectLogits(**model, "lm_head.weight");
}

TEST_F(DecoderTest, TiedEmbeddingServesAsLmHeadWhenAbsent) {
  config_.tie_word_embeddings = true;
  WriteCheckpoint(/*with_lm_head=*/false);
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  auto model = Load(*ckpt);
  ASSERT_TRUE(model.ok()) << model.status().message();
  ExpectLogits(**model, "model.embed_tokens.weight");
  // lm_head is the table: a decode step reads all of it.
  const uint64_t weights = (kVocab * kHidden + (2 * kLayers + 1) * kHidden) * 4;
  EXPECT_EQ((*model)->info().active_weight_bytes_per_token, weights - 8 * kLayers);
}

TEST_F(DecoderTest, MissingLmHeadWithoutTyingIsAnError) {
  WriteCheckpoint(/*with_lm_head=*/false);
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  auto model = Load(*ckpt);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("lm_head.weight"), std::string::npos)
      << model.status().message();
}

}  // namespace
}  // namespace dh
