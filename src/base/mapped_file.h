// Read-only file contents: memory-mapped (zero-copy, the default) or read into anonymous memory
// (--no-mmap: immune to page-cache eviction by other processes), optionally locked (--mlock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace dh {

struct FileLoadOptions {
  bool use_mmap = true;
  bool mlock = false;
};

class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> Open(const std::string& path,
                                                  const FileLoadOptions& options = {});
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

// Reads a whole (small) text file, e.g. config.json. Refuses files over max_bytes.
Result<std::string> ReadTextFile(const std::string& path, size_t max_bytes = 64u << 20);

}  // namespace dh
