// Order statistics of a few timing samples (benchmarks and probes).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dh {

// The pct-th percentile (0-100) of sorted samples, linear between the two nearest ranks (as
// numpy's default); 0 for none.
inline double Percentile(const std::vector<double>& sorted, double pct) {
  if (sorted.empty()) return 0;
  const double rank = pct / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - static_cast<double>(lo));
}

// The median of v (the mean of the middle two for an even count); 0 for none.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return Percentile(v, 50);
}

}  // namespace dh
