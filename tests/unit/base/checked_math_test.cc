// Checked size arithmetic: overflow and negative dimensions are reported, never wrapped.
#include "base/checked_math.h"

#include <gtest/gtest.h>

#include <vector>

namespace dh {
namespace {

TEST(CheckedMathTest, MulAndAdd) {
  EXPECT_EQ(CheckedMul(3, 4), 12u);
  EXPECT_EQ(CheckedMul(UINT64_MAX, 1), UINT64_MAX);
  EXPECT_FALSE(CheckedMul(uint64_t{1} << 32, uint64_t{1} << 32).has_value());
  EXPECT_EQ(CheckedAdd(UINT64_MAX - 1, 1), UINT64_MAX);
  EXPECT_FALSE(CheckedAdd(UINT64_MAX, 1).has_value());
}

TEST(CheckedMathTest, Product) {
  EXPECT_EQ(CheckedProduct(std::vector<int64_t>{}), 1u);
  EXPECT_EQ(CheckedProduct(std::vector<int64_t>{2, 3, 4}), 24u);
  EXPECT_EQ(CheckedProduct(std::vector<int64_t>{0, int64_t{1} << 62}), 0u);
  // A zero dim does not hide trailing dims whose product (a stride) overflows int64.
  EXPECT_FALSE(CheckedProduct(std::vector<int64_t>{0, int64_t{1} << 40, int64_t{1} << 40}).has_value());
  EXPECT_FALSE(CheckedProduct(std::vector<int64_t>{int64_t{1} << 62, 2}).has_value());
  EXPECT_FALSE(CheckedProduct(std::vector<int64_t>{-1, 2}).has_value());
  const int64_t big = (int64_t{1} << 42) + 1;  // ggml#26318's patched dimension
  EXPECT_FALSE(CheckedProduct(std::vector<int64_t>{big, big}).has_value());
}

}  // namespace
}  // namespace dh
