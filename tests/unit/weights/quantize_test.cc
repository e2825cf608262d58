// Round-trip bounds and layout of the int8 / int4 quantizers in weights/quantize.
#include "weights/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>
#include <vector>

namespace dh {
namespace {

std::vector<float> RandomValues(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

TEST(QuantizeTest, ParsesNames) {
  auto none = ParseQuantSpec("none");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->enabled);
  auto i8 = ParseQuantSpec("int8");
  ASSERT_TRUE(i8.ok());
  EXPECT_EQ(i8->format, WeightFormat::kInt8);
  EXPECT_EQ(i8->group_size, 32);
  auto row = ParseQuantSpec("int8-row");
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->group_size, 0);
  auto i4 = ParseQuantSpec("int4-g128");
  ASSERT_TRUE(i4.ok());
  EXPECT_EQ(i4->format, WeightFormat::kInt4);
  EXPECT_EQ(i4->group_size, 128);
  auto bad = ParseQuantSpec("int3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("int4-g128"), std::string::npos);
}

// Every element is within half a quantization step of its source, for int8 groups of 32, per
// row, a short last group and odd column counts.
TEST(QuantizeTest, Int8RoundTripWithinHalfStep) {
  for (int64_t cols : {1, 7, 32, 45, 96, 257}) {
    for (int group : {32, 0}) {
      const int64_t rows = 5;
      auto v = RandomValues(rows * cols, 1 + cols, -3.0f, 2.0f);
      auto q = QuantizeMatrix(v, rows, cols, {true, WeightFormat::kInt8, group}, "w");
      ASSERT_TRUE(q.ok()) << q.status().message();
      const int64_t g = group == 0 ? cols : std::min<int64_t>(group, cols);
      EXPECT_EQ(q->group_size, g);
      EXPECT_EQ(q->groups_per_row, (cols + g - 1) / g);
      EXPECT_EQ(q->data.size(), static_cast<size_t>(rows * cols));
      Weight w = q->View();
      std::vector<float> out(cols);
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeRow(w, r, out.data());
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t gi = c / g;
          float amax = 0;
          for (int64_t i = gi * g; i < std::min(cols, (gi + 1) * g); ++i) {
            amax = std::max(amax, std::fabs(v[r * cols + i]));
          }
          // The stored f16 scale is max|x| / 127 rounded to f16 (relative error <= 2^-11).
          const float step = F16ToF32(q->scales_f16[r * q->groups_per_row + gi]);
          EXPECT_NEAR(step, amax / 127.0f, amax / 127.0f * 0x1p-11f + 1e-12f);
          EXPECT_NEAR(out[c], v[r * cols + c], 0.5f * step * 1.0001f + 1e-7f)
              << "cols " << cols << " group " << group << " r " << r << " c " << c;
        }
      }
    }
  }
}

// Within half a step of the stored f16 scale, whose step is at most 1.08 x the range over 15
// (the range includes 0, so that the zero point is one of 0..15), and 0 decodes to exactly 0.
TEST(QuantizeTest, Int4RoundTripWithinHalfStepOfAGridHoldingZero) {
  for (int64_t cols : {1, 2, 31, 64, 130, 300}) {
    for (int group : {32, 128, 0}) {
      const int64_t rows = 3;
      auto v = RandomValues(rows * cols, 7 + cols, -0.5f, 1.5f);
      auto q = QuantizeMatrix(v, rows, cols, {true, WeightFormat::kInt4, group}, "w");
      ASSERT_TRUE(q.ok()) << q.status().message();
      const int64_t g = group == 0 ? cols : std::min<int64_t>(group, cols);
      EXPECT_EQ(q->bytes_per_row, (cols + 1) / 2);
      Weight w = q->View();
      std::vector<float> out(cols);
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeRow(w, r, out.data());
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t gi = c / g;
          float lo = 0.0f, hi = 0.0f;
          for (int64_t i = gi * g; i < std::min(cols, (gi + 1) * g); ++i) {
            lo = std::min(lo, v[r * cols + i]);
            hi = std::max(hi, v[r * cols + i]);
          }
          const float step = F16ToF32(q->scales_f16[r * q->groups_per_row + gi]);
          EXPECT_LE(step, 1.08f * (hi - lo) / 15.0f);
          EXPECT_NEAR(out[c], v[r * cols + c], 0.5f * step * 1.0001f + 1e-6f)
              << "cols " << cols << " group " << group << " r " << r << " c " << c;
        }
      }
    }
  }
}

TEST(QuantizeTest, Int4PacksLowNibbleFirst) {
  // One group: min 0, max 15 -> scale 1 and zero point 0, so q equals the value.
  std::vector<float> v = {0, 15, 3, 4, 9};
  auto q = QuantizeMatrix(v, 1, 5, {true, WeightFormat::kInt4, 0}, "w");
  ASSERT_TRUE(q.ok());
  ASSERT_EQ(q->data.size(), 3u);
  EXPECT_EQ(q->data[0], 0xf0);
  EXPECT_EQ(q->data[1], 0x43);
  EXPECT_EQ(q->data[2], 0x09);
  EXPECT_FLOAT_EQ(F16ToF32(q->scales_f16[0]), 1.0f);
  EXPECT_EQ(q->zeros[0], 0);
  // Three groups of 2: zero points 15 (all negative), 0 (all positive), 5; two per byte.
  std::vector<float> w = {-15, -3, 15, 3, -5, 10};
  auto z = QuantizeMatrix(w, 1, 6, {true, WeightFormat::kInt4, 2}, "w");
  ASSERT_TRUE(z.ok());
  ASSERT_EQ(z->zeros.size(), 2u);
  EXPECT_EQ(z->zeros[0], 0x0f);
  EXPECT_EQ(z->zeros[1], 0x05);
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(F16ToF32(z->scales_f16[i]), 1.0f) << i;
  std::vector<float> out(6);
  DequantizeRow(z->View(), 0, out.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[i], w[i]) << i;
}

// Bytes per weight at group 32 (issue 22: int4 <= 0.58, int8 <= 1.07): int4 16 bytes of codes +
// an f16 scale + half a byte of zero point per 32 weights, int8 32 + 2.
TEST(QuantizeTest, BytesPerWeight) {
  const int64_t rows = 8, cols = 4096;
  std::vector<float> v = RandomValues(rows * cols, 3, -1.0f, 1.0f);
  for (const auto& [f, group, want] : {std::tuple{WeightFormat::kInt4, 32, 0.578125},
                                       std::tuple{WeightFormat::kInt4, 128, 0.51953125},
                                       std::tuple{WeightFormat::kInt8, 32, 1.0625}}) {
    auto q = QuantizeMatrix(v, rows, cols, {true, f, group}, "w");
    ASSERT_TRUE(q.ok());
    EXPECT_DOUBLE_EQ(static_cast<double>(q->View().nbytes()) / (rows * cols), want)
        << WeightFormatName(f) << " g" << group;
  }
}

// int8 scales are f16: values past 127 * 65504 cannot be stored and are reported.
TEST(QuantizeTest, RejectsScalesBeyondF16) {
  std::vector<float> v = {1e7f, 1.0f, 2.0f, 3.0f};
  for (auto f : {WeightFormat::kInt8, WeightFormat::kInt4}) {
    auto q = QuantizeMatrix(v, 2, 2, {true, f, 32}, "big.w");
    ASSERT_FALSE(q.ok()) << WeightFormatName(f);
    EXPECT_NE(q.status().message().find("big.w: row 0"), std::string::npos) << q.status().message();
  }
}

// Zero groups decode to exactly 0; a constant group is off only by the f16 rounding of its scale
// (the constant is q * scale with q = +-127 (int8) or -15 (int4, zero point 15)).
TEST(QuantizeTest, ZeroGroupsExactConstantGroupsWithinF16Rounding) {
  std::vector<float> v(64, 0.0f);
  for (int i = 32; i < 64; ++i) v[i] = -0.75f;
  for (auto f : {WeightFormat::kInt8, WeightFormat::kInt4}) {
    auto q = QuantizeMatrix(v, 1, 64, {true, f, 32}, "w");
    ASSERT_TRUE(q.ok());
    Weight w = q->View();
    std::vector<float> out(64);
    DequantizeRow(w, 0, out.data());
    for (int i = 0; i < 64; ++i) {
      EXPECT_NEAR(out[i], v[i], std::fabs(v[i]) * 0x1p-11f) << WeightFormatName(f) << " " << i;
      if (v[i] == 0.0f) EXPECT_EQ(out[i], 0.0f) << WeightFormatName(f) << " " << i;
    }
  }
}

TEST(QuantizeTest, Int8SignedRange) {
  std::vector<float> v = {-2.0f, 2.0f, -1.0f, 0.0f};
  auto q = QuantizeMatrix(v, 1, 4, {true, WeightFormat::kInt8, 32}, "w");
  ASSERT_TRUE(q.ok());
  const int8_t* d = reinterpret_cast<const int8_t*>(q->data.data());
  EXPECT_EQ(d[0], -127);
  EXPECT_EQ(d[1], 127);
  EXPECT_EQ(d[2], -64);  // -63.5 rounds to even (-64)
  EXPECT_EQ(d[3], 0);
}

TEST(QuantizeTest, RejectsBadInput) {
  std::vector<float> v = {1.0f, NAN, 2.0f, 3.0f};
  auto q = QuantizeMatrix(v, 2, 2, {true, WeightFormat::kInt8, 32}, "layer.w");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("layer.w"), std::string::npos);
  EXPECT_NE(q.status().message().find("row 0, column 1"), std::string::npos);
  auto shape = QuantizeMatrix(v, 3, 2, {true, WeightFormat::kInt4, 32}, "w");
  EXPECT_FALSE(shape.ok());
  auto odd = QuantizeMatrix(std::vector<float>(8, 1.0f), 1, 8, {true, WeightFormat::kInt4, 3}, "w");
  EXPECT_FALSE(odd.ok());
  auto dense = QuantizeMatrix(std::vector<float>(4, 1.0f), 2, 2, {}, "w");
  EXPECT_FALSE(dense.ok());
}

}  // namespace
}  // namespace dh
