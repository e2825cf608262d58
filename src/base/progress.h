// A one-line progress bar on stderr, drawn only when stderr is a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dh {

class ProgressBar {
 public:
  ProgressBar(std::string label, uint64_t total, bool enabled = true);
  ~ProgressBar();
  void Update(uint64_t done);
  void Finish();

 private:
  std::string label_;
  uint64_t total_;
  bool enabled_;
  bool finished_ = false;
  int last_percent_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace dh
