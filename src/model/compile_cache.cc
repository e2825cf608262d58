// Compiled weight cache: the key, the writer (a WeightLoader that records what it produces) and
// the reader (a WeightLoader that serves weights from the file). See compile_cache.h.
#include "model/compile_cache.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include <xxhash.h>

#include "base/checked_math.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "base/progress.h"
#include "io/safetensors.h"
#include "model/weight_loader.h"

namespace dh {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'D', 'H', 'C', 'A', 'C', 'H', 'E', '\0'};
constexpr uint32_t kEndianMark = 0x01020304u;
constexpr uint64_t kDataStart = 4096;            // first data byte (header padded to a page)
constexpr uint64_t kMinBlobAlignment = 64;       // accepted on read
constexpr uint64_t kMaxKeyBytes = 64ull << 20;   // limits checked before allocating
constexpr uint64_t kMaxTableBytes = 1ull << 30;
constexpr int kNumSlots = 4;                     // data, scales, mins, perm
constexpr const char* kSlotNames[kNumSlots] = {"data", "scales", "mins", "perm"};

// The fields of Weight this file stores. If Weight gains a field, sizeof(Weight) changes and the
// cache refuses to read or write (a log line, a normal load) until the serializer learns it.
struct KnownWeightFields {
  WeightFormat format;
  Tensor data, scales, mins;
  int64_t rows, cols;
  int block_rows, block_cols, group_size;
  Tensor perm;
};
bool WeightLayoutKnown() { return sizeof(Weight) == sizeof(KnownWeightFields); }

std::array<Tensor*, kNumSlots> Slots(Weight& w) { return {&w.data, &w.scales, &w.mins, &w.perm}; }
std::array<const Tensor*, kNumSlots> Slots(const Weight& w) {
  return {&w.data, &w.scales, &w.mins, &w.perm};
}

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t endian;
  uint64_t header_bytes;
  uint64_t file_bytes;
  uint64_t data_offset;
  uint64_t data_bytes;
  uint64_t key_offset;
  uint64_t key_bytes;
  uint64_t table_offset;
  uint64_t table_bytes;
  uint64_t alignment;
  uint64_t reserved[5];
  uint8_t key_hash[16];
  uint8_t table_hash[16];
  uint8_t header_hash[16];  // XXH3-128 of every byte before this field
};
static_assert(sizeof(FileHeader) == 176 && sizeof(FileHeader) <= kDataStart);
static_assert(std::is_trivially_copyable_v<FileHeader>);

// ---- hashing and small helpers ----

std::array<uint8_t, 16> Hash128(const void* p, size_t n) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
  std::array<uint8_t, 16> out;
  std::memcpy(out.data(), c.digest, 16);
  return out;
}

std::string Hex(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    s += digits[b[i] >> 4];
    s += digits[b[i] & 15];
  }
  return s;
}

std::string HashHex(std::string_view bytes) {
  auto h = Hash128(bytes.data(), bytes.size());
  return Hex(h.data(), h.size());
}

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string ErrnoText(int err) { return std::strerror(err); }

// Closes a descriptor at scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

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
    if (n == 0) return IoError("{}: file ended at byte {}", path, offset + done);
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

// ---- key ----

// The ELF build id of the running executable (a hash of its contents the linker records), or a
// hash of /proc/self/exe when there is none.
int BuildIdCallback(struct dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<std::string*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const auto* p = reinterpret_cast<const uint8_t*>(info->dlpi_addr + ph.p_vaddr);
    size_t left = ph.p_memsz;
    while (left >= sizeof(ElfW(Nhdr))) {
      ElfW(Nhdr) nh;
      std::memcpy(&nh, p, sizeof(nh));
      const size_t name_sz = (nh.n_namesz + 3u) & ~size_t{3};
      const size_t desc_sz = (nh.n_descsz + 3u) & ~size_t{3};
      const size_t total = sizeof(nh) + name_sz + desc_sz;
      if (total > left) break;
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
          std::memcmp(p + sizeof(nh), "GNU", 4) == 0) {
        *out = Hex(p + sizeof(nh) + name_sz, nh.n_descsz);
        return 1;
      }
      p += total;
      left -= total;
    }
  }
  return 1;  // the first object is the executable; stop there
}

const std::string& BuildId() {
  static const std::string id = [] {
    std::string s;
    dl_iterate_phdr(BuildIdCallback, &s);
    if (!s.empty()) return "elf:" + s;
    auto exe = ReadTextFile("/proc/self/exe", 1ull << 32);
    return exe.ok() ? "exe:" + HashHex(*exe) : std::string("unknown");
  }();
  return id;
}

// The options that change the weights a load produces. A new LoadOptions field that changes
// weights must be added here (and to the file name through CompileCachePath).
std::string WeightOptionLines(const LoadOptions& o) {
  return fmt::format("dtype={}\nquant={}\nquant_lm_head={}\npolicy={}\n", o.dtype, o.quant,
                     o.quant_lm_head ? 1 : 0, o.policy);
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "size=N mtime_ns=T header_xxh3=H" for one safetensors file: its header bytes, never its data.
Result<std::string> SafetensorsKeyLine(const std::string& path) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (f.fd < 0) return IoError("{}: open failed: {}", path, ErrnoText(errno));
  struct stat st;
  if (::fstat(f.fd, &st) != 0) return IoError("{}: stat failed: {}", path, ErrnoText(errno));
  if (!S_ISREG(st.st_mode)) return InvalidArgument("{}: not a regular file", path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const int64_t mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  std::string header_hash = "unreadable";
  uint64_t n = 0;
  if (size >= 8 && PreadAll(f.fd, &n, 8, 0, path).ok() && n <= kMaxSafetensorsHeaderBytes &&
      n <= size - 8) {
    std::string header(static_cast<size_t>(n), '\0');
    if (PreadAll(f.fd, header.data(), n, 8, path).ok()) header_hash = HashHex(header);
  }
  return fmt::format("size={} mtime_ns={} header_xxh3={}", size, mtime_ns, header_hash);
}

Result<std::string> KeyWithFeatures(const std::string& model_dir, const LoadOptions& options,
                                    const std::string& backend_name) {
  std::string k = "deepharness compile cache\n";
  k += fmt::format("format={}\n", kCompileCacheVersion);
  k += fmt::format("build={}\n", BuildId());
  k += fmt::format("backend={}\n", backend_name);
  k += fmt::format("cpu={}\n", CpuFeatureString());
  k += fmt::format("target={}\n", options.compile_cache.cpu_features);
  k += WeightOptionLines(options);
  DH_ASSIGN_OR_RETURN(std::string config, ReadTextFile(model_dir + "/config.json"));
  k += fmt::format("config.json size={} xxh3={}\n", config.size(), HashHex(config));
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(model_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (EndsWith(name, ".safetensors") || EndsWith(name, ".safetensors.index.json")) {
      names.push_back(name);
    }
  }
  if (ec) return IoError("{}: cannot list the directory: {}", model_dir, ec.message());
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string path = model_dir + "/" + name;
    if (EndsWith(name, ".json")) {
      DH_ASSIGN_OR_RETURN(std::string index, ReadTextFile(path));
      k += fmt::format("{} size={} xxh3={}\n", name, index.size(), HashHex(index));
    } else {
      DH_ASSIGN_OR_RETURN(std::string line, SafetensorsKeyLine(path));
      k += fmt::format("{} {}\n", name, line);
    }
  }
  return k;
}

// The first line where two keys differ, for the log line saying why a file is stale.
std::string KeyDifference(std::string_view file_key, std::string_view expected) {
  auto lines = [](std::string_view s) {
    std::vector<std::string_view> out;
    size_t i = 0;
    while (i < s.size()) {
      size_t e = s.find('\n', i);
      if (e == std::string_view::npos) e = s.size();
      out.push_back(s.substr(i, e - i));
      i = e + 1;
    }
    return out;
  };
  auto shorten = [](std::string_view s) {
    return s.size() > 160 ? std::string(s.substr(0, 160)) + "..." : std::string(s);
  };
  const auto a = lines(file_key), b = lines(expected);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string_view x = i < a.size() ? a[i] : "(none)", y = i < b.size() ? b[i] : "(none)";
    if (x != y) {
      return fmt::format("it was compiled from '{}', now '{}'", shorten(x), shorten(y));
    }
  }
  return "keys differ";
}

// ---- table encoding ----

struct SlotInfo {
  bool present = false;
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  uint64_t offset = 0;  // from the start of the data region
  uint64_t nbytes = 0;
};

enum class EntryKind : uint8_t { kWeight = 1, kVector = 2 };

struct Entry {
  std::string name;
  EntryKind kind = EntryKind::kWeight;
  WeightFormat format = WeightFormat::kDense;
  int64_t rows = 0, cols = 0;
  int32_t block_rows = 0, block_cols = 0, group_size = 0;
  std::array<SlotInfo, kNumSlots> slots;
};

class ByteSink {
 public:
  void U8(uint8_t v) { bytes_.push_back(v); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void I64(int64_t v) { Raw(&v, 8); }
  void I32(int32_t v) { Raw(&v, 4); }
  void Str(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  std::vector<uint8_t> bytes_;
};

// Bounds-checked reads; the first failure sticks and names what was being read.
class ByteSource {
 public:
  explicit ByteSource(std::span<const uint8_t> b) : b_(b) {}
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t left() const { return b_.size() - pos_; }
  uint8_t U8(const char* what) { uint8_t v = 0; Raw(&v, 1, what); return v; }
  uint32_t U32(const char* what) { uint32_t v = 0; Raw(&v, 4, what); return v; }
  uint64_t U64(const char* what) { uint64_t v = 0; Raw(&v, 8, what); return v; }
  int64_t I64(const char* what) { int64_t v = 0; Raw(&v, 8, what); return v; }
  int32_t I32(const char* what) { int32_t v = 0; Raw(&v, 4, what); return v; }
  std::string Str(const char* what) {
    const uint32_t n = U32(what);
    if (!ok()) return {};
    if (n > left()) {
      Fail(fmt::format("{}: length {} runs past the table ({} bytes left)", what, n, left()));
      return {};
    }
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void Fail(std::string e) {
    if (error_.empty()) error_ = std::move(e);
  }

 private:
  void Raw(void* dst, size_t n, const char* what) {
    if (!ok()) return;
    if (n > left()) {
      Fail(fmt::format("table ends inside {}", what));
      return;
    }
    std::memcpy(dst, b_.data() + pos_, n);
    pos_ += n;
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  std::string error_;
};

std::optional<DType> DTypeFromName(std::string_view name) {
  for (int v = 0; v <= static_cast<int>(DType::kBool); ++v) {
    if (DTypeName(static_cast<DType>(v)) == name) return static_cast<DType>(v);
  }
  return std::nullopt;
}

std::optional<WeightFormat> FormatFromName(std::string_view name) {
  for (int v = 0; v < 64; ++v) {
    const std::string_view n = WeightFormatName(static_cast<WeightFormat>(v));
    if (n == "?") break;
    if (n == name) return static_cast<WeightFormat>(v);
  }
  return std::nullopt;
}

void EncodeEntry(const Entry& e, ByteSink& out) {
  out.Str(e.name);
  out.U8(static_cast<uint8_t>(e.kind));
  out.Str(WeightFormatName(e.format));
  out.I64(e.rows);
  out.I64(e.cols);
  out.I32(e.block_rows);
  out.I32(e.block_cols);
  out.I32(e.group_size);
  out.U8(kNumSlots);
  for (const SlotInfo& s : e.slots) {
    out.U8(s.present ? 1 : 0);
    if (!s.present) continue;
    out.Str(DTypeName(s.dtype));
    out.U8(static_cast<uint8_t>(s.ndim));
    for (int d = 0; d < s.ndim; ++d) out.I64(s.shape[d]);
    out.U64(s.offset);
    out.U64(s.nbytes);
  }
}

// A Tensor over `base` + slot offset (base may be null while only checking layouts).
Tensor SlotTensor(const SlotInfo& s, const uint8_t* base) {
  Tensor t;
  if (!s.present) return t;
  t.data = const_cast<uint8_t*>(base ? base + s.offset : reinterpret_cast<const uint8_t*>(64));
  t.dtype = s.dtype;
  t.ndim = s.ndim;
  t.shape = s.shape;
  t.SetContiguousStrides();
  return t;
}

Weight EntryWeight(const Entry& e, const uint8_t* data_base) {
  Weight w;
  w.format = e.format;
  w.rows = e.rows;
  w.cols = e.cols;
  w.block_rows = e.block_rows;
  w.block_cols = e.block_cols;
  w.group_size = e.group_size;
  auto slots = Slots(w);
  for (int i = 0; i < kNumSlots; ++i) *slots[i] = SlotTensor(e.slots[i], data_base);
  return w;
}

bool TensorIs(const Tensor& t, DType dtype, std::initializer_list<int64_t> dims) {
  if (t.empty() || t.dtype != dtype || t.ndim != static_cast<int>(dims.size()) || !t.contiguous()) {
    return false;
  }
  int i = 0;
  for (int64_t d : dims) {
    if (t.shape[i++] != d) return false;
  }
  return true;
}

std::string TensorDesc(const Tensor& t) {
  if (t.empty()) return "absent";
  return fmt::format("{} {}", DTypeName(t.dtype), t.ShapeString());
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The invariants backend/weight.h states for each format, so that kernels given this weight never
// read outside its tensors. Checked when a weight is written and again when it is read.
Status CheckWeightLayout(const Weight& w, const std::string& name) {
  auto bad = [&](const char* slot, const Tensor& t, const std::string& expected) {
    return InvalidArgument("weight '{}' ({}, [{}, {}]): {} is {}, expected {}", name,
                           WeightFormatName(w.format), w.rows, w.cols, slot, TensorDesc(t),
                           expected);
  };
  if (w.rows <= 0 || w.cols <= 0 || w.rows > (int64_t{1} << 40) / w.cols) {
    return InvalidArgument("weight '{}': bad shape [{}, {}]", name, w.rows, w.cols);
  }
  auto absent = [&](const char* slot, const Tensor& t) -> Status {
    if (!t.empty()) return bad(slot, t, "absent for this format");
    return Status::Ok();
  };
  switch (w.format) {
    case WeightFormat::kDense:
      if (!TensorIs(w.data, DType::kF32, {w.rows, w.cols}) &&
          !TensorIs(w.data, DType::kBF16, {w.rows, w.cols}) &&
          !TensorIs(w.data, DType::kF16, {w.rows, w.cols})) {
        return bad("data", w.data, fmt::format("f32/bf16/f16 [{}, {}]", w.rows, w.cols));
      }
      DH_RETURN_IF_ERROR(absent("scales", w.scales));
      DH_RETURN_IF_ERROR(absent("mins", w.mins));
      break;
    case WeightFormat::kFp8Block: {
      if (w.block_rows <= 0 || w.block_cols <= 0) {
        return InvalidArgument("weight '{}': fp8 blocks {}x{} must be positive", name,
                               w.block_rows, w.block_cols);
      }
      if (!TensorIs(w.data, DType::kF8E4M3, {w.rows, w.cols})) {
        return bad("data", w.data, fmt::format("f8e4m3 [{}, {}]", w.rows, w.cols));
      }
      const int64_t sr = CeilDiv(w.rows, w.block_rows), sc = CeilDiv(w.cols, w.block_cols);
      if (!TensorIs(w.scales, DType::kF32, {sr, sc})) {
        return bad("scales", w.scales, fmt::format("f32 [{}, {}]", sr, sc));
      }
      DH_RETURN_IF_ERROR(absent("mins", w.mins));
      break;
    }
    case WeightFormat::kInt8:
    case WeightFormat::kInt4: {
      if (w.group_size <= 0) {
        return InvalidArgument("weight '{}': group size {} must be positive", name, w.group_size);
      }
      const bool int4 = w.format == WeightFormat::kInt4;
      const int64_t groups = CeilDiv(w.cols, w.group_size);
      const int64_t row_bytes = int4 ? CeilDiv(w.cols, 2) : w.cols;
      const DType dtype = int4 ? DType::kU8 : DType::kI8;
      if (!TensorIs(w.data, dtype, {w.rows, row_bytes})) {
        return bad("data", w.data,
                   fmt::format("{} [{}, {}]", DTypeName(dtype), w.rows, row_bytes));
      }
      if (!TensorIs(w.scales, DType::kF32, {w.rows, groups})) {
        return bad("scales", w.scales, fmt::format("f32 [{}, {}]", w.rows, groups));
      }
      if (int4) {
        if (!TensorIs(w.mins, DType::kF32, {w.rows, groups})) {
          return bad("mins", w.mins, fmt::format("f32 [{}, {}]", w.rows, groups));
        }
      } else {
        DH_RETURN_IF_ERROR(absent("mins", w.mins));
      }
      break;
    }
    default:
      return Unsupported("weight '{}': format '{}' is not known to the compile cache", name,
                         WeightFormatName(w.format));
  }
  if (!w.perm.empty() && !TensorIs(w.perm, DType::kI32, {w.cols})) {
    return bad("perm", w.perm, fmt::format("i32 [{}]", w.cols));
  }
  return Status::Ok();
}

struct ParsedTable {
  std::vector<std::pair<std::string, std::string>> meta;
  std::vector<std::string> names;  // checkpoint tensor names (Has)
  std::vector<Entry> entries;
};

// Decodes and validates the table against a data region of `data_bytes`.
Result<ParsedTable> ParseTable(std::span<const uint8_t> table, uint64_t data_bytes) {
  ByteSource in(table);
  ParsedTable t;
  auto fail = [&](const std::string& what) { return InvalidArgument("table: {}", what); };
  const uint32_t num_meta = in.U32("meta count");
  if (in.ok() && num_meta > in.left() / 8) return fail(fmt::format("{} meta entries", num_meta));
  for (uint32_t i = 0; i < num_meta && in.ok(); ++i) {
    std::string k = in.Str("meta key");
    std::string v = in.Str("meta value");
    t.meta.emplace_back(std::move(k), std::move(v));
  }
  const uint32_t num_names = in.U32("name count");
  if (in.ok() && num_names > in.left() / 4) return fail(fmt::format("{} names", num_names));
  for (uint32_t i = 0; i < num_names && in.ok(); ++i) t.names.push_back(in.Str("tensor name"));
  const uint32_t num_entries = in.U32("entry count");
  if (in.ok() && num_entries > in.left() / 40) return fail(fmt::format("{} entries", num_entries));
  std::set<std::string> seen;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint32_t i = 0; i < num_entries && in.ok(); ++i) {
    Entry e;
    e.name = in.Str("entry name");
    const uint8_t kind = in.U8("entry kind");
    const std::string format = in.Str("format");
    e.rows = in.I64("rows");
    e.cols = in.I64("cols");
    e.block_rows = in.I32("block_rows");
    e.block_cols = in.I32("block_cols");
    e.group_size = in.I32("group_size");
    const uint8_t num_slots = in.U8("slot count");
    if (!in.ok()) break;
    if (e.name.empty() || !seen.insert(e.name).second) {
      return fail(fmt::format("entry {}: empty or repeated name '{}'", i, e.name));
    }
    if (kind != static_cast<uint8_t>(EntryKind::kWeight) &&
        kind != static_cast<uint8_t>(EntryKind::kVector)) {
      return fail(fmt::format("entry '{}': unknown kind {}", e.name, kind));
    }
    e.kind = static_cast<EntryKind>(kind);
    auto f = FormatFromName(format);
    if (!f) return fail(fmt::format("entry '{}': unknown format '{}'", e.name, format));
    e.format = *f;
    if (num_slots != kNumSlots) {
      return fail(fmt::format("entry '{}': {} tensor slots, expected {}", e.name, num_slots,
                              kNumSlots));
    }
    for (int s = 0; s < kNumSlots && in.ok(); ++s) {
      SlotInfo& slot = e.slots[s];
      slot.present = in.U8("slot flag") != 0;
      if (!slot.present) continue;
      const std::string dtype = in.Str("dtype");
      slot.ndim = in.U8("ndim");
      if (!in.ok()) break;
      auto dt = DTypeFromName(dtype);
      if (!dt) return fail(fmt::format("'{}' {}: unknown dtype '{}'", e.name, kSlotNames[s], dtype));
      slot.dtype = *dt;
      if (slot.ndim < 1 || slot.ndim > kMaxDims) {
        return fail(fmt::format("'{}' {}: {} dims", e.name, kSlotNames[s], slot.ndim));
      }
      for (int d = 0; d < slot.ndim; ++d) slot.shape[d] = in.I64("dim");
      slot.offset = in.U64("offset");
      slot.nbytes = in.U64("size");
      if (!in.ok()) break;
      auto numel = CheckedProduct(std::span<const int64_t>(slot.shape.data(), slot.ndim));
      auto bytes = numel ? CheckedMul(*numel, DTypeSize(slot.dtype)) : std::nullopt;
      if (!bytes || *bytes != slot.nbytes) {
        return fail(fmt::format("'{}' {}: {} bytes do not match its shape and dtype", e.name,
                                kSlotNames[s], slot.nbytes));
      }
      auto end = CheckedAdd(slot.offset, slot.nbytes);
      if (!end || *end > data_bytes || slot.offset % kMinBlobAlignment != 0) {
        return fail(fmt::format("'{}' {}: bytes [{}, +{}) lie outside the data region of {} "
                                "bytes or are misaligned", e.name, kSlotNames[s], slot.offset,
                                slot.nbytes, data_bytes));
      }
      if (slot.nbytes > 0) ranges.emplace_back(slot.offset, *end);
    }
    if (!in.ok()) break;
    if (e.kind == EntryKind::kWeight) {
      DH_RETURN_IF_ERROR(CheckWeightLayout(EntryWeight(e, nullptr), e.name).WithContext("table"));
    } else {
      const SlotInfo& d = e.slots[0];
      bool others = false;
      for (int s = 1; s < kNumSlots; ++s) others = others || e.slots[s].present;
      if (!d.present || d.dtype != DType::kF32 || d.ndim != 1 || others) {
        return fail(fmt::format("vector '{}' is not one f32 [n] tensor", e.name));
      }
    }
    t.entries.push_back(std::move(e));
  }
  if (!in.ok()) return fail(in.error());
  if (in.left() != 0) return fail(fmt::format("{} bytes after the last entry", in.left()));
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      return fail(fmt::format("tensor bytes [{}, {}) overlap [{}, {})", ranges[i].first,
                              ranges[i].second, ranges[i - 1].first, ranges[i - 1].second));
    }
  }
  return t;
}

// ---- reading ----

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
    return InvalidArgument("format version {}, this build reads version {}", h.version,
                           kCompileCacheVersion);
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
    }
    if (o.mlock && ::mlock(img->data_, img->size_) != 0) {
      DH_LOG(Warning, "{}: mlock of {} bytes failed ({}); continuing without it", path, size,
             ErrnoText(errno));
    }
    return img;
  }
  ~CacheImage() {
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
  ServingLoader(const Checkpoint& empty, const ModelConfig& config, Backend& backend,
                const LoadOptions& options, std::shared_ptr<CacheImage> image, CacheIndex index)
      : WeightLoader(empty, config, backend, options),
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
    return backend().PrepareWeight(w);
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

  std::shared_ptr<void> TakeServedBuffers() { return std::move(buffers_); }

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

// ---- writing ----

// Streams each weight into a temporary file next to the destination; Commit writes the key,
// table and header, syncs and renames. The destructor removes an uncommitted temporary file.
class CacheWriter {
 public:
  CacheWriter(std::string final_path, Backend& backend)
      : final_(std::move(final_path)), backend_(backend) {}
  ~CacheWriter() {
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
    Status layout = CheckWeightLayout(w, name);
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
    const auto slots = Slots(w);
    for (int i = 0; i < kNumSlots && status_.ok(); ++i) {
      if (!slots[i]->empty()) status_ = WriteSlot(*slots[i], &e.slots[i]);
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
    Fd d(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (d.fd >= 0) ::fsync(d.fd);
    return h.file_bytes;
  }

 private:
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

// Loads the checkpoint as usual and hands every produced weight to the writer.
class RecordingLoader final : public WeightLoader {
 public:
  RecordingLoader(const Checkpoint& checkpoint, const ModelConfig& config, Backend& backend,
                  const LoadOptions& options, CacheWriter* writer, bool progress)
      : WeightLoader(checkpoint, config, backend, WithoutProgress(options)),
        checkpoint_(checkpoint),
        writer_(writer) {
    if (progress) progress_ = std::make_unique<ProgressBar>("compiling", checkpoint.total_bytes());
  }

  Result<Weight> Matrix(const std::string& name, int64_t rows, int64_t cols) override {
    auto w = WeightLoader::Matrix(name, rows, cols);
    if (w.ok()) writer_->AddWeight(name, *w);
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
      for (size_t i = 0; i < ws->size(); ++i) {
        writer_->AddWeight(fmt::format("{}#{}", name, i), (*ws)[i]);
      }
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
  static LoadOptions WithoutProgress(LoadOptions o) {
    o.show_progress = false;
    return o;
  }
  void Advance(const std::string& name) {
    if (!progress_ || !counted_.insert(name).second) return;
    if (const TensorInfo* t = checkpoint_.Find(name)) progress_->Update(done_ += t->nbytes);
  }
  const Checkpoint& checkpoint_;
  CacheWriter* writer_;
  std::unique_ptr<ProgressBar> progress_;
  std::set<std::string> counted_;
  uint64_t done_ = 0;
};

using ModelPtr = std::unique_ptr<Model>;

Result<ModelPtr> LoadFromCheckpoint(const std::string& dir, const ModelConfig& config,
                                    const ModelFactory& factory, Backend& backend,
                                    const LoadOptions& options, CacheWriter* writer) {
  DH_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(dir, options.file));
  std::unique_ptr<WeightLoader> loader;
  if (writer != nullptr) {
    loader = std::make_unique<RecordingLoader>(checkpoint, config, backend, options, writer,
                                               options.show_progress);
  } else {
    loader = std::make_unique<WeightLoader>(checkpoint, config, backend, options);
  }
  auto model = factory(config, *loader, backend);
  if (!model.ok()) return model.status();
  (*model)->KeepAlive(std::make_shared<Checkpoint>(std::move(checkpoint)));
  (*model)->KeepAlive(loader->TakeOwnedBuffers());
  return std::move(model).value();
}

Result<ModelPtr> ServeFromCache(const std::string& path, const std::string& key,
                                const ModelConfig& config, const ModelFactory& factory,
                                Backend& backend, const LoadOptions& options, bool* stale,
                                uint64_t* file_bytes) {
  if (!WeightLayoutKnown()) {
    return Unsupported("this build's Weight has fields the compile cache does not store");
  }
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (f.fd < 0) return IoError("open failed: {}", ErrnoText(errno));
  struct stat st;
  if (::fstat(f.fd, &st) != 0) return IoError("stat failed: {}", ErrnoText(errno));
  if (!S_ISREG(st.st_mode)) return InvalidArgument("not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  DH_ASSIGN_OR_RETURN(CacheIndex index, ReadIndex(f.fd, size, path, key, stale));
  // Data comes from the same descriptor the index was validated through: a writer renaming a new
  // file into place meanwhile cannot mix two files.
  DH_ASSIGN_OR_RETURN(std::shared_ptr<CacheImage> image,
                      CacheImage::Load(f.fd, size, options.file, path));
  Checkpoint none;
  LoadOptions lo = options;
  lo.show_progress = false;
  ServingLoader loader(none, config, backend, lo, image, std::move(index));
  auto model = factory(config, loader, backend);
  if (!model.ok()) return model.status();
  (*model)->KeepAlive(image);
  (*model)->KeepAlive(loader.TakeOwnedBuffers());
  (*model)->KeepAlive(loader.TakeServedBuffers());
  *file_bytes = size;
  return std::move(model).value();
}

std::string SizeText(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.2f} GiB", bytes / double(1ull << 30));
  return fmt::format("{:.1f} MiB", bytes / double(1ull << 20));
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

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

std::string DefaultCompileCacheDir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] == '/') {
    return std::string(x) + "/deepharness";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/') {
    return std::string(home) + "/.cache/deepharness";
  }
  return "";
}

std::string CpuFeatureString() {
  std::string s;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  s = "x86";
#define DH_CPU_FEATURE(name) \
  if (__builtin_cpu_supports(name)) s += " " name;
  DH_CPU_FEATURE("sse4.2")
  DH_CPU_FEATURE("avx")
  DH_CPU_FEATURE("avx2")
  DH_CPU_FEATURE("fma")
  DH_CPU_FEATURE("bmi2")
  DH_CPU_FEATURE("avx512f")
  DH_CPU_FEATURE("avx512vl")
  DH_CPU_FEATURE("avx512dq")
  DH_CPU_FEATURE("avx512bw")
  DH_CPU_FEATURE("avx512vnni")
  DH_CPU_FEATURE("avx512vbmi")
  DH_CPU_FEATURE("avx512vbmi2")
  DH_CPU_FEATURE("avx512bf16")
  DH_CPU_FEATURE("avx512fp16")
#undef DH_CPU_FEATURE
#elif defined(__aarch64__)
  s = fmt::format("aarch64 hwcap={:x} hwcap2={:x}", getauxval(AT_HWCAP), getauxval(AT_HWCAP2));
#else
  s = "unknown";
#endif
  return s;
}

std::string CompileCachePath(const std::string& cache_dir, const std::string& model_dir,
                             const LoadOptions& options, const std::string& backend_name) {
  std::error_code ec;
  fs::path real = fs::weakly_canonical(fs::absolute(model_dir, ec), ec);
  if (ec) real = fs::path(model_dir);
  std::string base = real.filename().string();
  if (base.empty()) base = real.parent_path().filename().string();
  std::string clean;
  for (char c : base) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (clean.size() < 64) clean += ok ? c : '_';
  }
  if (clean.empty() || clean[0] == '.') clean = "model" + clean;
  const std::string id =
      fmt::format("{}\n{}\n{}", real.string(), backend_name, WeightOptionLines(options));
  return fmt::format("{}/{}-{:016x}{}", cache_dir, clean, XXH3_64bits(id.data(), id.size()),
                     kCompileCacheExtension);
}

Result<std::string> CompileCacheKey(const std::string& model_dir, const LoadOptions& options,
                                    const std::string& backend_name) {
  return KeyWithFeatures(model_dir, options, backend_name);
}

Result<size_t> CheckCompileCacheFile(const std::string& path, const std::string& expected_key) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (f.fd < 0) {
    if (errno == ENOENT) return NotFound("{}: no such file", path);
    return IoError("{}: open failed: {}", path, ErrnoText(errno));
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return InvalidArgument("{}: not a regular file", path);
  }
  bool stale = false;
  auto idx = ReadIndex(f.fd, static_cast<uint64_t>(st.st_size), path, expected_key, &stale);
  if (!idx.ok()) return idx.status().WithContext(path);
  return idx->table.entries.size();
}

Result<std::unique_ptr<Model>> LoadModelWithCompileCache(const std::string& dir,
                                                         const ModelConfig& config,
                                                         const ModelFactory& factory,
                                                         Backend& backend,
                                                         const LoadOptions& options) {
  using O = CompileCacheResult::Outcome;
  const CompileCacheOptions& cc = options.compile_cache;
  CompileCacheResult local;
  CompileCacheResult& res = cc.result != nullptr ? *cc.result : local;
  res = CompileCacheResult();
  if (cc.dir.empty()) return LoadFromCheckpoint(dir, config, factory, backend, options, nullptr);
  res.path = CompileCachePath(cc.dir, dir, options, backend.name());
  auto key = CompileCacheKey(dir, options, backend.name());
  if (!key.ok()) {
    // The checkpoint load reports the real problem (a missing config, an unreadable shard).
    res.outcome = O::kNotUsed;
    res.reason = key.status().message();
    return LoadFromCheckpoint(dir, config, factory, backend, options, nullptr);
  }
  struct stat st;
  const bool exists = ::stat(res.path.c_str(), &st) == 0;
  res.outcome = exists ? O::kNotUsed : O::kAbsent;
  if (exists && !cc.force) {
    const auto start = std::chrono::steady_clock::now();
    bool stale = false;
    uint64_t bytes = 0;
    auto model = ServeFromCache(res.path, *key, config, factory, backend, options, &stale, &bytes);
    if (model.ok()) {
      res.outcome = O::kHit;
      res.file_bytes = bytes;
      DH_LOG(Info, "compile cache: loaded {} ({}, {}) in {:.2f} s", res.path, SizeText(bytes),
             options.file.use_mmap ? "mapped" : "read", SecondsSince(start));
      return model;
    }
    res.reason = model.status().message();
    DH_LOG(Warning, "compile cache: not using {}: {}; loading the checkpoint", res.path,
           res.reason);
  } else if (!exists) {
    DH_LOG(Debug, "compile cache: no {}", res.path);
  }
  using W = CompileCacheOptions::Write;
  const bool write = cc.write == W::kAlways || (cc.write == W::kReplaceStale && exists);
  if (!write) return LoadFromCheckpoint(dir, config, factory, backend, options, nullptr);

  CacheWriter writer(res.path, backend);
  if (Status open = writer.Open(); !open.ok()) {
    res.outcome = O::kWriteFailed;
    res.reason = open.message();
    DH_LOG(Warning, "compile cache: cannot write {}: {}", res.path, res.reason);
    return LoadFromCheckpoint(dir, config, factory, backend, options, nullptr);
  }
  DH_LOG(Info, "compile cache: {} {}", exists ? "rebuilding" : "writing", res.path);
  DH_ASSIGN_OR_RETURN(ModelPtr model,
                      LoadFromCheckpoint(dir, config, factory, backend, options, &writer));
  const auto start = std::chrono::steady_clock::now();
  auto bytes = writer.Commit(*key);
  res.write_seconds = SecondsSince(start);
  if (bytes.ok()) {
    res.outcome = O::kWritten;
    res.file_bytes = *bytes;
    DH_LOG(Info, "compile cache: wrote {} ({}; key, table and sync {:.1f} s)", res.path,
           SizeText(*bytes), res.write_seconds);
  } else {
    res.outcome = O::kWriteFailed;
    res.reason = bytes.status().message();
    DH_LOG(Warning, "compile cache: not written: {}", res.reason);
  }
  return model;
}

}  // namespace dh
