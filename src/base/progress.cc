// Progress bar: redraws at most once per percent, with elapsed time and ETA; silent when stderr
// is not a TTY.
#include "base/progress.h"

#include <unistd.h>

#include <cstdio>

namespace dh {

ProgressBar::ProgressBar(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled && isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(uint64_t done) {
  if (!enabled_ || total_ == 0) return;
  const int percent = static_cast<int>(done * 100 / total_);
  if (percent == last_percent_) return;
  last_percent_ = percent;
  constexpr int kWidth = 30;
  const int filled = percent * kWidth / 100;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // ETA from the mean rate so far (blank until the first unit is done).
  const double eta = done > 0 && done < total_ ? secs * static_cast<double>(total_ - done) / done : 0;
  std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% %.1fs", label_.c_str(), filled,
               "##############################", kWidth - filled, "", percent, secs);
  if (eta > 0) std::fprintf(stderr, " ETA %.0fs  ", eta);
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  Update(total_);
  std::fputc('\n', stderr);
}

}  // namespace dh
