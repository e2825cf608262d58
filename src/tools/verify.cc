#include "tools/verify.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

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
};
constexpr uint64_t kChunkBytes = 8u << 20;

// Drops the pages wholly inside [p, p + n) from this process's mapping (MADV_DONTNEED; a
// neighbouring chunk may still be counting the partial ones). The page cache keeps them.
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

// Counts every float tensor in chunks on all threads, in file order so the disk reads
// sequentially. A chunk already in the page cache is counted where the checkpoint maps it (no
// copy); one that is not is read with pread into the thread's buffer, where the kernel's own
// sequential readahead keeps the disk busy (faulting the mapping in, even with MADV_WILLNEED
// ahead, read a cold file at about half that rate: bench/README.md). A counted chunk is dropped
// from the mapping (MADV_DONTNEED: the pages stay in the page cache; the process's resident memory
// stays at a few chunks whatever the checkpoint's size). Fills stats (one entry per tensor) and
// returns the bytes counted.
Result<uint64_t> StreamStats(const std::vector<const TensorInfo*>& tensors,
                             const std::map<std::string, FileRegion>& regions, double max_abs,
                             ThreadPool& pool, bool progress, std::vector<TensorStats>* stats) {
  std::vector<StatsChunk> chunks;
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = *tensors[i];
    const uint64_t esize = DTypeSize(t.dtype);
    const uint64_t row_bytes =
        t.shape.size() == 2 && t.shape[1] > 0 ? static_cast<uint64_t>(t.shape[1]) * esize : esize;
    const uint64_t step = std::max<uint64_t>(1, kChunkBytes / row_bytes) * row_bytes;
    for (uint64_t b = 0; b < t.nbytes; b += step) {
      chunks.push_back({i, b, std::min(step, t.nbytes - b)});
    }
    total += t.nbytes;
  }
  std::vector<TensorStats> partial(chunks.size());
  std::vector<uint64_t> limit_bits(tensors.size());  // max_abs in each tensor's bits, once
  for (size_t i = 0; i < tensors.size(); ++i) limit_bits[i] = LimitBits(tensors[i]->dtype, max_abs);
  ProgressBar bar("verify", total, progress);
  std::mutex mu;
  uint64_t done = 0;
  std::atomic<size_t> next{0};
  std::vector<std::string> errors(chunks.size());
  pool.RunOnAll([&](int) {
    std::vector<uint8_t> buf;
    std::map<std::string, int> fds;
    while (true) {
      const size_t c = next.fetch_add(1);
      if (c >= chunks.size()) break;
      const StatsChunk& ch = chunks[c];
      const TensorInfo& t = *tensors[ch.tensor];
      const uint8_t* mapped = t.data + ch.offset;
      const uint8_t* data = mapped;
      if (!Resident(mapped, ch.bytes)) {
        auto [slot, opened] = fds.try_emplace(t.file, -1);
        if (opened) slot->second = ::open(t.file.c_str(), O_RDONLY | O_CLOEXEC);
        const FileRegion& region = regions.at(t.file);
        const uint64_t at = region.file_offset + static_cast<uint64_t>(mapped - region.start);
        buf.resize(ch.bytes);
        uint64_t got = 0;
        while (slot->second >= 0 && got < ch.bytes) {
          const ssize_t k = ::pread(slot->second, buf.data() + got, ch.bytes - got,
                                    static_cast<off_t>(at + got));
          if (k <= 0) break;
          got += static_cast<uint64_t>(k);
        }
        if (got < ch.bytes) {
          errors[c] = fmt::format("{}: short read of '{}' at offset {}", t.file, t.name, at + got);
          continue;
        }
        data = buf.data();
      }
      const uint64_t cols = t.shape.size() == 2 ? static_cast<uint64_t>(t.shape[1]) : 0;
      AccumulateStats(data, t.dtype, ch.bytes / DTypeSize(t.dtype), cols, limit_bits[ch.tensor],
                      &partial[c]);
      DropPages(mapped, ch.bytes);
      std::lock_guard<std::mutex> lock(mu);
      done += ch.bytes;
      bar.Update(done);
    }
    for (const auto& [file, fd] : fds)
      if (fd >= 0) ::close(fd);
  });
  bar.Finish();
  for (const std::string& e : errors)
    if (!e.empty()) return IoError("{}", e);
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
                      StreamStats(floats, regions, o.max_abs, pool, o.progress, &stats));
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
    out += fmt::format("values: {:.1f} MB read in {:.2f} s ({:.2f} GB/s)\n", r.stats_bytes / 1e6,
                       r.stats_seconds, r.stats_bytes / 1e9 / r.stats_seconds);
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
              {"sha256_bytes", r.hashed_bytes},
              {"sha256_seconds", r.hash_seconds},
              {"clean", r.clean()},
              {"problems", problems},
              {"flagged_tensors", stats}};
  return doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace dh
