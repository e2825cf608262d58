// safetensors reader: the header is parsed and validated in full (length limit, JSON, dtypes,
// shapes, offsets inside the data region, byte lengths equal to shape x dtype, tensors
// contiguous and non-overlapping, checked arithmetic); tensor data stays in the mapped file.
// Checkpoint: one model directory — model.safetensors, a sharded
// model.safetensors.index.json (shard names confined to the directory), or *.safetensors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace dh {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100u << 20;  // as the reference library

// "[a, b, ...]": how a shape reads in messages.
std::string FormatShape(std::span<const int64_t> dims);
inline std::string FormatShape(std::initializer_list<int64_t> dims) {
  return FormatShape(std::span<const int64_t>(dims.begin(), dims.size()));
}

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the file's data region
  uint64_t nbytes = 0;
  std::string file;  // the file it came from, for error messages

  // A host view of the stored bytes (read-only by convention).
  Tensor View() const { return Tensor::FromDims(const_cast<uint8_t*>(data), dtype, shape); }
  std::string ShapeString() const;
  bool HasShape(std::initializer_list<int64_t> dims) const {
    return std::equal(shape.begin(), shape.end(), dims.begin(), dims.end());
  }
};

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path,
                                                       const FileLoadOptions& options = {});
  // Parses an in-memory image (the file's bytes); used by Open and by tests.
  static Result<std::unique_ptr<SafetensorsFile>> FromMapped(std::shared_ptr<MappedFile> file);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }

 private:
  std::shared_ptr<MappedFile> file_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

class Checkpoint {
 public:
  static Result<Checkpoint> Open(const std::string& dir, const FileLoadOptions& options = {});
  // progress(done_files, total_files) is called as shards are opened (with --no-mmap opening a
  // shard reads it, which takes a while for large checkpoints).
  using Progress = std::function<void(size_t done_files, size_t total_files)>;
  static Result<Checkpoint> Open(const std::string& dir, const FileLoadOptions& options,
                                 const Progress& progress);

  const TensorInfo* Find(const std::string& name) const;
  const std::vector<const TensorInfo*>& tensors() const { return ordered_; }
  uint64_t total_bytes() const { return total_bytes_; }
  const std::string& dir() const { return dir_; }
  size_t num_files() const { return files_.size(); }
  // Whether the files were read into memory (FileLoadOptions::use_mmap false, and the files fit
  // in the memory left; else they are mapped).
  bool read_into_memory() const { return read_into_memory_; }
  // Whether the files are mapped only because they exceed the memory left: use_mmap was false
  // (read them in, the default) but the whole checkpoint would not fit. The weight loader then
  // copies what it uses as stored into memory (WeightLoader::ReadInFromMapping).
  bool mapped_to_fit() const { return mapped_to_fit_; }

 private:
  std::string dir_;
  bool read_into_memory_ = false;
  bool mapped_to_fit_ = false;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, const TensorInfo*> by_name_;
  std::vector<const TensorInfo*> ordered_;
  uint64_t total_bytes_ = 0;
};

}  // namespace dh
