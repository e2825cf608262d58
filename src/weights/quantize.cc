// Quantizers and dequantizers for the int8 / int4 weight formats (see quantize.h).
#include "weights/quantize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "backend/weight_rows.h"
#include "base/check.h"
#include "tensor/dtype.h"

namespace dh {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

std::string_view QuantSpecNames() {
  return "none, int8 (= int8-g32), int8-g32, int8-row, int4 (= int4-g32), int4-g32, int4-g128, "
         "fp8 (e4m3, 128x128 block scales)";
}

Result<QuantSpec> ParseQuantSpec(std::string_view name) {
  QuantSpec s;
  if (name == "none" || name.empty()) return s;
  s.enabled = true;
  if (name == "int8" || name == "int8-g32") {
    s.format = WeightFormat::kInt8;
    s.group_size = 32;
  } else if (name == "int8-row") {
    s.format = WeightFormat::kInt8;
    s.group_size = 0;
  } else if (name == "int4" || name == "int4-g32") {
    s.format = WeightFormat::kInt4;
    s.group_size = 32;
  } else if (name == "int4-g128") {
    s.format = WeightFormat::kInt4;
    s.group_size = 128;
  } else if (name == "fp8") {
    s.format = WeightFormat::kFp8Block;
    s.block_rows = 128;
    s.block_cols = 128;
  } else {
    return InvalidArgument("--quant: unknown value '{}' (expected one of: {})", name,
                           QuantSpecNames());
  }
  return s;
}

bool QuantizeInt8Row(const float* x, int64_t cols, int64_t group, int8_t* q, uint16_t* scales) {
  DH_CHECK(group > 0, "int8 group size {}", group);
  bool ok = true;
  for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += group, ++gi) {
    const int64_t g1 = std::min(cols, g0 + group);
    float amax = 0.0f;
    for (int64_t c = g0; c < g1; ++c) amax = std::max(amax, std::fabs(x[c]));
    scales[gi] = F32ToF16(amax / 127.0f);
    // Codes against the scale as stored, so the f16 rounding of the scale is not paid twice.
    const float scale = F16ToF32(scales[gi]);
    ok = ok && std::isfinite(scale);
    for (int64_t c = g0; c < g1; ++c) {
      const float v = scale > 0.0f && std::isfinite(scale) ? std::nearbyint(x[c] / scale) : 0.0f;
      q[c] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
  }
  return ok;
}

bool QuantizeInt4Row(const float* x, int64_t cols, int64_t group, uint8_t* q, uint16_t* scales,
                     uint8_t* zeros) {
  DH_CHECK(group > 0 && (group % 2 == 0 || group >= cols), "int4 group size {} for {} columns",
           group, cols);
  std::fill(q, q + CeilDiv(cols, 2), uint8_t{0});
  std::fill(zeros, zeros + CeilDiv(CeilDiv(cols, group), 2), uint8_t{0});
  bool ok = true;
  for (int64_t g0 = 0, gi = 0; g0 < cols; g0 += group, ++gi) {
    const int64_t g1 = std::min(cols, g0 + group);
    float lo = 0.0f, hi = 0.0f;
    for (int64_t c = g0; c < g1; ++c) {
      lo = std::min(lo, x[c]);
      hi = std::max(hi, x[c]);
    }
    // The zero point whose grid [-z * s, (15 - z) * s] holds [lo, hi] with the smallest s.
    int z = 0;
    float s = 0.0f;
    if (hi > lo) {
      s = INFINITY;
      for (int cand = 0; cand <= 15; ++cand) {
        const float need_lo = cand > 0 ? -lo / static_cast<float>(cand) : (lo < 0 ? INFINITY : 0);
        const float need_hi =
            cand < 15 ? hi / static_cast<float>(15 - cand) : (hi > 0 ? INFINITY : 0);
        const float need = std::max(need_lo, need_hi);
        if (need < s) {
          s = need;
          z = cand;
        }
      }
    }
    scales[gi] = F32ToF16(s);
    const float scale = F16ToF32(scales[gi]);
    ok = ok && std::isfinite(scale);
    zeros[gi / 2] |= static_cast<uint8_t>(z << ((gi & 1) * 4));
    for (int64_t c = g0; c < g1; ++c) {
      const float v = scale > 0.0f && std::isfinite(scale) ? std::nearbyint(x[c] / scale) + z
                                                           : static_cast<float>(z);
      const uint8_t n = static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f));
      q[c / 2] |= (c % 2 == 0) ? n : static_cast<uint8_t>(n << 4);
    }
  }
  return ok;
}

void QuantizeFp8Block(const float* x, int64_t rows, int64_t cols, int block_rows,
                      int block_cols, uint8_t* q, float* scales) {
  DH_CHECK(block_rows > 0 && block_cols > 0, "fp8 block {}x{}", block_rows, block_cols);
  const int64_t scols = CeilDiv(cols, block_cols);
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    const int64_t r1 = std::min(rows, r0 + block_rows);
    for (int64_t c0 = 0; c0 < cols; c0 += block_cols) {
      const int64_t c1 = std::min(cols, c0 + block_cols);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
      }
      const float scale = amax / 448.0f;
      scales[(r0 / block_rows) * scols + c0 / block_cols] = scale;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          q[r * cols + c] = scale > 0.0f ? F32ToF8E4M3(x[r * cols + c] / scale) : uint8_t{0};
        }
      }
    }
  }
}

Weight QuantizedMatrix::View() {
  Weight w;
  w.format = format;
  w.rows = rows;
  w.cols = cols;
  w.group_size = group_size;
  if (format == WeightFormat::kFp8Block) {
    w.block_rows = block_rows;
    w.block_cols = block_cols;
    w.data = Tensor(data.data(), DType::kF8E4M3, {rows, cols});
    w.scales = Tensor(scales.data(), DType::kF32, {CeilDiv(rows, block_rows), groups_per_row});
    return w;
  }
  w.data = Tensor(data.data(), format == WeightFormat::kInt8 ? DType::kI8 : DType::kU8,
                  {rows, bytes_per_row});
  w.scales = Tensor(scales_f16.data(), DType::kF16, {rows, groups_per_row});
  if (format == WeightFormat::kInt4) {
    w.zeros = Tensor(zeros.data(), DType::kU8, {rows, zero_bytes_per_row});
  }
  return w;
}

Result<QuantizedMatrix> QuantizeMatrix(std::span<const float> values, int64_t rows, int64_t cols,
                                       const QuantSpec& spec, const std::string& what) {
  if (!spec.enabled || (spec.format != WeightFormat::kInt8 && spec.format != WeightFormat::kInt4 &&
                        spec.format != WeightFormat::kFp8Block)) {
    return InvalidArgument("{}: quantization to {} is not supported", what,
                           WeightFormatName(spec.format));
  }
  if (rows <= 0 || cols <= 0 || rows > (int64_t{1} << 40) / cols ||
      static_cast<int64_t>(values.size()) != rows * cols) {
    return InvalidArgument("{}: cannot quantize {} values as a [{}, {}] matrix", what,
                           values.size(), rows, cols);
  }
  for (int64_t i = 0; i < rows * cols; ++i) {
    if (!std::isfinite(values[i])) {
      return InvalidArgument("{}: value at row {}, column {} is {}, cannot quantize", what,
                             i / cols, i % cols, values[i]);
    }
  }
  QuantizedMatrix m;
  m.format = spec.format;
  m.rows = rows;
  m.cols = cols;
  if (spec.format == WeightFormat::kFp8Block) {
    if (spec.block_rows <= 0 || spec.block_cols <= 0) {
      return InvalidArgument("{}: fp8 block {}x{} must be positive", what, spec.block_rows,
                             spec.block_cols);
    }
    m.block_rows = spec.block_rows;
    m.block_cols = spec.block_cols;
    m.groups_per_row = CeilDiv(cols, spec.block_cols);
    m.bytes_per_row = cols;
    m.data.resize(rows * cols);
    m.scales.resize(CeilDiv(rows, spec.block_rows) * m.groups_per_row);
    QuantizeFp8Block(values.data(), rows, cols, m.block_rows, m.block_cols, m.data.data(),
                     m.scales.data());
    return m;
  }
  const int64_t group = spec.group_size <= 0 ? cols : std::min<int64_t>(spec.group_size, cols);
  if (group > INT32_MAX)
    return InvalidArgument("{}: {} columns are too many for one group", what, cols);
  if (spec.format == WeightFormat::kInt4 && group % 2 != 0 && group < cols) {
    return InvalidArgument("{}: int4 group size {} must be even", what, group);
  }
  m.group_size = static_cast<int>(group);
  m.groups_per_row = CeilDiv(cols, group);
  m.bytes_per_row = spec.format == WeightFormat::kInt8 ? cols : CeilDiv(cols, 2);
  m.data.resize(rows * m.bytes_per_row);
  m.scales_f16.resize(rows * m.groups_per_row);
  if (spec.format == WeightFormat::kInt4) {
    m.zero_bytes_per_row = CeilDiv(m.groups_per_row, 2);
    m.zeros.resize(rows * m.zero_bytes_per_row);
  }
  std::atomic<int64_t> bad_row{rows};  // the first row whose scale overflows f16
  auto quantize_rows = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* x = values.data() + r * cols;
      uint16_t* s = m.scales_f16.data() + r * m.groups_per_row;
      const bool ok = spec.format == WeightFormat::kInt8
                          ? QuantizeInt8Row(x, cols, group,
                                            reinterpret_cast<int8_t*>(m.data.data()) + r * cols, s)
                          : QuantizeInt4Row(x, cols, group, m.data.data() + r * m.bytes_per_row, s,
                                            m.zeros.data() + r * m.zero_bytes_per_row);
      if (!ok) {
        int64_t cur = bad_row.load();
        while (r < cur && !bad_row.compare_exchange_weak(cur, r)) {
        }
      }
    }
  };
  // Rows are independent: split large matrices over the machine's cores (results are identical
  // to one thread).
  const int64_t threads = std::clamp<int64_t>(
      std::min<int64_t>(std::thread::hardware_concurrency(), rows * cols / (1 << 20)), 1, 16);
  std::vector<std::thread> workers;
  for (int64_t t = 1; t < threads; ++t) {
    workers.emplace_back(quantize_rows, rows * t / threads, rows * (t + 1) / threads);
  }
  quantize_rows(0, rows / threads);
  for (auto& w : workers) w.join();
  if (bad_row.load() < rows) {
    return InvalidArgument(
        "{}: row {} has values too large for an {} group scale in f16 (max 65504): cannot quantize",
        what, bad_row.load(), WeightFormatName(spec.format));
  }
  return m;
}

void DequantizeRow(const Weight& w, int64_t r, float* out) {
  DH_CHECK(w.format != WeightFormat::kDense, "DequantizeRow of a dense weight");
  DecodeWeightRow(w, r, out);
}

}  // namespace dh
