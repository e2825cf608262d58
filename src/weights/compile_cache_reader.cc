// Compile cache reader: validates a cache file's header, key and table, loads its bytes (mapped
// or read by a few threads into huge pages) and serves every weight from them through a
// WeightLoader, so the checkpoint is never opened.
#include "weights/compile_cache_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstring>
#include <set>
#include <thread>
#include <unordered_map>

#include "base/checked_math.h"
#include "base/file_io.h"
#include "base/host_memory.h"
#include "base/memory_info.h"
#include "base/log.h"
#include "weights/compile_cache.h"
#include "weights/compile_cache_format.h"

namespace dh {
namespace {

using namespace compile_cache;  // NOLINT: the format's types are this file's vocabulary

const Checkpoint& EmptyCheckpoint() {
  static const Checkpoint none;
  return none;
}

struct CacheIndex {
  FileHeader header;
  std::string key;
  ParsedTable table;
};

// Reads and validates everything but the data through `fd`. `*key_mismatch` tells a stale file
// (valid, other inputs) from a damaged one.
Result<CacheIndex> ReadIndex(int fd, uint64_t file_size, const std::string& path,
                             const std::string& expected_key, bool* key_mismatch) {
  *key_mismatch = false;
  CacheIndex idx;
  FileHeader& h = idx.header;
  if (file_size < sizeof(FileHeader)) {
    return InvalidArgument("file of {} bytes is shorter than the {}-byte header", file_size,
                           sizeof(FileHeader));
  }
  DH_RETURN_IF_ERROR(PreadAll(fd, &h, sizeof(h), 0, path));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    return InvalidArgument("not a deepharness compile cache (bad magic)");
  }
  if (h.endian != kEndianMark) return InvalidArgument("written on a machine of another byte order");
  if (h.version != kCompileCacheVersion) {
    return InvalidArgument(
        "format version {} (written by {} build), this build reads version {} only: recompile it "
        "with `deepharness compile`",
        h.version, h.version < kCompileCacheVersion ? "an older" : "a newer", kCompileCacheVersion);
  }
  const auto hh = Hash128(&h, offsetof(FileHeader, header_hash));
  if (std::memcmp(hh.data(), h.header_hash, 16) != 0) return InvalidArgument("header checksum mismatch");
  if (h.header_bytes != sizeof(FileHeader)) {
    return InvalidArgument("header of {} bytes, expected {}", h.header_bytes, sizeof(FileHeader));
  }
  if (h.file_bytes != file_size) {
    return InvalidArgument("the header says {} bytes but the file has {} (truncated?)",
                           h.file_bytes, file_size);
  }
  const auto data_end = CheckedAdd(h.data_offset, h.data_bytes);
  const auto key_end = CheckedAdd(h.key_offset, h.key_bytes);
  const auto table_end = CheckedAdd(h.table_offset, h.table_bytes);
  if (h.alignment < kMinBlobAlignment || (h.alignment & (h.alignment - 1)) != 0 ||
      h.data_offset < sizeof(FileHeader) || h.data_offset % h.alignment != 0 || !data_end ||
      !key_end || !table_end || *data_end > h.key_offset || *key_end > h.table_offset ||
      *table_end != file_size) {
    return InvalidArgument("regions out of bounds: data [{}, +{}), key [{}, +{}), table [{}, +{}) "
                           "in {} bytes", h.data_offset, h.data_bytes, h.key_offset, h.key_bytes,
                           h.table_offset, h.table_bytes, file_size);
  }
  if (h.key_bytes > kMaxKeyBytes || h.table_bytes > kMaxTableBytes) {
    return InvalidArgument("key of {} bytes or table of {} bytes is too large", h.key_bytes,
                           h.table_bytes);
  }
  idx.key.resize(static_cast<size_t>(h.key_bytes));
  DH_RETURN_IF_ERROR(PreadAll(fd, idx.key.data(), h.key_bytes, h.key_offset, path));
  const auto kh = Hash128(idx.key.data(), idx.key.size());
  if (std::memcmp(kh.data(), h.key_hash, 16) != 0) return InvalidArgument("key checksum mismatch");
  if (!expected_key.empty() && idx.key != expected_key) {
    *key_mismatch = true;
    return InvalidArgument("stale: {}", KeyDifference(idx.key, expected_key));
  }
  std::vector<uint8_t> table(static_cast<size_t>(h.table_bytes));
  DH_RETURN_IF_ERROR(PreadAll(fd, table.data(), h.table_bytes, h.table_offset, path));
  const auto th = Hash128(table.data(), table.size());
  if (std::memcmp(th.data(), h.table_hash, 16) != 0) return InvalidArgument("table checksum mismatch");
  DH_ASSIGN_OR_RETURN(idx.table, ParseTable(table, h.data_bytes));
  return idx;
}

// The file's bytes: mapped (--mmap) or read into anonymous huge-page memory by a few threads.
class CacheImage {
 public:
  static Result<std::shared_ptr<CacheImage>> Load(int fd, uint64_t size, const FileLoadOptions& o,
                                                  const std::string& path) {
    auto img = std::shared_ptr<CacheImage>(new CacheImage());
    if (size > static_cast<uint64_t>(SIZE_MAX >> 1)) {
      return ResourceExhausted("{}: file of {} bytes is too large", path, size);
    }
    img->size_ = static_cast<size_t>(size);
    if (o.use_mmap) {
      void* p = ::mmap(nullptr, img->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) return IoError("{}: mmap failed: {}", path, ErrnoText(errno));
      img->map_ = p;
      img->map_bytes_ = img->size_;
      img->data_ = static_cast<uint8_t*>(p);
      // Where the file fits in the memory left, its pages are mapped now rather than a fault
      // at a time by the first decode steps: the int4 tiles the file holds are read by every
      // step, and V2-Lite's first 32 tokens ran at 14.5-14.9 against 23.2-24.3 tokens/s when
      // they faulted them in; mapping its 9 GiB of page cache takes 0.25 s. Advised as huge
      // pages first, a file not yet in the page cache comes in as 2 MiB folios mapped whole
      // (9.38 of 9.38 GB PMD-mapped against 0.7 without the advice; bench/README.md "Zen 5,
      // session 32"). Kernels before 5.14 lack the populate advice: then nothing happens.
      const MemoryInfo mem = ReadMemoryInfo();
      if (mem.available == 0 || mem.available > size) {
        ::madvise(p, img->size_, MADV_HUGEPAGE);
        constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ
        ::madvise(p, img->size_, kPopulateRead);
      }
    } else {
      // Over-allocate by one huge page and start at a 2 MiB boundary so THP covers it all.
      constexpr size_t kHuge = 2u << 20;
      const size_t bytes = img->size_ + kHuge;
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) {
        return ResourceExhausted("{}: cannot allocate {} bytes: {}", path, size, ErrnoText(errno));
      }
      img->map_ = p;
      img->map_bytes_ = bytes;
      auto* base = reinterpret_cast<uint8_t*>(AlignUp(reinterpret_cast<uintptr_t>(p), kHuge));
      ::madvise(base, img->size_, MADV_HUGEPAGE);
      img->data_ = base;
      DH_RETURN_IF_ERROR(ParallelRead(fd, base, size, path));
      ::mprotect(p, bytes, PROT_READ);
      RegisterReleasableMemory(p, bytes);  // a backend may release weights it copied
    }
    if (o.mlock && ::mlock(img->data_, img->size_) != 0) {
      DH_LOG(Warning, "{}: mlock of {} bytes failed ({}); continuing without it", path, size,
             ErrnoText(errno));
    }
    return img;
  }
  ~CacheImage() {
    UnregisterReleasableMemory(map_);
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
  }
  const uint8_t* data() const { return data_; }

 private:
  CacheImage() = default;
  static Status ParallelRead(int fd, uint8_t* dst, uint64_t size, const std::string& path) {
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    const uint64_t chunk = AlignUp(std::max<uint64_t>(size / std::min(hw, 8u), 1), 2u << 20);
    std::vector<std::thread> threads;
    std::vector<Status> results;
    const uint64_t n = (size + chunk - 1) / chunk;
    results.resize(static_cast<size_t>(n));
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t begin = i * chunk, len = std::min(chunk, size - begin);
      threads.emplace_back([&, i, begin, len] {
        results[i] = PreadAll(fd, dst + begin, len, begin, path);
      });
    }
    for (auto& t : threads) t.join();
    for (auto& r : results) DH_RETURN_IF_ERROR(r);
    return Status::Ok();
  }
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Serves every weight from the cache file; the checkpoint is never opened.
class ServingLoader final : public WeightLoader {
 public:
  ServingLoader(const ModelConfig& config, Backend& backend, const LoadOptions& options,
                std::shared_ptr<CacheImage> image, CacheIndex index)
      : WeightLoader(EmptyCheckpoint(), config, backend, options),
        image_(std::move(image)),
        index_(std::move(index)) {
    for (const Entry& e : index_.table.entries) by_name_[e.name] = &e;
    names_.insert(index_.table.names.begin(), index_.table.names.end());
    data_base_ = image_->data() + index_.header.data_offset;
  }

  Result<Weight> Matrix(const std::string& name, int64_t rows, int64_t cols) override {
    DH_ASSIGN_OR_RETURN(const Entry* e, FindEntry(name, EntryKind::kWeight));
    if (e->rows != rows || e->cols != cols) {
      return InvalidArgument("weight '{}' is [{}, {}], the model asks for [{}, {}]", name, e->rows,
                             e->cols, rows, cols);
    }
    Weight w = EntryWeight(*e, data_base_);
    DH_RETURN_IF_ERROR(CheckWeightLayout(w, name));
    if (!w.perm.empty()) {
      const int32_t* perm = w.perm.as<const int32_t>();
      for (int64_t c = 0; c < cols; ++c) {
        if (perm[c] < 0 || perm[c] >= cols) {
          return InvalidArgument("weight '{}' perm[{}] = {} outside [0, {})", name, c, perm[c],
                                 cols);
        }
      }
    }
    return PrepareNamed(name, w);
  }

  Result<Tensor> Vector(const std::string& name, int64_t n) override {
    DH_ASSIGN_OR_RETURN(const Entry* e, FindEntry(name, EntryKind::kVector));
    Tensor host = SlotTensor(e->slots[0], data_base_);
    if (host.shape[0] != n) {
      return InvalidArgument("vector '{}' has {} elements, the model asks for {}", name,
                             host.shape[0], n);
    }
    auto buf = backend().Allocate(host.nbytes());
    if (!buf) return ResourceExhausted("cannot allocate {} bytes for '{}'", host.nbytes(), name);
    Tensor t = host;
    t.data = buf->data();
    backend().CopyToDevice(t, host.data);
    buffers_->push_back(std::move(buf));
    return t;
  }

  Result<std::vector<Weight>> DerivedMatrices(
      const std::string& name, std::span<const std::array<int64_t, 2>> shapes,
      const std::function<Result<std::vector<Weight>>()>& compute) override {
    std::vector<Weight> out;
    for (size_t i = 0; i < shapes.size(); ++i) {
      DH_ASSIGN_OR_RETURN(Weight w, Matrix(fmt::format("{}#{}", name, i), shapes[i][0],
                                           shapes[i][1]));
      out.push_back(w);
    }
    return out;
  }

  bool Has(const std::string& name) const override { return names_.count(name) > 0; }

  Status Finish(ModelInfo* info) override {
    for (const auto& [k, v] : index_.table.meta) {
      int64_t n = 0;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
      if (ec != std::errc() || p != v.data() + v.size() || n < 0) {
        return InvalidArgument("meta '{}' = '{}' is not a count", k, v);
      }
      if (k == "num_parameters") info->num_parameters = n;
      else if (k == "num_tensors") info->num_tensors = n;
      else if (k == "weight_bytes") info->weight_bytes = static_cast<uint64_t>(n);
      else if (k == "skipped_tensors") info->skipped_tensors = n;
      else if (k.rfind("bytes.", 0) == 0) info->bytes_by_dtype[k.substr(6)] = n;
    }
    return Status::Ok();
  }

  std::vector<std::shared_ptr<void>> TakeResources() override {
    auto out = WeightLoader::TakeResources();
    out.push_back(image_);
    out.push_back(std::move(buffers_));
    return out;
  }

 private:
  Result<const Entry*> FindEntry(const std::string& name, EntryKind kind) const {
    auto it = by_name_.find(name);
    if (it == by_name_.end() || it->second->kind != kind) {
      return NotFound("no {} '{}' in the cache (compiled by another version?)",
                      kind == EntryKind::kWeight ? "weight" : "vector", name);
    }
    return it->second;
  }

  std::shared_ptr<CacheImage> image_;
  CacheIndex index_;
  std::unordered_map<std::string, const Entry*> by_name_;
  std::set<std::string> names_;
  const uint8_t* data_base_ = nullptr;
  std::shared_ptr<std::vector<std::unique_ptr<Buffer>>> buffers_ =
      std::make_shared<std::vector<std::unique_ptr<Buffer>>>();
};

}  // namespace

Result<std::unique_ptr<WeightLoader>> OpenCompileCacheLoader(
    const std::string& path, const std::string& expected_key, const ModelConfig& config,
    Backend& backend, const LoadOptions& options, bool* stale,
    uint64_t* file_bytes) {
  *stale = false;
  if (!WeightLayoutKnown()) {
    return Unsupported("this build's Weight has fields the compile cache does not store");
  }
  UniqueFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!f.valid()) return IoError("open failed: {}", ErrnoText(errno));
  struct stat st;
  if (::fstat(f.get(), &st) != 0) return IoError("stat failed: {}", ErrnoText(errno));
  if (!S_ISREG(st.st_mode)) return InvalidArgument("not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  DH_ASSIGN_OR_RETURN(CacheIndex index, ReadIndex(f.get(), size, path, expected_key, stale));
  // Data comes from the same descriptor the index was validated through: a writer renaming a new
  // file into place meanwhile cannot mix two files.
  DH_ASSIGN_OR_RETURN(std::shared_ptr<CacheImage> image,
                      CacheImage::Load(f.get(), size, options.file, path));
  LoadOptions lo = options;
  lo.show_progress = false;
  *file_bytes = size;
  return std::unique_ptr<WeightLoader>(
      new ServingLoader(config, backend, lo, std::move(image), std::move(index)));
}

std::string_view CompileCacheOutcomeName(CompileCacheResult::Outcome o) {
  using O = CompileCacheResult::Outcome;
  switch (o) {
    case O::kOff: return "off";
    case O::kHit: return "hit";
    case O::kAbsent: return "absent";
    case O::kNotUsed: return "not-used";
    case O::kWritten: return "written";
    case O::kWriteFailed: return "write-failed";
  }
  return "?";
}
Result<size_t> CheckCompileCacheFile(const std::string& path, const std::string& expected_key) {
  UniqueFd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!f.valid()) {
    if (errno == ENOENT) return NotFound("{}: no such file", path);
    return IoError("{}: open failed: {}", path, ErrnoText(errno));
  }
  struct stat st;
  if (::fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return InvalidArgument("{}: not a regular file", path);
  }
  bool stale = false;
  auto idx = ReadIndex(f.get(), static_cast<uint64_t>(st.st_size), path, expected_key, &stale);
  if (!idx.ok()) return idx.status().WithContext(path);
  return idx->table.entries.size();
}

}  // namespace dh
