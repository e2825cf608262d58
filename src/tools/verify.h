// `deepharness verify`: checks a checkpoint before it is served — index <-> files <-> tensors,
// the tensors the architecture expects (its own factory run over the headers only, see
// verify_tensors.h: names, shapes, dtypes, and every unused tensor named), FP8 block-scale
// grids, AWQ/GPTQ packing, per-tensor statistics (NaN, Inf, all-zero rows, absurd magnitudes)
// streamed from disk in chunks on all threads with bounded memory, and sha256 against a
// manifest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"

namespace dh {

struct VerifyOptions {
  std::string model_path;
  std::string manifest;      // sha256sum-format file; empty: no hashing
  int threads = 0;           // 0: all CPUs
  double max_abs = 1e4;      // |x| above this in a weight is "absurd"
  bool load_model = true;    // the expected-tensor check (headers only; nothing is loaded)
  bool progress = true;      // progress bar on stderr
  bool direct_io = true;     // read spans not in the page cache with O_DIRECT (false: buffered)
};

struct VerifyProblem {
  std::string check;   // structure | tensors | fp8-scales | packing | values | sha256
  std::string where;   // file or tensor
  std::string message;
};

struct TensorStats {
  std::string name, dtype, shape;
  uint64_t elements = 0;
  uint64_t nan = 0, inf = 0, zero_rows = 0, absurd = 0;
  double max_abs = 0;
};

struct VerifyReport {
  std::string model_path;
  std::string architecture;
  int files = 0;
  int tensors = 0;
  uint64_t bytes = 0;
  uint64_t hashed_bytes = 0;
  uint64_t stats_bytes = 0;  // bytes of float tensors streamed for the value statistics
  // ... of which counted in place on the mapping (in the page cache), read with O_DIRECT, and
  // read buffered (O_DIRECT refused by the filesystem, or direct_io off).
  uint64_t stats_bytes_mapped = 0, stats_bytes_direct = 0, stats_bytes_buffered = 0;
  double stats_seconds = 0, hash_seconds = 0;
  std::vector<std::string> checks_run;
  std::vector<VerifyProblem> problems;
  std::vector<TensorStats> stats;  // tensors with a finding (all when verbose)
  bool clean() const { return problems.empty(); }
};

// Returns a report (problems inside) when it could run; an error Status when it could not
// (missing directory, unreadable manifest).
Result<VerifyReport> VerifyCheckpoint(const VerifyOptions& options, Backend* backend);

std::string FormatVerifyText(const VerifyReport& report);
std::string FormatVerifyJson(const VerifyReport& report);

}  // namespace dh
