// Shared pieces of the fuzz targets: the in-memory input file and (replay build) the registry.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "fuzz/fuzz_target.h"

namespace dh::fuzz {

std::map<std::string, FuzzFn>& Targets() {
  static std::map<std::string, FuzzFn> targets;
  return targets;
}

bool RegisterTarget(const char* name, FuzzFn fn) {
  Targets()[name] = fn;
  return true;
}

std::string WriteInputFile(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("dh-fuzz-input", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, 0) != 0) {
    std::perror("fuzz input file");
    std::abort();
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) {
      std::perror("fuzz input file");
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace dh::fuzz
