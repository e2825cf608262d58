// Compile cache writer: streams each weight a load produces into a temporary file beside the
// destination, then writes the key, table and header, syncs and renames it into place; and the
// WeightLoader that records a checkpoint load into it.
#include "weights/compile_cache_writer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "base/file_io.h"
#include "base/host_memory.h"
#include "base/progress.h"
#include "weights/compile_cache.h"
#include "weights/compile_cache_format.h"

namespace dh {

namespace fs = std::filesystem;
using namespace compile_cache;  // NOLINT: the format's types are this file's vocabulary

class CompileCacheWriter::Impl {
 public:
  Impl(std::string final_path, Backend& backend)
      : final_(std::move(final_path)), backend_(backend) {}
  ~Impl() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
  }

  Status Open() {
    if (!WeightLayoutKnown()) {
      return Unsupported("this build's Weight has fields the compile cache does not store");
    }
    const fs::path dir = fs::path(final_).parent_path();
    std::error_code ec;
    if (!dir.empty()) fs::create_directories(dir, ec);
    if (ec) return IoError("{}: cannot create the directory: {}", dir.string(), ec.message());
    RemoveAbandonedTemps();
    static std::atomic<uint64_t> counter{0};
    for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
      temp_ = fmt::format("{}.tmp.{}.{}", final_, ::getpid(), counter.fetch_add(1));
      fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd_ < 0 && errno != EEXIST) {
        const int err = errno;
        temp_.clear();
        return IoError("{}: cannot create a file: {}", dir.string(), ErrnoText(err));
      }
    }
    if (fd_ < 0) {
      temp_.clear();
      return IoError("{}: cannot create a unique temporary file", final_);
    }
    return Status::Ok();
  }

  void AddWeight(const std::string& name, const Weight& w) {
    if (!status_.ok() || !seen_.insert(name).second) return;
    Status layout = w.rows_released
                        ? Internal("weight '{}': its rows were released at load", name)
                        : CheckWeightLayout(w, name);
    if (!layout.ok()) {
      status_ = layout;
      return;
    }
    Entry e;
    e.name = name;
    e.kind = EntryKind::kWeight;
    e.format = w.format;
    e.rows = w.rows;
    e.cols = w.cols;
    e.block_rows = w.block_rows;
    e.block_cols = w.block_cols;
    e.group_size = w.group_size;
    e.zero_offset = w.zero_offset;
    // Where the backend's own copy serves every product, a load hands the row layout back to the
    // system at once: the file keeps the copy, and the rows' dtypes and shapes only. Elsewhere it
    // keeps the rows alone (a copy beside them would double the file; the load makes it).
    const bool copy = !w.packed.empty() && backend_.PackedServesEveryProduct(w);
    const auto slots = Slots(w);
    for (int i = 0; i < kNumSlots && status_.ok(); ++i) {
      if (slots[i]->empty() || (i == kPackedSlot && !copy)) continue;
      if (i < 3 && copy) {
        ShapeOnly(*slots[i], &e.slots[i]);
      } else {
        status_ = WriteSlot(*slots[i], &e.slots[i]);
      }
    }
    entries_.push_back(std::move(e));
  }

  void AddVector(const std::string& name, const Tensor& t) {
    if (!status_.ok() || t.empty() || !seen_.insert(name).second) return;
    if (t.dtype != DType::kF32 || t.ndim != 1) {
      status_ = InvalidArgument("vector '{}' is {}, expected f32 [n]", name, TensorDesc(t));
      return;
    }
    Entry e;
    e.name = name;
    e.kind = EntryKind::kVector;
    e.rows = t.shape[0];
    e.cols = 1;
    status_ = WriteSlot(t, &e.slots[0]);
    entries_.push_back(std::move(e));
  }

  void AddMeta(std::string key, std::string value) {
    meta_.emplace_back(std::move(key), std::move(value));
  }
  void SetNames(std::vector<std::string> names) { names_ = std::move(names); }
  const Status& status() const { return status_; }

  // Writes key, table and header, syncs and renames into place. Returns the file size.
  Result<uint64_t> Commit(const std::string& key) {
    DH_RETURN_IF_ERROR(status_);
    ByteSink table;
    table.U32(static_cast<uint32_t>(meta_.size()));
    for (const auto& [k, v] : meta_) {
      table.Str(k);
      table.Str(v);
    }
    table.U32(static_cast<uint32_t>(names_.size()));
    for (const auto& n : names_) table.Str(n);
    table.U32(static_cast<uint32_t>(entries_.size()));
    for (const Entry& e : entries_) EncodeEntry(e, table);

    FileHeader h{};
    std::memcpy(h.magic, kMagic, sizeof(kMagic));
    h.version = kCompileCacheVersion;
    h.endian = kEndianMark;
    h.header_bytes = sizeof(FileHeader);
    h.alignment = kCompileCacheAlignment;
    h.data_offset = kDataStart;
    h.data_bytes = next_ - kDataStart;
    h.key_offset = next_;
    h.key_bytes = key.size();
    h.table_offset = AlignUp(h.key_offset + h.key_bytes, 8);
    h.table_bytes = table.bytes().size();
    h.file_bytes = h.table_offset + h.table_bytes;
    auto kh = Hash128(key.data(), key.size());
    auto th = Hash128(table.bytes().data(), table.bytes().size());
    std::memcpy(h.key_hash, kh.data(), 16);
    std::memcpy(h.table_hash, th.data(), 16);
    auto hh = Hash128(&h, offsetof(FileHeader, header_hash));
    std::memcpy(h.header_hash, hh.data(), 16);

    DH_RETURN_IF_ERROR(PwriteAll(fd_, key.data(), key.size(), h.key_offset, temp_));
    DH_RETURN_IF_ERROR(
        PwriteAll(fd_, table.bytes().data(), h.table_bytes, h.table_offset, temp_));
    std::vector<uint8_t> head(kDataStart, 0);
    std::memcpy(head.data(), &h, sizeof(h));
    DH_RETURN_IF_ERROR(PwriteAll(fd_, head.data(), head.size(), 0, temp_));
    if (::ftruncate(fd_, static_cast<off_t>(h.file_bytes)) != 0 || ::fsync(fd_) != 0) {
      return IoError("{}: sync failed: {}", temp_, ErrnoText(errno));
    }
    ::close(fd_);
    fd_ = -1;
    if (::rename(temp_.c_str(), final_.c_str()) != 0) {
      return IoError("{}: rename to {} failed: {}", temp_, final_, ErrnoText(errno));
    }
    committed_ = true;
    // Make the rename durable too.
    const std::string dir = fs::path(final_).parent_path().string();
    UniqueFd d(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (d.valid()) ::fsync(d.get());
    return h.file_bytes;
  }

 private:
  static void ShapeOnly(const Tensor& t, SlotInfo* slot) {
    slot->present = true;
    slot->stored = false;
    slot->dtype = t.dtype;
    slot->ndim = t.ndim;
    slot->shape = t.shape;
  }

  Status WriteSlot(const Tensor& t, SlotInfo* slot) {
    if (!t.contiguous()) return InvalidArgument("a strided weight tensor cannot be cached");
    slot->present = true;
    slot->dtype = t.dtype;
    slot->ndim = t.ndim;
    slot->shape = t.shape;
    slot->nbytes = t.nbytes();
    slot->offset = next_ - kDataStart;
    staging_.resize(slot->nbytes);
    if (slot->nbytes > 0) backend_.CopyToHost(staging_.data(), t);
    DH_RETURN_IF_ERROR(PwriteAll(fd_, staging_.data(), slot->nbytes, next_, temp_));
    next_ = AlignUp(next_ + slot->nbytes, kCompileCacheAlignment);
    return Status::Ok();
  }

  // Temporary files of writers that died ("<final>.tmp.<pid>.<n>" with no process <pid>).
  void RemoveAbandonedTemps() {
    const fs::path p(final_);
    const std::string prefix = p.filename().string() + ".tmp.";
    std::error_code ec;
    for (fs::directory_iterator it(p.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind(prefix, 0) != 0) continue;
      const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
        std::error_code rm;
        fs::remove(it->path(), rm);
      }
    }
  }

  std::string final_, temp_;
  Backend& backend_;
  int fd_ = -1;
  uint64_t next_ = kDataStart;
  bool committed_ = false;
  Status status_;
  std::set<std::string> seen_;
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, std::string>> meta_;
  std::vector<std::string> names_;
  std::vector<uint8_t> staging_;
};

CompileCacheWriter::CompileCacheWriter(std::string final_path, Backend& backend)
    : impl_(std::make_unique<Impl>(std::move(final_path), backend)) {}
CompileCacheWriter::~CompileCacheWriter() = default;
Status CompileCacheWriter::Open() { return impl_->Open(); }
void CompileCacheWriter::AddWeight(const std::string& name, const Weight& w) {
  impl_->AddWeight(name, w);
}
void CompileCacheWriter::AddVector(const std::string& name, const Tensor& t) {
  impl_->AddVector(name, t);
}
void CompileCacheWriter::AddMeta(std::string key, std::string value) {
  impl_->AddMeta(std::move(key), std::move(value));
}
void CompileCacheWriter::SetNames(std::vector<std::string> names) {
  impl_->SetNames(std::move(names));
}
Result<uint64_t> CompileCacheWriter::Commit(const std::string& key) { return impl_->Commit(key); }

namespace {

// Loads the checkpoint as usual and hands every produced weight to the writer.
class RecordingLoader final : public WeightLoader {
 public:
  RecordingLoader(const Checkpoint& checkpoint, const ModelConfig& config, Backend& backend,
                  const LoadOptions& options, CompileCacheWriter* writer, bool progress)
      : WeightLoader(checkpoint, config, backend, WithoutProgress(options)),
        checkpoint_(checkpoint),
        writer_(writer) {
    if (progress) progress_ = std::make_unique<ProgressBar>("compiling", checkpoint.total_bytes());
    keep_rows_ = true;  // the writer reads each weight's rows after the backend prepared it
  }

  Result<Weight> Matrix(const std::string& name, int64_t rows, int64_t cols) override {
    auto w = WeightLoader::Matrix(name, rows, cols);
    if (w.ok()) Record(name, *w);
    Advance(name);
    if (name.size() > 7) Advance(name.substr(0, name.size() - 7) + ".weight_scale_inv");
    return w;
  }
  Result<Tensor> Vector(const std::string& name, int64_t n) override {
    auto t = WeightLoader::Vector(name, n);
    if (t.ok()) writer_->AddVector(name, *t);
    Advance(name);
    return t;
  }
  Result<std::vector<Weight>> DerivedMatrices(
      const std::string& name, std::span<const std::array<int64_t, 2>> shapes,
      const std::function<Result<std::vector<Weight>>()>& compute) override {
    auto ws = WeightLoader::DerivedMatrices(name, shapes, compute);
    if (ws.ok()) {
      for (size_t i = 0; i < ws->size(); ++i) Record(fmt::format("{}#{}", name, i), (*ws)[i]);
    }
    return ws;
  }
  Status Finish(ModelInfo* info) override {
    DH_RETURN_IF_ERROR(WeightLoader::Finish(info));
    if (progress_) progress_->Finish();
    writer_->AddMeta("num_parameters", std::to_string(info->num_parameters));
    writer_->AddMeta("num_tensors", std::to_string(info->num_tensors));
    writer_->AddMeta("weight_bytes", std::to_string(info->weight_bytes));
    writer_->AddMeta("skipped_tensors", std::to_string(info->skipped_tensors));
    for (const auto& [k, v] : info->bytes_by_dtype) writer_->AddMeta("bytes." + k, std::to_string(v));
    std::vector<std::string> names;
    for (const TensorInfo* t : checkpoint_.tensors()) names.push_back(t->name);
    writer_->SetNames(std::move(names));
    return Status::Ok();
  }

 private:
  // Hands `w` to the writer as a load that does not keep every weight's rows would see it
  // (keep_rows_ is this loader's own need). Under `deepharness compile` nothing runs on the
  // loaded model, so the backend's copy goes back to the system once written: the load then
  // holds no more than the row layouts (packed copies are made for the file alone).
  void Record(const std::string& name, const Weight& w) {
    Weight as_loaded = w;
    as_loaded.read_by_rows = IsRowReadTable(name);
    writer_->AddWeight(name, as_loaded);
    if (options().compile_cache.compile_only && !w.packed.empty()) {
      ReleaseHostPages(w.packed.data, w.packed.nbytes());
    }
  }

  static LoadOptions WithoutProgress(LoadOptions o) {
    o.show_progress = false;
    return o;
  }
  void Advance(const std::string& name) {
    if (!progress_ || !counted_.insert(name).second) return;
    if (const TensorInfo* t = checkpoint_.Find(name)) progress_->Update(done_ += t->nbytes);
  }
  const Checkpoint& checkpoint_;
  CompileCacheWriter* writer_;
  std::unique_ptr<ProgressBar> progress_;
  std::set<std::string> counted_;
  uint64_t done_ = 0;
};

}  // namespace

std::unique_ptr<WeightLoader> MakeRecordingLoader(const Checkpoint& checkpoint,
                                                  const ModelConfig& config, Backend& backend,
                                                  const LoadOptions& options,
                                                  CompileCacheWriter* writer, bool progress) {
  return std::make_unique<RecordingLoader>(checkpoint, config, backend, options, writer,
                                           progress);
}

}  // namespace dh
