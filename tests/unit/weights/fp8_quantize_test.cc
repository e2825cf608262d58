// The FP8 (e4m3, 128x128 block scales) quantizer of weights/quantize: exact on values the format
// represents, round-trip error within half an e4m3 step, and the kFp8Block layout the kernels
// read.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tensor/dtype.h"
#include "weights/quantize.h"

namespace dh {
namespace {

QuantSpec Fp8Spec() {
  auto s = ParseQuantSpec("fp8");
  EXPECT_TRUE(s.ok());
  return *s;
}

std::vector<float> Dequantize(QuantizedMatrix& q) {
  Weight w = q.View();
  std::vector<float> out(static_cast<size_t>(q.rows * q.cols));
  for (int64_t r = 0; r < q.rows; ++r) DequantizeRow(w, r, out.data() + r * q.cols);
  return out;
}

TEST(Fp8QuantizeTest, ParsesFp8) {
  const QuantSpec s = Fp8Spec();
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.format, WeightFormat::kFp8Block);
  EXPECT_EQ(s.block_rows, 128);
  EXPECT_EQ(s.block_cols, 128);
  EXPECT_NE(QuantSpecNames().find("fp8"), std::string_view::npos);
}

// Every block holds e4m3 values times a power of two, with +-448 in it so the scale is that
// power: quantization must give back the same values exactly, subnormals included.
TEST(Fp8QuantizeTest, ExactOnRepresentableValues) {
  const int64_t rows = 200, cols = 300;  // partial edge blocks in both directions
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> code(0, 255);
  std::vector<float> x(rows * cols);
  auto block_pow = [](int64_t r, int64_t c) {
    return static_cast<int>((r / 128) * 3 + c / 128) - 4;
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      int v = code(gen);
      if ((v & 0x7f) == 0x7f) v = 0x7e;  // NaN codes -> 448
      x[r * cols + c] = std::ldexp(F8E4M3ToF32(static_cast<uint8_t>(v)), block_pow(r, c));
    }
  }
  for (int64_t r = 0; r < rows; r += 128) {
    for (int64_t c = 0; c < cols; c += 128) x[r * cols + c] = std::ldexp(-448.0f, block_pow(r, c));
  }
  auto q = QuantizeMatrix(x, rows, cols, Fp8Spec(), "exact");
  ASSERT_TRUE(q.ok()) << q.status().message();
  const std::vector<float> back = Dequantize(*q);
  for (int64_t i = 0; i < rows * cols; ++i) {
    ASSERT_EQ(back[i], x[i]) << "row " << i / cols << " col " << i % cols;
  }
  EXPECT_EQ(q->scales[0], std::ldexp(1.0f, -4));
  EXPECT_EQ(q->scales[5], std::ldexp(1.0f, 1));
}

// |x - deq(x)| <= half a step: 2^-4 relative for normal codes, scale * 2^-10 for subnormal ones.
TEST(Fp8QuantizeTest, RoundTripErrorBound) {
  const int64_t rows = 130, cols = 257;
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> x(rows * cols);
  for (auto& v : x) v = dist(gen);
  x[5] = 3.0f;  // an outlier: its block's other values fall into the subnormal range
  auto q = QuantizeMatrix(x, rows, cols, Fp8Spec(), "bound");
  ASSERT_TRUE(q.ok()) << q.status().message();
  ASSERT_EQ(q->scales.size(), 2u * 3u);
  const std::vector<float> back = Dequantize(*q);
  double err2 = 0, sum2 = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float scale = q->scales[(r / 128) * 3 + c / 128];
      const float v = x[r * cols + c], d = back[r * cols + c];
      const float bound =
          std::max(std::fabs(v) * 0.0625f, scale * std::ldexp(1.0f, -10)) * (1 + 1e-5f);
      ASSERT_LE(std::fabs(v - d), bound) << "row " << r << " col " << c << " x " << v;
      err2 += (v - d) * static_cast<double>(v - d);
      sum2 += v * static_cast<double>(v);
    }
  }
  // The block maximum maps to 448 * scale.
  EXPECT_FLOAT_EQ(back[5], 3.0f);
  // Relative RMS error of Gaussian weights: about 2^-4 / sqrt(12) * ~1.3 (measured 0.025).
  EXPECT_LT(std::sqrt(err2 / sum2), 0.04);
}

TEST(Fp8QuantizeTest, LayoutMatchesWeightFormat) {
  std::vector<float> x(3 * 5, 0.0f);
  x[7] = -1.0f;
  auto q = QuantizeMatrix(x, 3, 5, Fp8Spec(), "layout");
  ASSERT_TRUE(q.ok());
  Weight w = q->View();
  EXPECT_EQ(w.format, WeightFormat::kFp8Block);
  EXPECT_EQ(w.data.dtype, DType::kF8E4M3);
  EXPECT_EQ(w.data.dim(0), 3);
  EXPECT_EQ(w.data.dim(1), 5);
  EXPECT_EQ(w.scales.dtype, DType::kF32);
  EXPECT_EQ(w.scales.dim(0), 1);
  EXPECT_EQ(w.scales.dim(1), 1);
  EXPECT_EQ(w.block_rows, 128);
  EXPECT_EQ(w.block_cols, 128);
  EXPECT_FLOAT_EQ(q->scales[0], 1.0f / 448.0f);
  EXPECT_EQ(q->data[7], F32ToF8E4M3(-448.0f));
  EXPECT_EQ(q->data[0], 0);
  EXPECT_EQ(w.nbytes(), 15u + 4u);
  // An all-zero matrix: scale 0, codes 0, dequantizes to 0.
  std::vector<float> zeros(4 * 4, 0.0f);
  auto z = QuantizeMatrix(zeros, 4, 4, Fp8Spec(), "zeros");
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->scales[0], 0.0f);
  for (float v : Dequantize(*z)) EXPECT_EQ(v, 0.0f);
}

TEST(Fp8QuantizeTest, RejectsNonFiniteValues) {
  std::vector<float> x(4 * 4, 1.0f);
  x[6] = INFINITY;
  auto q = QuantizeMatrix(x, 4, 4, Fp8Spec(), "model.layers.0.mlp.up_proj.weight");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(
      q.status().message().find("model.layers.0.mlp.up_proj.weight: value at row 1, column 2"),
      std::string::npos)
      << q.status().message();
}

}  // namespace
}  // namespace dh
