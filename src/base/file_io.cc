// POSIX file helpers (file_io.h).
#include "base/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace dh {
namespace {

Status ErrnoStatus(const std::string& path, const char* what, int err) {
  if (err == ENOENT) return NotFound("{}: no such file", path);
  return IoError("{}: {} failed: {}", path, what, std::strerror(err));
}

}  // namespace

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string ErrnoText(int err) { return std::strerror(err); }

Status PreadAll(int fd, void* dst, uint64_t size, uint64_t offset, const std::string& path) {
  auto* p = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < size) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size - done, 1ull << 30));
    const ssize_t n = ::pread(fd, p + done, chunk, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("{}: read failed: {}", path, ErrnoText(errno));
    }
    if (n == 0) {
      return IoError("{}: file ended at byte {} (expected {} bytes from {}; did it shrink?)", path,
                     offset + done, size, offset);
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status PwriteAll(int fd, const void* src, uint64_t size, uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(src);
  uint64_t done = 0;
  while (done < size) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size - done, 1ull << 30));
    const ssize_t n = ::pwrite(fd, p + done, chunk, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("{}: write failed: {}", path, ErrnoText(errno));
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Result<int> OpenRegularFile(const std::string& path, uint64_t* size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return ErrnoStatus(path, "open", errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(path, "stat", errno);
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument("{}: expected a regular file, got {}", path,
                           S_ISDIR(st.st_mode) ? "a directory" : "a special file");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd.Release();
}

}  // namespace dh
