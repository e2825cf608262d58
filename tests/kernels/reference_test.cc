// Checks the oracle itself: ReferenceBackend against values computed by hand for small cases of
// RoPE (both pairings, offset, attention factor, strided heads), every MatMul weight format,
// every router method and paged attention over two sequences with a strided value cache.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "backend/reference/reference_backend.h"

namespace dh {
namespace {

constexpr float kTol = 1e-5f;

Tensor T(std::vector<float>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::kF32, dims);
}
Tensor I(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::kI32, dims);
}

class ReferenceTest : public ::testing::Test {
 protected:
  ReferenceBackend backend_{BackendOptions{}};
};

TEST_F(ReferenceTest, RopeHalfPairsIAndIPlusHalf) {
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<float> inv_freq = {1.0f, 0.5f};
  std::vector<int32_t> pos = {1};
  RopeParams p;
  p.style = RopeStyle::kHalf;
  p.rot_dim = 4;
  p.inv_freq = T(inv_freq, {2});
  p.attention_factor = 2.0f;
  backend_.Rope(T(x, {1, 1, 4}), I(pos, {1}), p);
  const float c0 = 2 * std::cos(1.0f), s0 = 2 * std::sin(1.0f);
  const float c1 = 2 * std::cos(0.5f), s1 = 2 * std::sin(0.5f);
  EXPECT_NEAR(x[0], 1 * c0 - 3 * s0, kTol);
  EXPECT_NEAR(x[2], 3 * c0 + 1 * s0, kTol);
  EXPECT_NEAR(x[1], 2 * c1 - 4 * s1, kTol);
  EXPECT_NEAR(x[3], 4 * c1 + 2 * s1, kTol);
}

TEST_F(ReferenceTest, RopeInterleavedWithOffsetOnStridedHeads) {
  // Two tokens of one head of 6 values, rotating elements 2..5 in pairs (2,3) and (4,5); the
  // view skips every other head of a [2, 2, 6] buffer.
  std::vector<float> buf(2 * 2 * 6);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i + 1);
  const std::vector<float> orig = buf;
  Tensor x(buf.data(), DType::kF32, {2, 1, 6});
  x.stride = {12, 12, 1, 0};
  std::vector<float> inv_freq = {1.0f, 0.25f};
  std::vector<int32_t> pos = {3, 0};
  RopeParams p;
  p.style = RopeStyle::kInterleaved;
  p.offset = 2;
  p.rot_dim = 4;
  p.inv_freq = T(inv_freq, {2});
  backend_.Rope(x, I(pos, {2}), p);
  // Token 0 (position 3).
  const float c0 = std::cos(3.0f), s0 = std::sin(3.0f), c1 = std::cos(0.75f), s1 = std::sin(0.75f);
  EXPECT_EQ(buf[0], 1);
  EXPECT_EQ(buf[1], 2);
  EXPECT_NEAR(buf[2], 3 * c0 - 4 * s0, kTol);
  EXPECT_NEAR(buf[3], 4 * c0 + 3 * s0, kTol);
  EXPECT_NEAR(buf[4], 5 * c1 - 6 * s1, kTol);
  EXPECT_NEAR(buf[5], 6 * c1 + 5 * s1, kTol);
  // The skipped head and token 1 at position 0 are unchanged.
  for (int i = 6; i < 24; ++i) EXPECT_NEAR(buf[i], orig[i], kTol) << i;
}

TEST_F(ReferenceTest, MatMulQuantizedFormats) {
  std::vector<float> x = {1, 1, 1, 1};
  std::vector<float> out(1);
  // int4: nibbles 1,2 | 3,4 (low nibble first), groups of 2 with scales .5, 2 and zero points
  // 2, 0 (one byte, low nibble first): value = (q - z) * scale.
  std::vector<uint8_t> q4 = {0x21, 0x43}, zeros = {0x02};
  std::vector<float> scales = {0.5f, 2.0f};
  Weight w4;
  w4.format = WeightFormat::kInt4;
  w4.rows = 1;
  w4.cols = 4;
  w4.group_size = 2;
  w4.data = Tensor(q4.data(), DType::kU8, {1, 2});
  w4.scales = T(scales, {1, 2});
  w4.zeros = Tensor(zeros.data(), DType::kU8, {1, 1});
  backend_.MatMul(T(x, {1, 4}), w4, Tensor(), T(out, {1, 1}));
  EXPECT_NEAR(out[0], -0.5f + 0.0f + 6.0f + 8.0f, kTol);

  // int8: q = -3, 1, 2, 5 with group scales .5 and 2, plus a bias.
  std::vector<int8_t> q8 = {-3, 1, 2, 5};
  std::vector<float> bias = {0.25f};
  Weight w8;
  w8.format = WeightFormat::kInt8;
  w8.rows = 1;
  w8.cols = 4;
  w8.group_size = 2;
  w8.data = Tensor(q8.data(), DType::kI8, {1, 4});
  w8.scales = T(scales, {1, 2});
  backend_.MatMul(T(x, {1, 4}), w8, T(bias, {1}), T(out, {1, 1}));
  EXPECT_NEAR(out[0], -1.5f + 0.5f + 4.0f + 10.0f + 0.25f, kTol);

  // fp8 blocks of 2x2 over a 3x3 matrix of ones: partial edge blocks keep their own scale.
  std::vector<uint8_t> q8f(9, F32ToF8E4M3(1.0f));
  std::vector<float> block_scales = {1, 2, 3, 4};
  Weight wf;
  wf.format = WeightFormat::kFp8Block;
  wf.rows = 3;
  wf.cols = 3;
  wf.block_rows = 2;
  wf.block_cols = 2;
  wf.data = Tensor(q8f.data(), DType::kF8E4M3, {3, 3});
  wf.scales = T(block_scales, {2, 2});
  std::vector<float> x3 = {1, 1, 1}, out3(3);
  backend_.MatMul(T(x3, {1, 3}), wf, Tensor(), T(out3, {1, 3}));
  EXPECT_NEAR(out3[0], 4, kTol);
  EXPECT_NEAR(out3[1], 4, kTol);
  EXPECT_NEAR(out3[2], 10, kTol);
}

TEST_F(ReferenceTest, MoeGateGreedySoftmaxNormalised) {
  std::vector<float> logits = {0, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  MoeGateParams p;
  p.top_k = 2;
  p.norm_topk_prob = true;
  p.routed_scaling_factor = 2.0f;
  backend_.MoeGate(T(logits, {1, 4}), Tensor(), p, I(ids, {1, 2}), T(w, {1, 2}));
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 2}));
  EXPECT_NEAR(w[0], 2 * 4.0f / 7, kTol);
  EXPECT_NEAR(w[1], 2 * 3.0f / 7, kTol);
  p.norm_topk_prob = false;
  backend_.MoeGate(T(logits, {1, 4}), Tensor(), p, I(ids, {1, 2}), T(w, {1, 2}));
  EXPECT_NEAR(w[0], 2 * 0.4f, kTol);
  EXPECT_NEAR(w[1], 2 * 0.3f, kTol);
}

TEST_F(ReferenceTest, MoeGateGroupLimitedGreedyKeepsTheGroupWithTheBestMax) {
  // Softmax scores 1, 5, 3, 4 (/13); groups {0, 1} (max 5) and {2, 3} (max 4). Plain greedy
  // would pick 1 and 3; keeping one group picks 1 and 0.
  std::vector<float> logits = {0, std::log(5.0f), std::log(3.0f), std::log(4.0f)};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  MoeGateParams p;
  p.method = TopkMethod::kGroupLimitedGreedy;
  p.top_k = 2;
  p.n_group = 2;
  p.topk_group = 1;
  p.routed_scaling_factor = 3.0f;
  backend_.MoeGate(T(logits, {1, 4}), Tensor(), p, I(ids, {1, 2}), T(w, {1, 2}));
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 0}));
  EXPECT_NEAR(w[0], 3 * 5.0f / 13, kTol);
  EXPECT_NEAR(w[1], 3 * 1.0f / 13, kTol);
}

TEST_F(ReferenceTest, MoeGateNoauxTcRanksGroupsByTopTwoChoicesAndWeighsWithoutBias) {
  const float l3 = std::log(3.0f);  // sigmoid(l3) = .75, sigmoid(-l3) = .25
  std::vector<float> logits = {l3, -l3, 0, 0, l3, l3, -l3, -l3};
  // scores: .75 .25 .5 .5 .75 .75 .25 .25
  std::vector<float> bias = {0.45f, 0, 0.3f, 0.25f, 0, 0, 1.1f, 0.1f};
  // choice: 1.2 .25 | .8 .75 | .75 .75 | 1.35 .35 -> group sums 1.45, 1.55, 1.5, 1.7: keep
  // groups 3 and 1; expert 0 (1.2) is masked; top-2 = 6, 2.
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  MoeGateParams p;
  p.scoring = ScoringFunc::kSigmoid;
  p.method = TopkMethod::kNoauxTc;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 2;
  p.norm_topk_prob = true;
  p.routed_scaling_factor = 2.5f;
  backend_.MoeGate(T(logits, {1, 8}), T(bias, {8}), p, I(ids, {1, 2}), T(w, {1, 2}));
  EXPECT_EQ(ids, (std::vector<int32_t>{6, 2}));
  EXPECT_NEAR(w[0], 2.5f * 0.25f / 0.75f, kTol);
  EXPECT_NEAR(w[1], 2.5f * 0.5f / 0.75f, kTol);
}

TEST_F(ReferenceTest, AttentionTwoSequencesPagedCausalWithStridedValueCache) {
  // One kv head with Dk = 3; the value cache is the first 2 columns of the key cache (as MLA's
  // latent cache). Block size 2, 8 slots. Scale 1.
  const float l3 = std::log(3.0f), l2 = std::log(2.0f);
  std::vector<float> kc(8 * 3, 0.0f);
  auto key = [&](int slot, std::vector<float> k) {
    for (int i = 0; i < 3; ++i) kc[slot * 3 + i] = k[i];
  };
  // Sequence 0: block 3 (slots 6, 7), length 2, one query row (position 1).
  key(6, {1, 0, 0});
  key(7, {0, 2, l3});
  // Sequence 1: blocks 0, 2 (slots 0, 1, 4), length 3, two query rows (positions 1 and 2).
  key(0, {2, 0, 0});
  key(1, {0, 4, 0});
  key(4, {0, 0, 1});
  Tensor k_cache(kc.data(), DType::kF32, {8, 1, 3});
  Tensor v_cache = k_cache;
  v_cache.shape[2] = 2;

  std::vector<float> q = {
      0, 0, 1, /**/ 0, 0, 0,       // row 0: seq 0, heads 0 and 1
      0, 0, 0, /**/ l3 / 2, 0, 0,  // row 1: seq 1 position 1
      0, 0, l2, /**/ 0, 0, 0,      // row 2: seq 1 position 2
  };
  std::vector<float> out(3 * 2 * 2);
  std::vector<int32_t> qs = {0, 1, 3}, lens = {2, 3}, tables = {3, 0, 0, 2};
  AttentionMeta meta;
  meta.num_seqs = 2;
  meta.num_tokens = 3;
  meta.block_size = 2;
  meta.max_blocks_per_seq = 2;
  meta.max_seq_len = 3;
  meta.query_start = I(qs, {3});
  meta.seq_lens = I(lens, {2});
  meta.block_tables = I(tables, {2, 2});
  backend_.Attention(T(q, {3, 2, 3}), k_cache, v_cache, meta, 1.0f, T(out, {3, 2, 2}));
  const std::vector<float> expected = {
      0.25f, 1.5f, /**/ 0.5f, 1.0f,          // scores 0, ln3 | uniform
      1.0f, 2.0f, /**/ 1.5f, 1.0f,           // uniform over 2 (not 3) | scores ln3, 0
      0.5f, 1.0f, /**/ 2.0f / 3, 4.0f / 3,  // scores 0, 0, ln2 | uniform over 3
  };
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expected[i], kTol) << i;

  // The same through the host spans.
  meta.host_query_start = qs;
  meta.host_seq_lens = lens;
  meta.host_block_tables = tables;
  std::vector<float> out2(out.size());
  backend_.Attention(T(q, {3, 2, 3}), k_cache, v_cache, meta, 1.0f, T(out2, {3, 2, 2}));
  EXPECT_EQ(out, out2);
}

TEST_F(ReferenceTest, RowOpsAndCopy) {
  std::vector<float> x = {3, 4}, w = {1, 2}, out(2);
  backend_.RmsNorm(T(x, {1, 2}), T(w, {2}), 0.0f, T(out, {1, 2}));
  const float inv = 1.0f / std::sqrt(12.5f);
  EXPECT_NEAR(out[0], 3 * inv, kTol);
  EXPECT_NEAR(out[1], 8 * inv, kTol);

  std::vector<float> g = {0, 1}, u = {5, 2};
  backend_.SiluMul(T(g, {1, 2}), T(u, {1, 2}), T(out, {1, 2}));
  EXPECT_NEAR(out[0], 0, kTol);
  EXPECT_NEAR(out[1], 2 / (1 + std::exp(-1.0f)), kTol);

  // Broadcast copy of a row into 3 rows, then gather two of them back.
  std::vector<float> row = {7, 8}, grid(6);
  Tensor src = T(row, {3, 2});
  src.stride[0] = 0;
  backend_.Copy(src, T(grid, {3, 2}));
  EXPECT_EQ(grid, (std::vector<float>{7, 8, 7, 8, 7, 8}));
  std::vector<int32_t> ids = {1};
  std::vector<float> table = {1, 2, 3, 4}, emb(2);
  backend_.Embedding(Weight::Dense(T(table, {2, 2})), I(ids, {1}), T(emb, {1, 2}));
  EXPECT_EQ(emb, (std::vector<float>{3, 4}));
}

}  // namespace
}  // namespace dh
