// MappedFile: a regular file's bytes, mmapped read-only or copied into anonymous memory, checked
// for size at open time (a file that shrinks later can still SIGBUS a mapping: use --no-mmap).
#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "base/log.h"

namespace dh {
namespace {

// Closes a file descriptor when it goes out of scope.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

Status ErrnoStatus(const std::string& path, const char* what, int err) {
  if (err == ENOENT) return NotFound("{}: no such file", path);
  return IoError("{}: {} failed: {}", path, what, std::strerror(err));
}

// Opens `path` for reading and checks that it is a regular file (not a directory, a FIFO or a
// device such as /dev/zero, whose size says nothing about what can be read).
Result<int> OpenRegularFile(const std::string& path, uint64_t* size) {
  // O_NONBLOCK keeps open() from hanging on a FIFO with no writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(path, "open", errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoStatus(path, "stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument("{}: expected a regular file, got {}", path,
                           S_ISDIR(st.st_mode) ? "a directory" : "a special file");
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

// Reads exactly `size` bytes from the start of fd into dst.
Status ReadAll(int fd, const std::string& path, uint8_t* dst, size_t size) {
  size_t done = 0;
  while (done < size) {
    size_t chunk = std::min<size_t>(size - done, size_t{1} << 30);
    ssize_t n = ::pread(fd, dst + done, chunk, static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(path, "read", errno);
    }
    if (n == 0) {
      return IoError("{}: file shrank while reading: expected {} bytes, got {}", path, size, done);
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Result<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path,
                                                     const FileLoadOptions& options) {
  uint64_t size64 = 0;
  DH_ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size64));
  FdCloser closer(fd);
  if (size64 > static_cast<uint64_t>(SIZE_MAX >> 1)) {
    return ResourceExhausted("{}: file of {} bytes is too large to map", path, size64);
  }
  const size_t size = static_cast<size_t>(size64);

  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = size;
  if (size == 0) return file;  // mmap refuses length 0; an empty file has no bytes to view

  if (options.use_mmap) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) return ErrnoStatus(path, "mmap", errno);
    file->data_ = static_cast<const uint8_t*>(p);
    file->mapped_ = true;
  } else {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return ResourceExhausted("{}: cannot allocate {} bytes to read the file: {}", path, size,
                               std::strerror(errno));
    }
    file->data_ = static_cast<const uint8_t*>(p);
    file->mapped_ = true;  // the destructor unmaps it
    // Huge pages for weights that are streamed every token: fewer TLB misses, and the hardware
    // prefetcher does not stop at every 4 KiB boundary. Advisory; ignored where unsupported.
    ::madvise(p, size, MADV_HUGEPAGE);
    DH_RETURN_IF_ERROR(ReadAll(fd, path, static_cast<uint8_t*>(p), size));
    ::mprotect(p, size, PROT_READ);
  }

  if (options.mlock && ::mlock(file->data_, size) != 0) {
    DH_LOG(Warning, "{}: mlock of {} bytes failed ({}); continuing without it (raise ulimit -l)",
           path, size, std::strerror(errno));
  }
  return file;
}

MappedFile::~MappedFile() {
  if (mapped_ && data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Result<std::string> ReadTextFile(const std::string& path, size_t max_bytes) {
  uint64_t size = 0;
  DH_ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size));
  FdCloser closer(fd);
  if (size > max_bytes) {
    return InvalidArgument("{}: file is {} bytes, more than the {} allowed", path, size, max_bytes);
  }
  std::string text(static_cast<size_t>(size), '\0');
  DH_RETURN_IF_ERROR(
      ReadAll(fd, path, reinterpret_cast<uint8_t*>(text.data()), static_cast<size_t>(size)));
  return text;
}

}  // namespace dh
