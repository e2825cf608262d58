#include "base/stats.h"

#include <gtest/gtest.h>

namespace dh {
namespace {

TEST(Stats, MedianOddEvenAndEmpty) {
  EXPECT_DOUBLE_EQ(Median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(Median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_DOUBLE_EQ(Median({}), 0.0);
}

TEST(Stats, PercentileInterpolatesBetweenRanks) {
  const std::vector<double> sorted = {10.0, 20.0, 30.0, 40.0, 50.0};
  EXPECT_DOUBLE_EQ(Percentile(sorted, 0), 10.0);
  EXPECT_DOUBLE_EQ(Percentile(sorted, 50), 30.0);
  EXPECT_DOUBLE_EQ(Percentile(sorted, 99), 49.6);
  EXPECT_DOUBLE_EQ(Percentile(sorted, 100), 50.0);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0.0);
}

}  // namespace
}  // namespace dh
