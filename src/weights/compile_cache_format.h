// The compile cache file format (compile_cache.h has the layout): the header, the table's
// entries and their encoding, the weight layout invariants, and hashing. Shared by the reader and
// the writer; nothing here touches files.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/weight.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace dh::compile_cache {

inline constexpr char kMagic[8] = {'D', 'H', 'C', 'A', 'C', 'H', 'E', '\0'};
inline constexpr uint32_t kEndianMark = 0x01020304u;
inline constexpr uint64_t kDataStart = 4096;            // first data byte (header padded to a page)
inline constexpr uint64_t kMinBlobAlignment = 64;       // accepted on read
inline constexpr uint64_t kMaxKeyBytes = 64ull << 20;   // limits checked before allocating
inline constexpr uint64_t kMaxTableBytes = 1ull << 30;
// data, scales, zeros, perm, and the backend's own copy (Weight::packed; kPackedSlot).
inline constexpr int kNumSlots = 5;
inline constexpr int kPackedSlot = 4;
inline constexpr const char* kSlotNames[kNumSlots] = {"data", "scales", "zeros", "perm",
                                                      "packed"};

// Whether Weight has exactly the fields this format stores. If Weight gains a field, the cache
// refuses to read or write (a log line, a normal load) until the serializer learns it.
bool WeightLayoutKnown();

std::array<Tensor*, kNumSlots> Slots(Weight& w);
std::array<const Tensor*, kNumSlots> Slots(const Weight& w);

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

std::array<uint8_t, 16> Hash128(const void* p, size_t n);
std::string Hex(const void* p, size_t n);
std::string HashHex(std::string_view bytes);
inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct SlotInfo {
  bool present = false;
  // False for a row slot (data, scales, zeros) kept as dtype and shape only: the weight's packed
  // copy serves every product (Backend::PackedServesEveryProduct), so its row bytes are not in
  // the file and the loaded weight has Weight::rows_released set. offset and nbytes are then 0.
  bool stored = true;
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
  uint8_t zero_offset = 0;  // kInt4
  std::array<SlotInfo, kNumSlots> slots;
};

// Appends little-endian fields to a byte vector.
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

void EncodeEntry(const Entry& e, ByteSink& out);
// A Tensor over `base` + slot offset (base may be null while only checking layouts). A slot kept
// as its shape only gets the packed copy's bytes (`packed_at`), never read through this tensor.
Tensor SlotTensor(const SlotInfo& s, const uint8_t* base, const uint8_t* packed_at = nullptr);
Weight EntryWeight(const Entry& e, const uint8_t* data_base);
std::string TensorDesc(const Tensor& t);
// The invariants backend/weight.h states for each format, so that kernels given this weight never
// read outside its tensors. Checked when a weight is written and again when it is read.
Status CheckWeightLayout(const Weight& w, const std::string& name);

struct ParsedTable {
  std::vector<std::pair<std::string, std::string>> meta;
  std::vector<std::string> names;  // checkpoint tensor names (Has)
  std::vector<Entry> entries;
};

// Decodes and validates the table against a data region of `data_bytes`.
Result<ParsedTable> ParseTable(std::span<const uint8_t> table, uint64_t data_bytes);

}  // namespace dh::compile_cache
