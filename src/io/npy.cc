// .npy writer (version 1.0, header padded so the data starts at a multiple of 64 bytes) and a
// validating reader for versions 1.0-3.0 with a small parser for the header's Python dict.
#include "io/npy.h"

#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "base/checked_math.h"
#include "base/mapped_file.h"

namespace dh {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kMaxNpyHeader = 1 << 16;

std::optional<std::string_view> Descr(DType t) {
  switch (t) {
    case DType::kF32:
      return "<f4";
    case DType::kI32:
      return "<i4";
    case DType::kI64:
      return "<i8";
    default:
      return std::nullopt;
  }
}

// Reads the header dict {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } written by
// NumPy: keys in any order, single or double quotes, optional trailing commas.
class DictParser {
 public:
  explicit DictParser(std::string_view s) : s_(s) {}

  bool Parse(std::string* descr, std::optional<bool>* fortran,
             std::optional<std::vector<int64_t>>* shape) {
    if (!Eat('{')) return false;
    while (true) {
      if (Eat('}')) return true;
      std::string key;
      if (!String(&key) || !Eat(':')) return false;
      if (key == "descr") {
        if (!String(descr)) return false;
      } else if (key == "fortran_order") {
        if (Word("True")) {
          *fortran = true;
        } else if (Word("False")) {
          *fortran = false;
        } else {
          return false;
        }
      } else if (key == "shape") {
        std::vector<int64_t> dims;
        if (!Tuple(&dims)) return false;
        *shape = std::move(dims);
      } else {
        return false;
      }
      if (!Eat(',') && !Peek('}')) return false;
    }
  }

 private:
  void Skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n')) ++pos_;
  }
  bool Peek(char c) {
    Skip();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  bool Eat(char c) {
    if (!Peek(c)) return false;
    ++pos_;
    return true;
  }
  bool Word(std::string_view w) {
    Skip();
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  bool String(std::string* out) {
    Skip();
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) return false;
    const char q = s_[pos_++];
    size_t end = s_.find(q, pos_);
    if (end == std::string_view::npos) return false;
    out->assign(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return true;
  }
  bool Tuple(std::vector<int64_t>* dims) {
    if (!Eat('(')) return false;
    while (!Eat(')')) {
      Skip();
      int64_t v = 0;
      size_t digits = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        if (++digits > 15) return false;  // keeps v far from overflow
        v = v * 10 + (s_[pos_++] - '0');
      }
      if (digits == 0) return false;
      dims->push_back(v);
      if (!Eat(',') && !Peek(')')) return false;
    }
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

Status WriteNpy(const std::string& path, DType dtype, const void* data,
                std::span<const int64_t> shape) {
  auto descr = Descr(dtype);
  if (!descr) {
    return Unsupported("{}: .npy output supports f32, i32 and i64, not {}", path, DTypeName(dtype));
  }
  auto numel = CheckedProduct(shape);
  auto nbytes = numel ? CheckedMul(*numel, DTypeSize(dtype)) : std::nullopt;
  if (!nbytes) return InvalidArgument("{}: invalid shape for .npy output", path);

  std::string shape_text = "(";
  for (size_t i = 0; i < shape.size(); ++i) shape_text += fmt::format("{}, ", shape[i]);
  if (shape.size() > 1) shape_text.resize(shape_text.size() - 2);  // (2, 3) but (4,)
  if (shape.size() == 1) shape_text.pop_back();
  shape_text += ")";
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", *descr, shape_text);
  // magic(6) + version(2) + length(2) + header + '\n' is a multiple of 64.
  const size_t total = kMagicLen + 4 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');

  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!f) return IoError("{}: cannot open for writing", path);
  const uint8_t prefix[4] = {1, 0, static_cast<uint8_t>(header.size() & 0xff),
                             static_cast<uint8_t>(header.size() >> 8)};
  bool ok = std::fwrite(kMagic, 1, kMagicLen, f.get()) == kMagicLen &&
            std::fwrite(prefix, 1, 4, f.get()) == 4 &&
            std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
  if (ok && *nbytes > 0) ok = std::fwrite(data, 1, *nbytes, f.get()) == *nbytes;
  if (!ok || std::fclose(f.release()) != 0) return IoError("{}: write failed", path);
  return Status::Ok();
}

Result<NpyArray> ReadNpy(const std::string& path) {
  DH_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path, {.use_mmap = false}));
  const uint8_t* p = file->data();
  const size_t size = file->size();
  if (size < kMagicLen + 4 || std::memcmp(p, kMagic, kMagicLen) != 0) {
    return InvalidArgument("{}: not a .npy file (missing the \\x93NUMPY magic)", path);
  }
  const int major = p[6];
  size_t header_len, header_start;
  if (major == 1) {
    header_len = p[8] | (size_t{p[9]} << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return InvalidArgument("{}: truncated .npy header", path);
    header_len = p[8] | (size_t{p[9]} << 8) | (size_t{p[10]} << 16) | (size_t{p[11]} << 24);
    header_start = 12;
  } else {
    return Unsupported("{}: .npy format version {}.{} (expected 1.0, 2.0 or 3.0)", path, major,
                       p[7]);
  }
  if (header_len > kMaxNpyHeader || header_len > size - header_start) {
    return InvalidArgument("{}: .npy header length {} runs past the end of the file", path,
                           header_len);
  }
  std::string_view header(reinterpret_cast<const char*>(p) + header_start, header_len);
  std::string descr;
  std::optional<bool> fortran;
  std::optional<std::vector<int64_t>> shape;
  if (!DictParser(header).Parse(&descr, &fortran, &shape) || descr.empty() || !fortran || !shape) {
    return InvalidArgument("{}: malformed .npy header (expected descr, fortran_order and shape)",
                           path);
  }
  if (*fortran) return Unsupported("{}: fortran_order True .npy arrays are not supported", path);
  NpyArray out;
  if (descr == "<f4") {
    out.dtype = DType::kF32;
  } else if (descr == "<i4") {
    out.dtype = DType::kI32;
  } else if (descr == "<i8") {
    out.dtype = DType::kI64;
  } else {
    return Unsupported("{}: .npy dtype '{}' (expected <f4, <i4 or <i8)", path, descr);
  }
  out.shape = std::move(*shape);
  auto numel = CheckedProduct(out.shape);
  auto nbytes = numel ? CheckedMul(*numel, DTypeSize(out.dtype)) : std::nullopt;
  const size_t data_start = header_start + header_len;
  if (!nbytes || *nbytes != size - data_start) {
    return InvalidArgument("{}: .npy data is {} bytes but shape and dtype '{}' need {}", path,
                           size - data_start, descr,
                           nbytes ? fmt::format("{}", *nbytes) : std::string("an overflow"));
  }
  out.bytes.assign(p + data_start, p + size);
  return out;
}

}  // namespace dh
