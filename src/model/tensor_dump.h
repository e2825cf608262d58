// TensorDumper: a TapSink that writes the taps of chosen steps as NumPy files
// `<dir>/s<step>.<tap>.npy` and one line per file in `<dir>/manifest.tsv` (step, tap, dtype,
// shape, file), in the order the model produced them, which is what `diff-dumps` walks.
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/tap.h"

namespace dh {

struct DumpOptions {
  std::string dir;
  std::string filter = "*";  // base/glob.h patterns over tap names
  int first_step = 0, last_step = std::numeric_limits<int>::max();  // inclusive
};

// "A-B" or "A" (steps counted from 0: the first forward step, usually the prompt's prefill).
Status ParseDumpSteps(const std::string& text, DumpOptions* options);

class TensorDumper final : public TapSink {
 public:
  // Creates `dir` (and its parents) and the manifest; an existing manifest is replaced.
  static Result<std::unique_ptr<TensorDumper>> Create(const DumpOptions& options);
  ~TensorDumper() override;

  void BeginStep() override { ++step_; }
  void OnTap(Backend& backend, std::string_view name, const Tensor& t) override;
  // Closes the manifest; the first write error, if any (dumping stops at the first one).
  Status Finish();

  int64_t files_written() const { return files_written_; }
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  explicit TensorDumper(DumpOptions options) : options_(std::move(options)) {}

  DumpOptions options_;
  std::FILE* manifest_ = nullptr;
  int step_ = -1;
  int64_t files_written_ = 0;
  uint64_t bytes_written_ = 0;
  std::vector<uint8_t> host_;
  Status error_;
};

}  // namespace dh
