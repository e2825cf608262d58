#include "tools/verify.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/file_io.h"
#include "base/progress.h"
#include "base/sha256.h"
#include "base/thread_pool.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "tools/verify_tensors.h"
#include "tools/verify_values.h"

namespace dh {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

float ElementAsFloat(const TensorInfo& t, uint64_t i) { return ElementAt(t.data, t.dtype, i); }

bool IsScaleTensor(const std::string& name) {
  return EndsWith(name, "weight_scale_inv") || EndsWith(name, ".scales") ||
         EndsWith(name, "_scale") || EndsWith(name, ".weight_scale");
}

// A piece of one tensor counted in one go: whole rows for 2-D tensors, ~kChunkBytes.
struct StatsChunk {
  size_t tensor = 0;
  uint64_t offset = 0, bytes = 0;  // within the tensor's data
  uint64_t file_at = 0;            // where the piece starts in its file
};
constexpr uint64_t kChunkBytes = 8u << 20;

// What one worker reads in one request: consecutive chunks of one file, up to kSpanBytes (or
// one chunk when a single row is larger). Gaps between them (tensors that are not counted) are
// read along when they are short, else the span ends there.
struct ReadSpan {
  const std::string* file = nullptr;
  uint64_t begin = 0, end = 0;     // file offsets
  const uint8_t* mapped = nullptr;  // where `begin` is in the checkpoint's mapping
  size_t first = 0, last = 0;       // chunks [first, last)
};
constexpr uint64_t kSpanBytes = 16u << 20;
constexpr uint64_t kMaxGapBytes = 1u << 20;
// O_DIRECT reads start, end and land on this boundary: the page size, a multiple of every
// logical block size in use (512 or 4096); a device that wants more refuses the read (EINVAL)
// and the reader falls back to buffered reads.
constexpr uint64_t kDirectAlign = 4096;
// Workers beyond the counting threads when some span is not in the page cache: a worker waits
// for its read, then counts it, so the disk has up to threads + kExtraReaders requests queued
// while the counting threads are busy (bench/README.md, verify_rate.sh).
constexpr int kExtraReaders = 2;

// Drops the pages wholly inside [p, p + n) from this process's mapping (MADV_DONTNEED). The
// page cache keeps them.
void DropPages(const uint8_t* p, uint64_t n) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uint64_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// Where a file's data region starts in its mapping and in the file (8 + header length). The parser
// accepted the file only if its tensors cover the region from its first byte, so the lowest data
// pointer among a file's tensors is the region's start.
struct FileRegion {
  const uint8_t* start = nullptr;
  uint64_t file_offset = 0;
};

Result<std::map<std::string, FileRegion>> FileRegions(const std::vector<const TensorInfo*>& all) {
  std::map<std::string, FileRegion> regions;
  for (const TensorInfo* t : all) {
    FileRegion& r = regions[t->file];
    if (r.start == nullptr || t->data < r.start) r.start = t->data;
  }
  for (auto& [file, r] : regions) {
    std::ifstream in(file, std::ios::binary);
    uint8_t len8[8];
    if (!in.read(reinterpret_cast<char*>(len8), 8)) return IoError("{}: cannot read", file);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len8[i];
    r.file_offset = 8 + header_len;
  }
  return regions;
}

// Whether every page of [p, p + n) is in the page cache.
bool Resident(const uint8_t* p, uint64_t n) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uint64_t end = (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page;
  thread_local std::vector<unsigned char> vec;
  vec.resize((end - begin) / page);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()) != 0) return false;
  for (unsigned char v : vec)
    if ((v & 1) == 0) return false;
  return true;
}

// A buffer aligned for O_DIRECT, grown on demand.
class AlignedBuffer {
 public:
  uint8_t* Reserve(uint64_t n) {
    if (n > capacity_) {
      const uint64_t size = (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
      data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, size)));
      capacity_ = data_ ? size : 0;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  uint64_t capacity_ = 0;
};

// One worker's descriptors for the checkpoint's files: O_DIRECT where the filesystem takes it,
// else (or after a refused read) buffered with sequential-access advice.
class SpanReader {
 public:
  explicit SpanReader(bool direct) : direct_(direct) {}

  // Reads file bytes [begin, end) into buf; returns where `begin` landed in it and says whether
  // the bytes came by O_DIRECT (an aligned span around them: the unaligned edges are read along
  // and skipped by the caller through the returned pointer) or buffered.
  Result<const uint8_t*> Read(const std::string& file, uint64_t begin, uint64_t end,
                              AlignedBuffer& buf, bool* direct) {
    Fds& f = fds_[file];
    if (!f.opened) {
      f.opened = true;
      if (direct_) f.direct.Reset(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
    }
    const uint64_t a0 = begin / kDirectAlign * kDirectAlign;
    const uint64_t a1 = (end + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    uint8_t* p = buf.Reserve(a1 - a0);
    if (p == nullptr) return IoError("{}: cannot allocate a {} byte read buffer", file, a1 - a0);
    uint64_t got = 0;  // bytes from a0
    *direct = false;
    if (f.direct.valid()) {
      while (got < end - a0) {
        const ssize_t k = ::pread(f.direct.get(), p + got, a1 - a0 - got, static_cast<off_t>(a0 + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EINVAL && got == 0) f.direct.Reset();  // alignment refused: buffered from now on
        if (k <= 0) break;
        got += static_cast<uint64_t>(k);
        if (got % kDirectAlign != 0) break;  // end of file (or a short read off the block grid)
      }
      if (got >= end - a0) {
        *direct = true;
        return p + (begin - a0);
      }
    }
    // Buffered, for all of it or the rest of it (from the first byte still missing).
    if (!f.buffered.valid()) {
      f.buffered.Reset(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
      if (!f.buffered.valid()) return IoError("{}: cannot open: {}", file, std::strerror(errno));
      ::posix_fadvise(f.buffered.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    uint64_t at = std::max(a0 + got, begin);
    while (at < end) {
      const ssize_t k = ::pread(f.buffered.get(), p + (at - a0), end - at, static_cast<off_t>(at));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) return IoError("{}: short read at offset {}", file, at);
      at += static_cast<uint64_t>(k);
    }
    return p + (begin - a0);
  }

 private:
  struct Fds {
    bool opened = false;
    UniqueFd direct, buffered;
  };
  bool direct_;
  std::map<std::string, Fds> fds_;
};

// Counts every float tensor in file order, span by span (ReadSpan), on all threads. A span whose
// pages are all in the page cache is counted where the checkpoint maps it (no copy) and then
// dropped from the mapping (MADV_DONTNEED: the page cache keeps the pages; resident memory stays
// at a few spans whatever the checkpoint's size). Any other span is read with O_DIRECT into the
// worker's aligned buffer (no page-cache copy, no readahead heuristics: the queue depth is the
// number of workers waiting on a read), and when some span is cold kExtraReaders workers join
// the counting threads so reads stay queued while the others count. Fills stats (one entry per
// tensor) and returns the bytes counted; `paths` gets the bytes counted per path.
Result<uint64_t> StreamStats(const std::vector<const TensorInfo*>& tensors,
                             const std::map<std::string, FileRegion>& regions, double max_abs,
                             bool direct_io, ThreadPool& pool, bool progress,
                             std::vector<TensorStats>* stats, VerifyReport* paths) {
  std::vector<StatsChunk> chunks;
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = *tensors[i];
    const uint64_t esize = DTypeSize(t.dtype);
    const uint64_t row_bytes =
        t.shape.size() == 2 && t.shape[1] > 0 ? static_cast<uint64_t>(t.shape[1]) * esize : esize;
    const uint64_t step = std::max<uint64_t>(1, kChunkBytes / row_bytes) * row_bytes;
    const FileRegion& region = regions.at(t.file);
    const uint64_t at = region.file_offset + static_cast<uint64_t>(t.data - region.start);
    for (uint64_t b = 0; b < t.nbytes; b += step) {
      chunks.push_back({i, b, std::min(step, t.nbytes - b), at + b});
    }
    total += t.nbytes;
  }
  std::vector<ReadSpan> spans;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const StatsChunk& ch = chunks[c];
    const TensorInfo& t = *tensors[ch.tensor];
    ReadSpan* s = spans.empty() ? nullptr : &spans.back();
    const bool join = s != nullptr && *s->file == t.file && ch.file_at >= s->end &&
                      ch.file_at - s->end <= kMaxGapBytes &&
                      ch.file_at + ch.bytes - s->begin <= kSpanBytes;
    if (join) {
      s->end = ch.file_at + ch.bytes;
      s->last = c + 1;
    } else {
      spans.push_back({&t.file, ch.file_at, ch.file_at + ch.bytes, t.data + ch.offset, c, c + 1});
    }
  }
  std::vector<TensorStats> partial(chunks.size());
  std::vector<uint64_t> limit_bits(tensors.size());  // max_abs in each tensor's bits, once
  for (size_t i = 0; i < tensors.size(); ++i) limit_bits[i] = LimitBits(tensors[i]->dtype, max_abs);
  bool any_cold = false;
  for (const ReadSpan& s : spans) {
    if (!Resident(s.mapped, s.end - s.begin)) {
      any_cold = true;
      break;
    }
  }
  ProgressBar bar("verify", total, progress);
  std::mutex mu;
  uint64_t done = 0, mapped_bytes = 0, direct_bytes = 0, buffered_bytes = 0;
  std::atomic<size_t> next{0};
  std::vector<std::string> errors(spans.size());
  auto work = [&] {
    AlignedBuffer buf;
    SpanReader reader(direct_io);
    while (true) {
      const size_t i = next.fetch_add(1);
      if (i >= spans.size()) break;
      const ReadSpan& s = spans[i];
      const uint8_t* base = s.mapped;  // where file offset s.begin is
      const bool in_place = Resident(s.mapped, s.end - s.begin);
      bool direct = false;
      if (!in_place) {
        auto got = reader.Read(*s.file, s.begin, s.end, buf, &direct);
        if (!got.ok()) {
          errors[i] = got.status().message();
          continue;
        }
        base = *got;
      }
      uint64_t bytes = 0;
      for (size_t c = s.first; c < s.last; ++c) {
        const StatsChunk& ch = chunks[c];
        const TensorInfo& t = *tensors[ch.tensor];
        const uint64_t cols = t.shape.size() == 2 ? static_cast<uint64_t>(t.shape[1]) : 0;
        AccumulateStats(base + (ch.file_at - s.begin), t.dtype, ch.bytes / DTypeSize(t.dtype),
                        cols, limit_bits[ch.tensor], &partial[c]);
        bytes += ch.bytes;
      }
      if (in_place) DropPages(s.mapped, s.end - s.begin);
      std::lock_guard<std::mutex> lock(mu);
      (in_place ? mapped_bytes : direct ? direct_bytes : buffered_bytes) += bytes;
      done += bytes;
      bar.Update(done);
    }
  };
  std::vector<std::thread> readers;
  if (any_cold) {
    for (int i = 0; i < kExtraReaders; ++i) readers.emplace_back(work);
  }
  pool.RunOnAll([&](int) { work(); });
  for (std::thread& t : readers) t.join();
  bar.Finish();
  for (const std::string& e : errors)
    if (!e.empty()) return IoError("{}", e);
  paths->stats_bytes_mapped = mapped_bytes;
  paths->stats_bytes_direct = direct_bytes;
  paths->stats_bytes_buffered = buffered_bytes;
  stats->assign(tensors.size(), TensorStats());
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorStats& s = (*stats)[i];
    s.name = tensors[i]->name;
    s.dtype = std::string(DTypeName(tensors[i]->dtype));
    s.shape = FormatShape(tensors[i]->shape);
    s.elements = tensors[i]->nbytes / DTypeSize(tensors[i]->dtype);
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    TensorStats& s = (*stats)[chunks[c].tensor];
    const TensorStats& p = partial[c];
    s.nan += p.nan;
    s.inf += p.inf;
    s.zero_rows += p.zero_rows;
    s.absurd += p.absurd;
    s.max_abs = std::max(s.max_abs, p.max_abs);
  }
  return total;
}

void CheckFp8Scales(const Checkpoint& ckpt, const ModelConfig* config, VerifyReport* r) {
  const int br = config && config->quantization.block_rows > 0 ? config->quantization.block_rows : 128;
  const int bc = config && config->quantization.block_cols > 0 ? config->quantization.block_cols : 128;
  for (const TensorInfo* t : ckpt.tensors()) {
    if (!EndsWith(t->name, ".weight_scale_inv")) continue;
    const std::string wname = t->name.substr(0, t->name.size() - 10);  // "...weight"
    const TensorInfo* w = ckpt.Find(wname);
    if (w == nullptr) {
      r->problems.push_back({"fp8-scales", t->name, "no weight '" + wname + "' for these scales"});
      continue;
    }
    if (w->shape.size() != 2 || t->shape.size() != 2) {
      r->problems.push_back({"fp8-scales", t->name, "expected 2-D weight and scales, got " +
                                                        FormatShape(w->shape) + " and " + FormatShape(t->shape)});
      continue;
    }
    const int64_t er = (w->shape[0] + br - 1) / br, ec = (w->shape[1] + bc - 1) / bc;
    if (t->shape[0] != er || t->shape[1] != ec) {
      r->problems.push_back({"fp8-scales", t->name,
                             "shape " + FormatShape(t->shape) + ": expected [" + std::to_string(er) +
                                 ", " + std::to_string(ec) + "] (weight " + FormatShape(w->shape) +
                                 " in " + std::to_string(br) + "x" + std::to_string(bc) + " blocks)"});
    }
    if (!IsFloat(t->dtype)) {
      r->problems.push_back({"fp8-scales", t->name, "expected a float dtype"});
      continue;
    }
    const uint64_t n = t->nbytes / DTypeSize(t->dtype);
    uint64_t bad = 0;
    float first_bad = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const float v = ElementAsFloat(*t, i);
      if (!(std::isfinite(v) && v > 0)) {
        if (bad++ == 0) first_bad = v;
      }
    }
    if (bad > 0) {
      r->problems.push_back({"fp8-scales", t->name,
                             std::to_string(bad) + " scale(s) not finite and positive (first: " +
                                 fmt::format("{}", first_bad) + ")"});
    }
  }
}

void CheckPacking(const Checkpoint& ckpt, const ModelConfig* config, VerifyReport* r) {
  const std::string method = config ? config->quantization.method : "";
  const int group = config ? config->quantization.group_size : 0;
  for (const TensorInfo* q : ckpt.tensors()) {
    if (!EndsWith(q->name, ".qweight")) continue;
    const std::string base = q->name.substr(0, q->name.size() - 8);
    const TensorInfo* z = ckpt.Find(base + ".qzeros");
    const TensorInfo* s = ckpt.Find(base + ".scales");
    auto bad = [&](const std::string& msg) { r->problems.push_back({"packing", base, msg}); };
    if (z == nullptr || s == nullptr) {
      bad(std::string("missing ") + (z == nullptr ? ".qzeros" : ".scales"));
      continue;
    }
    if (q->dtype != DType::kI32 || z->dtype != DType::kI32) {
      bad("qweight and qzeros must be int32 (8 packed 4-bit values), got " +
          std::string(DTypeName(q->dtype)) + " and " + std::string(DTypeName(z->dtype)));
      continue;
    }
    if (q->shape.size() != 2 || z->shape.size() != 2 || s->shape.size() != 2) {
      bad("qweight, qzeros and scales must be 2-D");
      continue;
    }
    const int64_t groups = s->shape[0], out = s->shape[1];
    if (z->shape[0] != groups || z->shape[1] * 8 != out) {
      bad("qzeros " + FormatShape(z->shape) + " does not match scales " + FormatShape(s->shape) +
          ": expected [" + std::to_string(groups) + ", " + std::to_string(out / 8) + "]");
      continue;
    }
    int64_t in = 0;
    if (method == "awq") {
      if (q->shape[1] * 8 != out) {
        bad("AWQ qweight " + FormatShape(q->shape) + ": expected " + std::to_string(out / 8) +
            " packed columns for " + std::to_string(out) + " outputs");
        continue;
      }
      in = q->shape[0];
    } else {
      if (q->shape[1] != out) {
        bad("GPTQ qweight " + FormatShape(q->shape) + ": expected " + std::to_string(out) + " columns");
        continue;
      }
      in = q->shape[0] * 8;
    }
    if (group > 0 && groups * group != in) {
      bad(std::to_string(groups) + " groups of " + std::to_string(group) + " do not cover " +
          std::to_string(in) + " inputs");
      continue;
    }
    if (const TensorInfo* g = ckpt.Find(base + ".g_idx"); g != nullptr) {
      if (g->dtype != DType::kI32 || g->shape.size() != 1 || g->shape[0] != in) {
        bad("g_idx: expected int32 [" + std::to_string(in) + "], got " +
            std::string(DTypeName(g->dtype)) + " " + FormatShape(g->shape));
        continue;
      }
      for (int64_t i = 0; i < in; ++i) {
        int32_t v;
        std::memcpy(&v, g->data + 4 * i, 4);
        if (v < 0 || v >= groups) {
          bad("g_idx[" + std::to_string(i) + "] = " + std::to_string(v) + ": expected 0.." +
              std::to_string(groups - 1));
          break;
        }
      }
    }
  }
}

// The index lists every tensor of every shard, and every shard in the directory is listed.
void CheckIndex(const std::string& dir, const Checkpoint& ckpt, VerifyReport* r) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::ifstream in(index_path);
  if (!in) return;
  json index;
  try {
    index = json::parse(in);
  } catch (const json::exception& e) {
    r->problems.push_back({"structure", index_path, std::string("invalid JSON: ") + e.what()});
    return;
  }
  const json& wm = index["weight_map"];
  std::set<std::string> listed_files;
  for (const auto& [name, file] : wm.items()) {
    if (file.is_string()) listed_files.insert(file.get<std::string>());
  }
  for (const TensorInfo* t : ckpt.tensors()) {
    if (!wm.contains(t->name)) {
      r->problems.push_back({"structure", t->name,
                             "in " + fs::path(t->file).filename().string() +
                                 " but not in model.safetensors.index.json"});
    }
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (EndsWith(name, ".safetensors") && !listed_files.count(name)) {
      r->problems.push_back({"structure", name, "a shard the index does not list"});
    }
  }
}

Status CheckManifest(const VerifyOptions& o, ThreadPool& pool, VerifyReport* r) {
  std::ifstream in(o.manifest);
  if (!in) return NotFound("{}: cannot read the manifest", o.manifest);
  std::vector<std::pair<std::string, std::string>> entries;  // file, expected hex
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    if (line.size() < 67 || (line[64] != ' ') || (line[65] != ' ' && line[65] != '*')) {
      return InvalidArgument("{}:{}: expected \"<64 hex digits>  <file>\" (sha256sum format)",
                             o.manifest, n);
    }
    std::string hex = line.substr(0, 64);
    for (char& c : hex) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return InvalidArgument("{}:{}: expected 64 hex digits", o.manifest, n);
    }
    std::string file = line.substr(66);
    if (file.rfind("./", 0) == 0) file = file.substr(2);
    if (file.find("..") != std::string::npos || (!file.empty() && file[0] == '/')) {
      return InvalidArgument("{}:{}: {}: expected a path inside the model directory", o.manifest,
                             n, file);
    }
    entries.push_back({file, hex});
  }
  r->checks_run.push_back("sha256");
  std::vector<std::string> got(entries.size());
  std::vector<std::string> err(entries.size());
  std::atomic<uint64_t> bytes{0};
  const auto t0 = std::chrono::steady_clock::now();
  pool.ParallelFor(entries.size(), 1, [&](size_t b, size_t e) {
    std::vector<char> buf(4u << 20);
    for (size_t i = b; i < e; ++i) {
      std::FILE* f = std::fopen((o.model_path + "/" + entries[i].first).c_str(), "rb");
      if (f == nullptr) {
        err[i] = "listed in the manifest but missing";
        continue;
      }
      Sha256 h;
      size_t k;
      while ((k = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
        h.Update(buf.data(), k);
        bytes += k;
      }
      std::fclose(f);
      got[i] = h.HexDigest();
    }
  });
  r->hash_seconds = Seconds(t0);
  r->hashed_bytes = bytes;
  std::set<std::string> listed;
  for (size_t i = 0; i < entries.size(); ++i) {
    listed.insert(entries[i].first);
    if (!err[i].empty()) {
      r->problems.push_back({"sha256", entries[i].first, err[i]});
    } else if (got[i] != entries[i].second) {
      r->problems.push_back({"sha256", entries[i].first,
                             "sha256 " + got[i] + ", manifest says " + entries[i].second});
    }
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(o.model_path, ec)) {
    const std::string name = e.path().filename().string();
    if ((EndsWith(name, ".safetensors") || name == "config.json" ||
         name == "model.safetensors.index.json") &&
        !listed.count(name)) {
      r->problems.push_back({"sha256", name, "not in the manifest"});
    }
  }
  return Status::Ok();
}

}  // namespace

Result<VerifyReport> VerifyCheckpoint(const VerifyOptions& o, Backend* backend) {
  std::error_code ec;
  if (!fs::is_directory(o.model_path, ec)) {
    return NotFound("{}: not a model directory", o.model_path);
  }
  if (!o.manifest.empty() && !fs::is_regular_file(o.manifest, ec)) {
    return NotFound("{}: cannot read the manifest", o.manifest);
  }
  VerifyReport r;
  r.model_path = o.model_path;
  ThreadPool pool(o.threads > 0 ? o.threads : AvailableCpus());

  // Hashing first: it reads raw files and works even when nothing else can be opened.
  if (!o.manifest.empty()) DH_RETURN_IF_ERROR(CheckManifest(o, pool, &r));

  r.checks_run.push_back("structure");
  auto config = LoadModelConfig(o.model_path);
  if (!config.ok()) {
    r.problems.push_back({"structure", "config.json", config.status().message()});
  } else {
    r.architecture = config->architecture;
  }
  // Mapped from the files (StreamStats drops counted pages from the mapping, which an anonymous
  // copy would lose).
  auto ckpt = Checkpoint::Open(o.model_path, FileLoadOptions{.use_mmap = true});
  if (!ckpt.ok()) {
    r.problems.push_back({"structure", o.model_path, ckpt.status().message()});
    return r;  // nothing below can run without readable tensors
  }
  r.files = static_cast<int>(ckpt->num_files());
  r.tensors = static_cast<int>(ckpt->tensors().size());
  r.bytes = ckpt->total_bytes();
  CheckIndex(o.model_path, *ckpt, &r);
  const ModelConfig* cfg = config.ok() ? &*config : nullptr;

  r.checks_run.push_back("fp8-scales");
  CheckFp8Scales(*ckpt, cfg, &r);
  r.checks_run.push_back("packing");
  CheckPacking(*ckpt, cfg, &r);

  if (o.load_model && backend != nullptr && cfg != nullptr) {
    r.checks_run.push_back("tensors");
    for (VerifyProblem& p : CheckExpectedTensors(*ckpt, *cfg, *backend))
      r.problems.push_back(std::move(p));
  }

  // Statistics over every float tensor, read where the checkpoint maps it, in file order.
  r.checks_run.push_back("values");
  std::vector<const TensorInfo*> floats;
  for (const TensorInfo* t : ckpt->tensors()) {
    if (IsFloat(t->dtype) && DTypeSize(t->dtype) > 0) floats.push_back(t);
  }
  std::sort(floats.begin(), floats.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->file != b->file ? a->file < b->file : a->data < b->data;
  });
  std::vector<TensorStats> stats;
  const auto t0 = std::chrono::steady_clock::now();
  DH_ASSIGN_OR_RETURN(const auto regions, FileRegions(ckpt->tensors()));
  DH_ASSIGN_OR_RETURN(r.stats_bytes,
                      StreamStats(floats, regions, o.max_abs, o.direct_io, pool, o.progress,
                                  &stats, &r));
  r.stats_seconds = Seconds(t0);
  for (size_t i = 0; i < floats.size(); ++i) {
    const TensorStats& s = stats[i];
    const bool scale = IsScaleTensor(s.name);
    const bool matrix = floats[i]->shape.size() == 2 && EndsWith(s.name, ".weight") &&
                        s.name.find("embed") == std::string::npos;
    std::vector<std::string> what;
    if (s.nan) what.push_back(std::to_string(s.nan) + " NaN");
    if (s.inf) what.push_back(std::to_string(s.inf) + " Inf");
    if (s.absurd && !scale) {
      what.push_back(std::to_string(s.absurd) + " values with |x| > " + fmt::format("{:g}", o.max_abs) +
                     " (max " + fmt::format("{:g}", s.max_abs) + ")");
    }
    if (s.zero_rows && matrix) what.push_back(std::to_string(s.zero_rows) + " all-zero rows");
    if (!what.empty()) {
      std::string msg;
      for (const std::string& w : what) msg += (msg.empty() ? "" : ", ") + w;
      r.problems.push_back({"values", s.name, msg});
      r.stats.push_back(s);
    }
  }
  return r;
}

std::string FormatVerifyText(const VerifyReport& r) {
  std::string out = fmt::format("{}: {} ({} files, {} tensors, {:.1f} MB)\n", r.model_path,
                                r.architecture.empty() ? "unknown architecture" : r.architecture,
                                r.files, r.tensors, r.bytes / 1e6);
  std::string checks;
  for (const std::string& c : r.checks_run) checks += (checks.empty() ? "" : ", ") + c;
  out += "checks: " + checks + "\n";
  if (r.stats_seconds > 0) {
    std::string how;  // the read paths that were taken
    for (const auto& [bytes, path] : {std::pair{r.stats_bytes_mapped, "from the page cache"},
                                      std::pair{r.stats_bytes_direct, "O_DIRECT"},
                                      std::pair{r.stats_bytes_buffered, "buffered"}}) {
      if (bytes > 0) how += fmt::format("{}{:.1f} MB {}", how.empty() ? "" : ", ", bytes / 1e6, path);
    }
    out += fmt::format("values: {:.1f} MB read in {:.2f} s ({:.2f} GB/s{}{})\n", r.stats_bytes / 1e6,
                       r.stats_seconds, r.stats_bytes / 1e9 / r.stats_seconds,
                       how.empty() ? "" : ": ", how);
  }
  if (r.hashed_bytes > 0 && r.hash_seconds > 0) {
    out += fmt::format("sha256: {:.1f} MB in {:.2f} s ({:.2f} GB/s)\n", r.hashed_bytes / 1e6,
                       r.hash_seconds, r.hashed_bytes / 1e9 / r.hash_seconds);
  }
  if (r.problems.empty()) return out + "result: clean\n";
  out += fmt::format("\n{:<11} {:<40} {}\n", "check", "where", "problem");
  for (const VerifyProblem& p : r.problems) {
    out += fmt::format("{:<11} {:<40} {}\n", p.check, p.where, p.message);
  }
  return out + fmt::format("\nresult: {} problem(s)\n", r.problems.size());
}

std::string FormatVerifyJson(const VerifyReport& r) {
  json problems = json::array();
  for (const VerifyProblem& p : r.problems) {
    problems.push_back({{"check", p.check}, {"where", p.where}, {"message", p.message}});
  }
  json stats = json::array();
  for (const TensorStats& s : r.stats) {
    stats.push_back({{"name", s.name}, {"dtype", s.dtype}, {"shape", s.shape},
                     {"elements", s.elements}, {"nan", s.nan}, {"inf", s.inf},
                     {"zero_rows", s.zero_rows}, {"absurd", s.absurd}, {"max_abs", s.max_abs}});
  }
  json doc = {{"model_path", r.model_path},
              {"architecture", r.architecture},
              {"files", r.files},
              {"tensors", r.tensors},
              {"bytes", r.bytes},
              {"checks", r.checks_run},
              {"values_seconds", r.stats_seconds},
              {"values_bytes", r.stats_bytes},
              {"values_read",
               {{"mapped", r.stats_bytes_mapped},
                {"direct", r.stats_bytes_direct},
                {"buffered", r.stats_bytes_buffered}}},
              {"sha256_bytes", r.hashed_bytes},
              {"sha256_seconds", r.hash_seconds},
              {"clean", r.clean()},
              {"problems", problems},
              {"flagged_tensors", stats}};
  return doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace dh
