// CpuBackend's Rope, KvWrite and KvGather: layout checks (anything else goes to the reference
// loops), the rope cos/sin table, and the split over threads; the kernels are rope_kv.cc's. All
// three give the reference's results bit for bit (tests/kernels/rope_kv_test.cc).
#include <bit>
#include <cmath>
#include <cstdint>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"  // DispatchedTargetName
#include "backend/cpu/rope_kv.h"
#include "backend/cpu/row_view.h"
#include "backend/kernel_note.h"
#include "backend/reference/reference_ops.h"
#include "base/check.h"

namespace dh {
namespace {

bool InnerContiguous(const Tensor& t) {
  return t.ndim == 3 && (t.stride[2] == 1 || t.shape[2] == 1);
}

// A cache view the kernels read and write: rows contiguous, and for the quantized types f32
// scales [slots, heads, groups] with contiguous groups.
bool KvLayoutOk(const KvCacheView& c) {
  if (!InnerContiguous(c.data)) return false;
  switch (c.data.dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
      return !c.quantized();
    case DType::kF8E4M3:
    case DType::kI8: {
      const Tensor& s = c.scales;
      return c.quantized() && c.group_size > 0 && s.dtype == DType::kF32 && s.ndim == 3 &&
             (s.stride[2] == 1 || s.shape[2] == 1) && s.shape[0] == c.data.shape[0] &&
             s.shape[1] == c.data.shape[1] &&
             s.shape[2] == (c.data.shape[2] + c.group_size - 1) / c.group_size;
    }
    default:
      return false;
  }
}

// KvWrite's source rows for one cache: f32 [T, heads, dim] with contiguous rows.
bool KvSourceOk(const Tensor& src, const KvCacheView& c) {
  return src.dtype == DType::kF32 && InnerContiguous(src) && KvLayoutOk(c) &&
         src.shape[1] == c.dim(1) && src.shape[2] == c.dim(2);
}

}  // namespace

void CpuBackend::Rope(Tensor x, const Tensor& positions, const RopeParams& p) {
  const int64_t half = p.rot_dim / 2;
  if (x.dtype != DType::kF32 || !InnerContiguous(x) || positions.dtype != DType::kI32 ||
      p.rot_dim % 2 != 0 || p.offset < 0 || p.offset + p.rot_dim > x.shape[2] ||
      p.inv_freq.ndim < 1 || p.inv_freq.numel() != half || positions.numel() != x.shape[0]) {
    Trace("rope reference");
    return ReferenceBackend::Rope(x, positions, p);
  }
  const int64_t t_count = x.shape[0];
  NoteKernel("rope", cpu::DispatchedTargetName);
  Trace("rope {} T={} H={} D={} rot={}", p.style == RopeStyle::kHalf ? "half" : "interleaved",
        t_count, x.shape[1], x.shape[2], p.rot_dim);
  // The table is the reference's cos and sin per token and pair, computed the same way; a step
  // calls Rope with the same positions and frequencies for q and k of every layer, so it is
  // computed once per step and reused while its inputs are bitwise the same.
  RopeScratch& r = rope_;
  bool same = r.factor_bits == std::bit_cast<uint32_t>(p.attention_factor) &&
              static_cast<int64_t>(r.positions.size()) == t_count &&
              static_cast<int64_t>(r.inv_freq.size()) == half;
  for (int64_t i = 0; same && i < half; ++i) {
    same = std::bit_cast<uint32_t>(ref::Get(p.inv_freq, i * p.inv_freq.stride[0])) ==
           std::bit_cast<uint32_t>(r.inv_freq[i]);
  }
  for (int64_t t = 0; same && t < t_count; ++t) same = ref::GetI32(positions, t) == r.positions[t];
  if (!same) {
    r.factor_bits = std::bit_cast<uint32_t>(p.attention_factor);
    r.positions.resize(t_count);
    r.inv_freq.resize(half);
    r.cos.resize(t_count * half);
    r.sin.resize(t_count * half);
    for (int64_t t = 0; t < t_count; ++t) r.positions[t] = ref::GetI32(positions, t);
    for (int64_t i = 0; i < half; ++i) {
      r.inv_freq[i] = ref::Get(p.inv_freq, i * p.inv_freq.stride[0]);
    }
    // Two double-precision calls per pair: worth the threads for a prefill.
    pool_->ParallelFor(t_count, cpu::GrainFor(half * 64), [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) {
        const float pos = static_cast<float>(r.positions[t]);
        for (int64_t i = 0; i < half; ++i) {
          const float angle = pos * r.inv_freq[i];
          r.cos[t * half + i] =
              static_cast<float>(std::cos(static_cast<double>(angle))) * p.attention_factor;
          r.sin[t * half + i] =
              static_cast<float>(std::sin(static_cast<double>(angle))) * p.attention_factor;
        }
      }
    });
  }
  cpu::RopeArgs a;
  a.x = x.as<float>();
  a.token_stride = x.stride[0];
  a.head_stride = x.stride[1];
  a.heads = x.shape[1];
  a.offset = p.offset;
  a.half = half;
  a.interleaved = p.style == RopeStyle::kInterleaved;
  a.cos = r.cos.data();
  a.sin = r.sin.data();
  pool_->ParallelFor(t_count, cpu::GrainFor(x.shape[1] * p.rot_dim), [&](size_t b, size_t e) {
    cpu::RopeTokens(a, static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

void CpuBackend::KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache, KvCacheView v_cache,
                         const Tensor& slot_mapping) {
  const int64_t t_count = k.shape[0];
  if (k.ndim != 3 || !KvSourceOk(k, k_cache) || (!v.empty() && !KvSourceOk(v, v_cache)) ||
      (!v.empty() && (v.shape[0] != t_count || v.shape[1] != k.shape[1])) ||
      slot_mapping.dtype != DType::kI32 || slot_mapping.numel() != t_count) {
    Trace("kv_write reference");
    return ReferenceBackend::KvWrite(k, v, k_cache, v_cache, slot_mapping);
  }
  NoteKernel("kv-write", cpu::DispatchedTargetName);
  Trace("kv_write {} T={} H={} D={}", DTypeName(k_cache.data.dtype), t_count, k.shape[1],
        k.shape[2]);
  const int64_t slot_stride = slot_mapping.ndim > 0 ? slot_mapping.stride[0] : 1;
  for (int64_t t = 0; t < t_count; ++t) {
    const int32_t slot = ref::GetI32(slot_mapping, t);
    DH_CHECK(slot < k_cache.dim(0) && (v.empty() || slot < v_cache.dim(0)),
             "slot {} outside a cache of {}", slot, k_cache.dim(0));
  }
  // One item per (cache, head): each keeps the tokens in order, so a slot named twice ends with
  // the later row as in the reference.
  const int64_t heads = k.shape[1];
  const int64_t items = (v.empty() ? 1 : 2) * heads;
  pool_->ParallelFor(items, cpu::GrainFor(t_count * k.shape[2]), [&](size_t b, size_t e) {
    for (size_t item = b; item < e; ++item) {
      const bool is_v = static_cast<int64_t>(item) >= heads;
      const int64_t h = static_cast<int64_t>(item) % heads;
      const Tensor& src = is_v ? v : k;
      const KvCacheView& c = is_v ? v_cache : k_cache;
      cpu::KvWriteArgs a;
      a.src = src.as<const float>() + h * src.stride[1];
      a.src_token_stride = src.stride[0];
      a.slots = slot_mapping.as<const int32_t>();
      a.slot_stride = slot_stride;
      a.tokens = t_count;
      a.type = c.data.dtype;
      a.dst = static_cast<char*>(c.data.data) + h * c.data.stride[1] * DTypeSize(c.data.dtype);
      a.dst_slot_stride = c.data.stride[0];
      if (c.quantized()) {
        a.scales = c.scales.as<float>() + h * c.scales.stride[1];
        a.scale_slot_stride = c.scales.stride[0];
        a.group = c.group_size;
      }
      a.dim = src.shape[2];
      cpu::KvWriteHead(a);
    }
  });
}

void CpuBackend::KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) {
  const int64_t n = slots.numel();
  if (!KvLayoutOk(cache) || slots.dtype != DType::kI32 || out.dtype != DType::kF32 ||
      !InnerContiguous(out) || out.shape[0] != n || out.shape[1] != cache.dim(1) ||
      out.shape[2] != cache.dim(2)) {
    Trace("kv_gather reference");
    return ReferenceBackend::KvGather(cache, slots, out);
  }
  NoteKernel("kv-gather", cpu::DispatchedTargetName);
  const Tensor& d = cache.data;
  const int64_t heads = d.shape[1], dim = d.shape[2];
  Trace("kv_gather {} N={} H={} D={}", DTypeName(d.dtype), n, heads, dim);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t slot = ref::GetI32(slots, r);
    DH_CHECK(slot >= 0 && slot < d.shape[0], "kv gather slot {} of {}", slot, d.shape[0]);
  }
  const size_t esize = DTypeSize(d.dtype);
  const Tensor& s = cache.scales;
  pool_->ParallelFor(n * heads, cpu::GrainFor(dim), [&](size_t b, size_t e) {
    for (size_t item = b; item < e; ++item) {
      const int64_t r = static_cast<int64_t>(item) / heads, h = static_cast<int64_t>(item) % heads;
      const int64_t slot = ref::GetI32(slots, r);
      const char* src =
          static_cast<const char*>(d.data) + (slot * d.stride[0] + h * d.stride[1]) * esize;
      const float* scales =
          cache.quantized() ? s.as<const float>() + slot * s.stride[0] + h * s.stride[1] : nullptr;
      cpu::KvReadRow(src, d.dtype, scales, cache.group_size,
                     out.as<float>() + r * out.stride[0] + h * out.stride[1], dim);
    }
  });
}

}  // namespace dh
