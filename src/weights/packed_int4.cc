// AWQ / GPTQ int4 -> kInt4 conversion. Every shape, dtype and index is checked before anything
// is allocated; errors name the checkpoint file, the tensor and the value.
#include "weights/packed_int4.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace dh {
namespace {

// AWQ's GEMM packing: nibble i (bits 4i..4i+3) of word j holds output column 8j + kAwqOrder[i].
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

int32_t ReadI32(const TensorInfo& t, int64_t i) {
  int32_t v;
  std::memcpy(&v, t.data + i * 4, 4);
  return v;
}

uint32_t ReadU32(const TensorInfo& t, int64_t i) { return static_cast<uint32_t>(ReadI32(t, i)); }

float ReadScale(const TensorInfo& t, int64_t i) {
  uint16_t h;
  std::memcpy(&h, t.data + i * 2, 2);
  return t.dtype == DType::kF16 ? F16ToF32(h) : BF16ToF32(h);
}

// The common "<file>: tensor '<name>' has shape S, expected E (<layout>)" error.
Status ShapeError(const TensorInfo& t, std::initializer_list<int64_t> want, const std::string& why) {
  return InvalidArgument("{}: tensor '{}' has shape {}, expected {} ({})", t.file, t.name,
                         t.ShapeString(), FormatShape(want), why);
}

Status DTypeError(const TensorInfo& t, const char* want) {
  return InvalidArgument("{}: tensor '{}' has dtype {}, expected {}", t.file, t.name,
                         SafetensorsDTypeName(t.dtype), want);
}

uint16_t ReadScaleBits(const TensorInfo& t, int64_t i) {
  uint16_t h;
  std::memcpy(&h, t.data + i * 2, 2);
  return h;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Weight Int4Host::View() {
  Weight w;
  w.format = WeightFormat::kInt4;
  w.rows = rows;
  w.cols = cols;
  w.group_size = group_size;
  w.zero_offset = zero_offset;
  const int64_t groups = cols / group_size;
  w.data = Tensor(codes.data(), DType::kU8, {rows, cols / 2});
  w.scales = Tensor(scales.data(), DType::kF16, {rows, groups});
  w.zeros = Tensor(zeros.data(), DType::kU8, {rows, CeilDiv(groups, 2)});
  if (!perm.empty()) w.perm = Tensor(perm.data(), DType::kI32, {cols});
  return w;
}

std::vector<float> Int4Host::Dequantize() const {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  const int64_t groups = cols / group_size, zero_bytes = CeilDiv(groups, 2);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = codes[r * (cols / 2) + c / 2];
      const int q = (c & 1) ? byte >> 4 : byte & 15;
      const int64_t g = c / group_size;
      const int z = ZeroNibble(zeros.data() + r * zero_bytes, g) + zero_offset;
      const int64_t dst = perm.empty() ? c : perm[c];
      out[r * cols + dst] = static_cast<float>(q - z) * F16ToF32(scales[r * groups + g]);
    }
  }
  return out;
}

Result<std::vector<int32_t>> ActOrderPermutation(std::span<const int32_t> g_idx, int group_size,
                                                 int64_t num_groups, const std::string& what) {
  const int64_t cols = static_cast<int64_t>(g_idx.size());
  std::vector<int64_t> count(static_cast<size_t>(num_groups), 0);
  bool identity = true;
  for (int64_t c = 0; c < cols; ++c) {
    const int32_t g = g_idx[c];
    if (g < 0 || g >= num_groups) {
      return InvalidArgument("{}: g_idx[{}] = {} is outside [0, {}) (the number of groups)", what, c,
                             g, num_groups);
    }
    ++count[g];
    identity = identity && g == c / group_size;
  }
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t want = std::min<int64_t>(group_size, cols - g * group_size);
    if (count[g] != want) {
      return InvalidArgument(
          "{}: group {} has {} input columns in g_idx, expected {} (group_size {}, {} columns)",
          what, g, count[g], want, group_size, cols);
    }
  }
  if (identity) return std::vector<int32_t>();
  // Stable counting sort: columns of group g occupy [g * group_size, +count) in input order.
  std::vector<int64_t> next(static_cast<size_t>(num_groups));
  for (int64_t g = 0; g < num_groups; ++g) next[g] = g * group_size;
  std::vector<int32_t> perm(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) perm[next[g_idx[c]]++] = static_cast<int32_t>(c);
  return perm;
}

// Exactness. The checkpoint's value is (q - z) * s with a 4-bit code q in [0, 15], an integer
// zero point z (AWQ and gptq_v2: the stored nibble, 0..15; GPTQ v1: the stored nibble + 1, 1..16)
// and an f16 or bf16 scale s. We keep q, the stored zero nibble (zero_offset 1 for GPTQ v1) and
// s as f16: an f16 scale is kept bit for bit, a bf16 one (8 significant bits) converts exactly
// whenever it lies in f16's normal range [2^-14, 65504] (below, it is rounded and counted in
// inexact_scales; above, it is an error). Every decoder computes (q - z) * s, or q * s - z * s:
// q * s and z * s have at most 16 significant bits, exact in f32, and so is their difference
// (q - z) * s: no value is rounded. The tests check this bit for bit.
Result<Int4Host> ConvertPackedInt4(const QuantizationConfig& q, const PackedInt4Tensors& t,
                                   int64_t rows, int64_t cols) {
  if (t.qweight == nullptr) return InvalidArgument("packed int4 weight without qweight");
  const TensorInfo& qw = *t.qweight;
  const std::string base = qw.name.size() > 8 && qw.name.ends_with(".qweight")
                               ? qw.name.substr(0, qw.name.size() - 8)
                               : qw.name;
  const bool awq = q.method == "awq";
  if (!awq && q.method != "gptq") {
    return InvalidArgument(
        "{}: tensor '{}' is a packed int4 weight but config.json "
        "quantization_config.quant_method is '{}' (expected awq or gptq)",
        qw.file, qw.name, q.method);
  }
  if (q.bits != 4) {
    return Unsupported("{}: tensor '{}': quantization_config.bits {} is not supported (expected 4)",
                       qw.file, qw.name, q.bits);
  }
  for (const auto& [tensor, suffix] :
       {std::pair{t.qzeros, ".qzeros"}, std::pair{t.scales, ".scales"}}) {
    if (tensor == nullptr) {
      return InvalidArgument("{}: tensor '{}' has no companion '{}{}'", qw.file, qw.name, base,
                             suffix);
    }
  }
  const TensorInfo& qz = *t.qzeros;
  const TensorInfo& sc = *t.scales;
  // -1: one group over the whole input dimension.
  const int64_t group = q.group_size == -1 ? cols : q.group_size;
  if (group <= 0 || cols % group != 0) {
    return InvalidArgument(
        "{}: tensor '{}': in_features {} is not divisible by quantization_config.group_size {}",
        qw.file, qw.name, cols, q.group_size);
  }
  if (cols % 8 != 0 || rows % 8 != 0) {
    return InvalidArgument(
        "{}: tensor '{}': a {} x {} projection (out_features x in_features) cannot be packed "
        "eight 4-bit values per int32 (both must be divisible by 8)",
        qw.file, qw.name, rows, cols);
  }
  const int64_t groups = cols / group;
  const std::string method = awq ? "AWQ" : "GPTQ";
  if (qw.dtype != DType::kI32) return DTypeError(qw, "I32 (eight 4-bit codes per word)");
  if (qz.dtype != DType::kI32) return DTypeError(qz, "I32 (eight 4-bit zero points per word)");
  if (sc.dtype != DType::kF16 && sc.dtype != DType::kBF16) return DTypeError(sc, "F16 or BF16");
  const std::string proj = fmt::format("for a projection of {} outputs x {} inputs", rows, cols);
  if (awq) {
    if (!qw.HasShape({cols, rows / 8})) {
      return ShapeError(qw, {cols, rows / 8}, "AWQ qweight [in_features, out_features / 8] " + proj);
    }
  } else if (!qw.HasShape({cols / 8, rows})) {
    return ShapeError(qw, {cols / 8, rows}, "GPTQ qweight [in_features / 8, out_features] " + proj);
  }
  const std::string group_note =
      fmt::format("{} qzeros [in_features / group_size, out_features / 8] with group_size {} {}",
                  method, group, proj);
  if (!qz.HasShape({groups, rows / 8})) return ShapeError(qz, {groups, rows / 8}, group_note);
  if (!sc.HasShape({groups, rows})) {
    return ShapeError(sc, {groups, rows},
                      fmt::format("{} scales [in_features / group_size, out_features] with "
                                  "group_size {} {}",
                                  method, group, proj));
  }
  std::vector<int32_t> perm;
  if (!awq && t.g_idx != nullptr) {
    const TensorInfo& gi = *t.g_idx;
    if (gi.dtype != DType::kI32 && gi.dtype != DType::kI64) return DTypeError(gi, "I32 or I64");
    if (!gi.HasShape({cols})) return ShapeError(gi, {cols}, "GPTQ g_idx [in_features]");
    std::vector<int32_t> g(static_cast<size_t>(cols));
    for (int64_t c = 0; c < cols; ++c) {
      int64_t v;
      if (gi.dtype == DType::kI32) {
        v = ReadI32(gi, c);
      } else {
        std::memcpy(&v, gi.data + c * 8, 8);
      }
      if (v < 0 || v >= groups) {
        return InvalidArgument(
            "{}: tensor '{}': g_idx[{}] = {} is outside [0, {}) (in_features {} / group_size {})",
            gi.file, gi.name, c, v, groups, cols, group);
      }
      g[c] = static_cast<int32_t>(v);
    }
    DH_ASSIGN_OR_RETURN(perm, ActOrderPermutation(g, static_cast<int>(group), groups,
                                                  fmt::format("{}: tensor '{}'", gi.file, gi.name)));
  } else if (!awq && q.desc_act && groups > 1) {
    return InvalidArgument(
        "{}: tensor '{}': quantization_config.desc_act is true but '{}.g_idx' is missing", qw.file,
        qw.name, base);
  }
  // Scales (checked before allocating the outputs).
  for (int64_t i = 0; i < groups * rows; ++i) {
    const float s = ReadScale(sc, i);
    if (!std::isfinite(s) || std::fabs(s) > 65504.0f) {
      return InvalidArgument(
          "{}: tensor '{}': scale {} at [{}, {}] is not finite or beyond f16's range (65504)",
          sc.file, sc.name, s, i / rows, i % rows);
    }
  }

  Int4Host out;
  out.rows = rows;
  out.cols = cols;
  out.group_size = static_cast<int>(group);
  out.codes.assign(static_cast<size_t>(rows * (cols / 2)), 0);
  const int64_t zero_bytes = CeilDiv(groups, 2);
  out.scales.resize(static_cast<size_t>(rows * groups));
  out.zeros.assign(static_cast<size_t>(rows * zero_bytes), 0);
  // Codes in the checkpoint's input order first. Our row r holds input k's code in byte k / 2,
  // low nibble for even k, which is exactly how a GPTQ word [p][r] holds inputs 8p..8p+7 in its
  // little-endian bytes: each word is copied whole. AWQ words run along the outputs, so pairs of
  // input rows are combined into bytes and transposed.
  const int64_t words = rows / 8, row_bytes = cols / 2;
  uint8_t* codes = out.codes.data();
  if (awq) {
    constexpr int64_t kBlock = 64;  // input rows per tile: 32 output bytes per row stay in cache
    for (int64_t k0 = 0; k0 < cols; k0 += kBlock) {
      const int64_t k1 = std::min(cols, k0 + kBlock);
      for (int64_t j = 0; j < words; ++j) {
        for (int64_t k = k0; k < k1; k += 2) {
          const uint32_t lo = ReadU32(qw, k * words + j), hi = ReadU32(qw, (k + 1) * words + j);
          for (int i = 0; i < 8; ++i) {
            codes[(8 * j + kAwqOrder[i]) * row_bytes + k / 2] =
                static_cast<uint8_t>(((lo >> (4 * i)) & 15u) | (((hi >> (4 * i)) & 15u) << 4));
          }
        }
      }
    }
  } else {
    constexpr int64_t kBlock = 64;  // output rows per tile
    for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
      const int64_t r1 = std::min(rows, r0 + kBlock);
      for (int64_t p = 0; p < cols / 8; ++p) {
        const uint8_t* src = qw.data + p * rows * 4;
        for (int64_t r = r0; r < r1; ++r) {
          std::memcpy(codes + r * row_bytes + 4 * p, src + 4 * r, 4);
        }
      }
    }
  }
  if (!perm.empty()) {
    // Act-order: column c of row r takes the code of input perm[c].
    std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* dst = codes + r * row_bytes;
      std::memcpy(row.data(), dst, row.size());
      auto code = [&](int64_t k) { return (row[k / 2] >> ((k & 1) * 4)) & 15; };
      for (int64_t c = 0; c < cols; c += 2) {
        dst[c / 2] = static_cast<uint8_t>(code(perm[c]) | (code(perm[c + 1]) << 4));
      }
    }
  }
  out.zero_offset = !awq && q.checkpoint_format == "gptq" ? 1 : 0;  // v1 stores zero - 1
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t j = 0; j < words; ++j) {
      const uint32_t w = ReadU32(qz, g * words + j);
      for (int i = 0; i < 8; ++i) {
        const int64_t r = 8 * j + (awq ? kAwqOrder[i] : i);
        out.zeros[r * zero_bytes + g / 2] |=
            static_cast<uint8_t>(((w >> (4 * i)) & 15u) << ((g & 1) * 4));
        uint16_t h = ReadScaleBits(sc, g * rows + r);
        if (sc.dtype == DType::kBF16) {
          const float f = BF16ToF32(h);
          h = F32ToF16(f);
          if (F16ToF32(h) != f) ++out.inexact_scales;
        }
        out.scales[r * groups + g] = h;
      }
    }
  }
  out.perm = std::move(perm);
  return out;
}

}  // namespace dh
