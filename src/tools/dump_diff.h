// `deepharness diff-dumps A B`: compares two tensor dumps (model/tensor_dump.h) tap by tap in
// A's order, which is the order the model computed them, and names the first tap where they
// differ — "which layer first differs between the old and the new deployment?". Floats are
// compared as numpy.allclose(a, b, rtol, atol) does: |a - b| <= atol + rtol * |b| element-wise,
// NaN never equal, infinities equal when of the same sign; integer taps (chosen experts) exactly.
// Taps found in one dump only (a filter, or tensor parallelism, whose ranks do not tap the
// sliced projections) are listed but do not decide the verdict.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace dh {

struct DumpDiffOptions {
  double rtol = 1e-5, atol = 1e-8;  // numpy's defaults
};

struct TapDiff {
  enum class Verdict { kSame, kDiffers, kShapeDiffers };
  int step = 0;
  std::string tap;
  std::string shape;     // A's ("4x128"); "4x128 vs 4x64" when the shapes differ
  int64_t elements = 0;  // compared
  int64_t mismatched = 0;
  double max_abs = 0;  // max |a - b|
  double max_rel = 0;  // max |a - b| / |b| over b != 0
  Verdict verdict = Verdict::kSame;
};

struct DumpDiff {
  std::vector<TapDiff> taps;                      // the taps in both, in A's manifest order
  int first_difference = -1;                      // index into taps; -1: every tap in both matches
  std::vector<std::string> only_in_a, only_in_b;  // "s<step>.<tap>"
  bool same() const { return first_difference < 0; }
};

// Bad input (a missing or malformed manifest, an unreadable .npy, a dtype that differs, no tap
// in common) is an error naming the file and field.
Result<DumpDiff> DiffDumps(const std::string& dir_a, const std::string& dir_b,
                           const DumpDiffOptions& options);

// The error table and a closing line naming the first differing tap (or saying all match).
std::string FormatDumpDiff(const DumpDiff& diff, const DumpDiffOptions& options);

}  // namespace dh
