// Plain-loop reference maths for the row-wise and elementwise ops, MatMul over every weight
// format and RoPE. The KV cache ops, attention and the MoE ops live in their own files.
#include "backend/reference/reference_ops.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/weight_rows.h"
#include "base/check.h"

namespace dh::ref {
namespace {

// Number of rows when the last dim is the row: the product of the leading dims.
int64_t NumRows(const Tensor& t) {
  int64_t n = 1;
  for (int i = 0; i + 1 < t.ndim; ++i) n *= t.shape[i];
  return n;
}
int64_t RowLen(const Tensor& t) { return t.ndim == 0 ? 1 : t.shape[t.ndim - 1]; }

// Element offset of the first element of flattened row r (leading dims row-major).
int64_t RowOffset(const Tensor& t, int64_t r) {
  int64_t off = 0;
  for (int i = t.ndim - 2; i >= 0; --i) {
    off += (r % t.shape[i]) * t.stride[i];
    r /= t.shape[i];
  }
  return off;
}
int64_t ColStride(const Tensor& t) { return t.ndim == 0 ? 1 : t.stride[t.ndim - 1]; }

// Element offset of flattened element e of t (row-major over its shape).
int64_t ElementOffset(const Tensor& t, int64_t e) {
  int64_t off = 0;
  for (int i = t.ndim - 1; i >= 0; --i) {
    off += (e % t.shape[i]) * t.stride[i];
    e /= t.shape[i];
  }
  return off;
}

void CheckSameShape(const Tensor& a, const Tensor& b, const char* what) {
  DH_CHECK(a.ndim == b.ndim, "{}: {} vs {}", what, a.ShapeString(), b.ShapeString());
  for (int i = 0; i < a.ndim; ++i) {
    DH_CHECK(a.shape[i] == b.shape[i], "{}: {} vs {}", what, a.ShapeString(), b.ShapeString());
  }
}

void RmsNormRows(const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  const int64_t rows = NumRows(x), h = RowLen(x);
  DH_CHECK(weight.numel() == h, "rmsnorm weight {} for rows of {}", weight.ShapeString(), h);
  std::vector<float> row(h);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t xo = RowOffset(x, r), oo = RowOffset(out, r);
    double sum_sq = 0;
    for (int64_t i = 0; i < h; ++i) {
      row[i] = Get(x, xo + i * ColStride(x));
      sum_sq += static_cast<double>(row[i]) * row[i];
    }
    const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / h) + eps);
    for (int64_t i = 0; i < h; ++i) {
      Set(out, oo + i * ColStride(out), row[i] * inv * Get(weight, i * ColStride(weight)));
    }
  }
}

}  // namespace

float LoadFloat(const void* base, DType dtype, int64_t i) { return LoadElementF32(base, dtype, i); }

void StoreFloat(void* base, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(base)[i] = v; return;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = F32ToF16(v); return;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = F32ToBF16(v); return;
    default: break;
  }
  DH_CHECK(false, "no float store for dtype {}", DTypeName(dtype));
}

void DecodeWeightRow(const Weight& w, int64_t row, float* out) { ::dh::DecodeWeightRow(w, row, out); }

void Embedding(const Weight& table, const Tensor& ids, Tensor out) {
  const int64_t n = ids.numel();
  DH_CHECK(NumRows(out) == n && RowLen(out) == table.cols, "embedding out {} for {} ids x {}",
           out.ShapeString(), n, table.cols);
  std::vector<float> row(table.cols);
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = GetI32(ids, t);
    DH_CHECK(id >= 0 && id < table.rows, "token id {} outside the vocabulary of {}", id,
             table.rows);
    ::dh::DecodeWeightRow(table, id, row.data());
    const int64_t oo = RowOffset(out, t);
    for (int64_t i = 0; i < table.cols; ++i) Set(out, oo + i * ColStride(out), row[i]);
  }
}

void RmsNorm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  CheckSameShape(x, out, "rmsnorm");
  RmsNormRows(x, weight, eps, out);
}

void AddRmsNorm(Tensor residual, const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  Add(residual, x, residual);
  RmsNorm(residual, weight, eps, out);
}

void MatMul(const Tensor& x, const Weight& w, const Tensor& bias, Tensor out) {
  const int64_t m = NumRows(x), k = RowLen(x), n = w.rows;
  DH_CHECK(k == w.cols, "matmul x {} with weight [{}, {}]", x.ShapeString(), w.rows, w.cols);
  DH_CHECK(NumRows(out) == m && RowLen(out) == n, "matmul out {} expected [{}, {}]",
           out.ShapeString(), m, n);
  DH_CHECK(bias.empty() || bias.numel() == n, "matmul bias {} for {} outputs",
           bias.ShapeString(), n);
  // A weight with an input permutation (GPTQ act-order) multiplies x gathered as x[:, perm].
  const bool permuted = !w.perm.empty();
  DH_CHECK(!permuted || w.perm.numel() == k, "matmul perm {} for {} columns", w.perm.ShapeString(),
           k);
  std::vector<float> xs(m * k), wrow(k);
  for (int64_t r = 0; r < m; ++r) {
    const int64_t xo = RowOffset(x, r);
    for (int64_t i = 0; i < k; ++i) {
      int64_t src = i;
      if (permuted) {
        src = GetI32(w.perm, i);
        DH_CHECK(src >= 0 && src < k, "matmul perm[{}] = {} outside [0, {})", i, src, k);
      }
      xs[r * k + i] = Get(x, xo + src * ColStride(x));
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    ::dh::DecodeWeightRow(w, j, wrow.data());
    const float b = bias.empty() ? 0.0f : Get(bias, j * ColStride(bias));
    for (int64_t r = 0; r < m; ++r) {
      double acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(xs[r * k + i]) * wrow[i];
      Set(out, RowOffset(out, r) + j * ColStride(out), static_cast<float>(acc) + b);
    }
  }
}

void BatchedMatMul(const Tensor& x, std::span<const Weight> w, Tensor out) {
  const int64_t heads = static_cast<int64_t>(w.size());
  DH_CHECK(x.ndim == 3 && out.ndim == 3 && x.dim(1) == heads && out.dim(1) == heads &&
               out.dim(0) == x.dim(0),
           "batched matmul x {} out {} with {} weights", x.ShapeString(), out.ShapeString(), heads);
  for (int64_t h = 0; h < heads; ++h) MatMul(x.Select(1, h), w[h], Tensor(), out.Select(1, h));
}

void Rope(Tensor x, const Tensor& positions, const RopeParams& p) {
  DH_CHECK(x.ndim == 3, "rope x must be [T, H, D], got {}", x.ShapeString());
  const int64_t t_count = x.shape[0], heads = x.shape[1], d = x.shape[2];
  const int half = p.rot_dim / 2;
  DH_CHECK(p.rot_dim % 2 == 0 && p.offset >= 0 && p.offset + p.rot_dim <= d,
           "rope rot_dim {} at offset {} in head dim {}", p.rot_dim, p.offset, d);
  DH_CHECK(p.inv_freq.numel() == half, "rope inv_freq {} for rot_dim {}",
           p.inv_freq.ShapeString(), p.rot_dim);
  DH_CHECK(positions.numel() == t_count, "rope positions {} for {} tokens",
           positions.ShapeString(), t_count);
  const int64_t cs = x.stride[2];
  for (int64_t t = 0; t < t_count; ++t) {
    const float pos = static_cast<float>(GetI32(positions, t));
    for (int i = 0; i < half; ++i) {
      const float angle = pos * Get(p.inv_freq, i * p.inv_freq.stride[0]);
      const float c = static_cast<float>(std::cos(static_cast<double>(angle))) * p.attention_factor;
      const float s = static_cast<float>(std::sin(static_cast<double>(angle))) * p.attention_factor;
      // Elements (a, b) of pair i, relative to the head start.
      const int64_t ia = p.offset + (p.style == RopeStyle::kHalf ? i : 2 * i);
      const int64_t ib = p.style == RopeStyle::kHalf ? ia + half : ia + 1;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t head = Offset(x, t, h);
        const float a = Get(x, head + ia * cs), b = Get(x, head + ib * cs);
        Set(x, head + ia * cs, a * c - b * s);
        Set(x, head + ib * cs, b * c + a * s);
      }
    }
  }
}

void SiluMul(const Tensor& gate, const Tensor& up, Tensor out) {
  CheckSameShape(gate, up, "silu_mul");
  CheckSameShape(gate, out, "silu_mul");
  for (int64_t e = 0; e < gate.numel(); ++e) {
    const float g = Get(gate, ElementOffset(gate, e));
    const float silu = g / (1.0f + std::exp(-g));
    Set(out, ElementOffset(out, e), silu * Get(up, ElementOffset(up, e)));
  }
}

void Add(const Tensor& a, const Tensor& b, Tensor out) {
  CheckSameShape(a, b, "add");
  CheckSameShape(a, out, "add");
  for (int64_t e = 0; e < a.numel(); ++e) {
    Set(out, ElementOffset(out, e), Get(a, ElementOffset(a, e)) + Get(b, ElementOffset(b, e)));
  }
}

void Copy(const Tensor& src, Tensor dst) {
  CheckSameShape(src, dst, "copy");
  const size_t esize = DTypeSize(src.dtype);
  const bool raw = src.dtype == dst.dtype;
  DH_CHECK(raw || (IsFloat(src.dtype) && IsFloat(dst.dtype)), "copy {} -> {}",
           DTypeName(src.dtype), DTypeName(dst.dtype));
  const int last = src.ndim - 1;
  if (raw && src.ndim > 0 && src.stride[last] == 1 && dst.stride[last] == 1) {
    // Rows contiguous in both: one memcpy per row (the common case: slices of heads).
    const int64_t row = src.shape[last];
    for (int64_t e = 0; e < src.numel(); e += row) {
      std::memcpy(static_cast<char*>(dst.data) + ElementOffset(dst, e) * esize,
                  static_cast<const char*>(src.data) + ElementOffset(src, e) * esize, row * esize);
    }
    return;
  }
  for (int64_t e = 0; e < src.numel(); ++e) {
    const int64_t so = ElementOffset(src, e), d_off = ElementOffset(dst, e);
    if (raw) {
      std::memcpy(static_cast<char*>(dst.data) + d_off * esize,
                  static_cast<const char*>(src.data) + so * esize, esize);
    } else {
      Set(dst, d_off, Get(src, so));
    }
  }
}

void GatherRows(const Tensor& x, const Tensor& rows, Tensor out) {
  const int64_t n = rows.numel(), h = RowLen(x);
  DH_CHECK(NumRows(out) == n && RowLen(out) == h, "gather rows out {} for {} rows of {}",
           out.ShapeString(), n, h);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t r = GetI32(rows, i);
    DH_CHECK(r >= 0 && r < NumRows(x), "gather row {} of {}", r, NumRows(x));
    const int64_t xo = RowOffset(x, r), oo = RowOffset(out, i);
    for (int64_t c = 0; c < h; ++c) {
      Set(out, oo + c * ColStride(out), Get(x, xo + c * ColStride(x)));
    }
  }
}

}  // namespace dh::ref
