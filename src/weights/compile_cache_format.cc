// The compile cache file format: hashing, entry encoding, layout checks, table parsing.
#include "weights/compile_cache_format.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <xxhash.h>

#include "base/checked_math.h"

namespace dh::compile_cache {
namespace {

// The fields of Weight this file stores. If Weight gains a field, sizeof(Weight) changes and the
// cache refuses to read or write (a log line, a normal load) until the serializer learns it.
struct KnownWeightFields {
  WeightFormat format;
  Tensor data, scales, zeros;
  int64_t rows, cols;
  int block_rows, block_cols, group_size, zero_offset;
  Tensor perm;
  Tensor packed;  // stored as it is (the backend checks it at load: Backend::PrepareWeight)
  // Not stored: the model sets it after loading (MLA's kv_b_proj, model/arch/deepseek.cc), and the
  // loader on tensor-parallel FP8 slices, which the cache does not serve.
  bool exact_x;
  // read_by_rows: not stored, the loader decides it at each load. rows_released: not stored as
  // such (the writer's loader keeps every weight's rows, WeightLoader::keep_rows_, and a released
  // weight is refused); a weight whose packed copy serves every product is stored with its row
  // slots as shapes only, and is read back with rows_released set.
  bool read_by_rows, rows_released;
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

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

bool WeightLayoutKnown() { return sizeof(Weight) == sizeof(KnownWeightFields); }

std::array<Tensor*, kNumSlots> Slots(Weight& w) {
  return {&w.data, &w.scales, &w.zeros, &w.perm, &w.packed};
}
std::array<const Tensor*, kNumSlots> Slots(const Weight& w) {
  return {&w.data, &w.scales, &w.zeros, &w.perm, &w.packed};
}

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

void EncodeEntry(const Entry& e, ByteSink& out) {
  out.Str(e.name);
  out.U8(static_cast<uint8_t>(e.kind));
  out.Str(WeightFormatName(e.format));
  out.I64(e.rows);
  out.I64(e.cols);
  out.I32(e.block_rows);
  out.I32(e.block_cols);
  out.I32(e.group_size);
  out.U8(e.zero_offset);
  out.U8(kNumSlots);
  for (const SlotInfo& s : e.slots) {
    // 0: absent; 1: dtype, shape and bytes; 2: dtype and shape only (SlotInfo::stored).
    out.U8(!s.present ? 0 : s.stored ? 1 : 2);
    if (!s.present) continue;
    out.Str(DTypeName(s.dtype));
    out.U8(static_cast<uint8_t>(s.ndim));
    for (int d = 0; d < s.ndim; ++d) out.I64(s.shape[d]);
    if (!s.stored) continue;
    out.U64(s.offset);
    out.U64(s.nbytes);
  }
}

Tensor SlotTensor(const SlotInfo& s, const uint8_t* base, const uint8_t* packed_at) {
  Tensor t;
  if (!s.present) return t;
  const uint8_t* at = !s.stored ? packed_at : base ? base + s.offset : nullptr;
  t.data = const_cast<uint8_t*>(at ? at : reinterpret_cast<const uint8_t*>(64));
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
  w.zero_offset = e.zero_offset;
  const SlotInfo& packed = e.slots[kPackedSlot];
  const uint8_t* packed_at = packed.present && data_base ? data_base + packed.offset : nullptr;
  auto slots = Slots(w);
  for (int i = 0; i < kNumSlots; ++i) {
    *slots[i] = SlotTensor(e.slots[i], data_base, packed_at);
    if (e.slots[i].present && !e.slots[i].stored) w.rows_released = true;
  }
  return w;
}

std::string TensorDesc(const Tensor& t) {
  if (t.empty()) return "absent";
  return fmt::format("{} {}", DTypeName(t.dtype), t.ShapeString());
}

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
      DH_RETURN_IF_ERROR(absent("zeros", w.zeros));
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
      DH_RETURN_IF_ERROR(absent("zeros", w.zeros));
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
      if (!TensorIs(w.scales, DType::kF16, {w.rows, groups})) {
        return bad("scales", w.scales, fmt::format("f16 [{}, {}]", w.rows, groups));
      }
      if (int4) {
        const int64_t zero_bytes = CeilDiv(groups, 2);
        if (!TensorIs(w.zeros, DType::kU8, {w.rows, zero_bytes})) {
          return bad("zeros", w.zeros, fmt::format("u8 [{}, {}]", w.rows, zero_bytes));
        }
        if (w.zero_offset != 0 && w.zero_offset != 1) {
          return InvalidArgument("weight '{}': zero offset {}, expected 0 or 1", name,
                                 w.zero_offset);
        }
      } else {
        DH_RETURN_IF_ERROR(absent("zeros", w.zeros));
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
  // The backend's own copy: opaque bytes here, checked by the backend that reads them.
  if (!w.packed.empty() &&
      (w.packed.dtype != DType::kU8 || w.packed.ndim != 1 || w.packed.shape[0] <= 0 ||
       !w.packed.contiguous())) {
    return bad("packed", w.packed, "u8 [n]");
  }
  return Status::Ok();
}

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
    e.zero_offset = in.U8("zero_offset");
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
      const uint8_t flag = in.U8("slot flag");
      if (flag > 2) return fail(fmt::format("'{}' {}: slot flag {}", e.name, kSlotNames[s], flag));
      slot.present = flag != 0;
      slot.stored = flag == 1;
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
      if (slot.stored) {
        slot.offset = in.U64("offset");
        slot.nbytes = in.U64("size");
      }
      if (!in.ok()) break;
      auto numel = CheckedProduct(std::span<const int64_t>(slot.shape.data(), slot.ndim));
      auto bytes = numel ? CheckedMul(*numel, DTypeSize(slot.dtype)) : std::nullopt;
      if (!slot.stored) {
        if (!bytes) {
          return fail(fmt::format("'{}' {}: shape overflows", e.name, kSlotNames[s]));
        }
        continue;
      }
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
    // Rows kept as shapes only: all of them (data, scales, zeros), never perm, beside a packed
    // copy whose bytes are in the file.
    int shape_only = 0, row_slots = 0;
    for (int s = 0; s < kNumSlots; ++s) {
      if (!e.slots[s].present) continue;
      if (s < 3) ++row_slots;
      if (!e.slots[s].stored) ++shape_only;
      if (!e.slots[s].stored && s >= 3) {
        return fail(fmt::format("'{}' {}: only row slots may be kept as shapes", e.name,
                                kSlotNames[s]));
      }
    }
    if (shape_only > 0 && (shape_only != row_slots || e.kind != EntryKind::kWeight ||
                           !e.slots[kPackedSlot].present || e.slots[kPackedSlot].nbytes == 0)) {
      return fail(fmt::format("'{}': rows kept as shapes need every row slot so and a packed copy",
                              e.name));
    }
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

}  // namespace dh::compile_cache
