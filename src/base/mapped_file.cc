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

#include "base/file_io.h"
#include "base/log.h"

namespace dh {
namespace {

Status ErrnoStatus(const std::string& path, const char* what, int err) {
  return IoError("{}: {} failed: {}", path, what, ErrnoText(err));
}

}  // namespace

Result<std::shared_ptr<MappedFile>> MappedFile::Open(const std::string& path,
                                                     const FileLoadOptions& options) {
  uint64_t size64 = 0;
  DH_ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size64));
  UniqueFd closer(fd);
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
    DH_RETURN_IF_ERROR(PreadAll(fd, p, size, 0, path));
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
  UniqueFd closer(fd);
  if (size > max_bytes) {
    return InvalidArgument("{}: file is {} bytes, more than the {} allowed", path, size, max_bytes);
  }
  std::string text(static_cast<size_t>(size), '\0');
  DH_RETURN_IF_ERROR(PreadAll(fd, text.data(), size, 0, path));
  return text;
}

}  // namespace dh
