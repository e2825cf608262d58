// Small POSIX file helpers shared by MappedFile, the compile cache and the checkpoint key: a
// descriptor closed at scope exit, whole-range pread/pwrite that retry on EINTR and short
// transfers, and opening a path that must be a regular file.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace dh {

// Owns a file descriptor; closes it at scope exit (or on Reset).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset(int fd = -1);
  // Gives up ownership: returns the descriptor and leaves this empty.
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// strerror(err) as a string.
std::string ErrnoText(int err);

// Reads exactly `size` bytes at `offset` into dst. `path` names the file in errors; a file that
// ends early is an IoError.
Status PreadAll(int fd, void* dst, uint64_t size, uint64_t offset, const std::string& path);
// Writes exactly `size` bytes at `offset`.
Status PwriteAll(int fd, const void* src, uint64_t size, uint64_t offset, const std::string& path);

// Opens `path` read-only (O_NONBLOCK, so a FIFO with no writer does not hang) and checks that it
// is a regular file (not a directory, FIFO or device, whose size says nothing about what can be
// read). *size gets its size. A missing file is NotFound.
Result<int> OpenRegularFile(const std::string& path, uint64_t* size);

}  // namespace dh
