// Reference KV cache ops: the write (with the per-token, per-head, per-group scales of the
// quantized formats, backend.h KvCacheView), the dequantizing read every attention kernel must
// match, and the gather of MLA's naive path.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/reference/reference_ops.h"
#include "base/check.h"

namespace dh::ref {
namespace {

void CheckView(const KvCacheView& c) {
  DH_CHECK(c.data.ndim == 3, "kv cache {} is not [slots, heads, dim]", c.data.ShapeString());
  if (!c.quantized()) {
    DH_CHECK(c.data.dtype == DType::kF32 || c.data.dtype == DType::kBF16 ||
                 c.data.dtype == DType::kF16,
             "kv cache of dtype {} needs scales", DTypeName(c.data.dtype));
    return;
  }
  DH_CHECK(KvQuantMax(c.data.dtype) > 0 && c.scales.dtype == DType::kF32 &&
               c.scales.ndim == 3 && c.group_size > 0 && c.scales.shape[0] == c.data.shape[0] &&
               c.scales.shape[1] == c.data.shape[1] &&
               c.scales.shape[2] == (c.data.shape[2] + c.group_size - 1) / c.group_size,
           "kv cache {} {} with scales {} in groups of {}", c.data.ShapeString(),
           DTypeName(c.data.dtype), c.scales.ShapeString(), c.group_size);
}

// Writes row `src` (n values) into head `head` of `slot`, quantizing per group.
void WriteRow(const KvCacheView& c, int64_t slot, int64_t head, const float* src, int64_t n) {
  const Tensor& d = c.data;
  const int64_t base = Offset(d, slot, head);
  if (!c.quantized()) {
    for (int64_t i = 0; i < n; ++i) Set(d, base + i * d.stride[2], src[i]);
    return;
  }
  const float qmax = KvQuantMax(d.dtype);
  for (int64_t g0 = 0; g0 < n; g0 += c.group_size) {
    const int64_t g1 = std::min(n, g0 + c.group_size);
    float amax = 0;
    for (int64_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float scale = amax / qmax;
    Set(c.scales, Offset(c.scales, slot, head, g0 / c.group_size), scale);
    for (int64_t i = g0; i < g1; ++i) {
      const float x = scale > 0 ? src[i] / scale : 0.0f;
      const int64_t at = base + i * d.stride[2];
      if (d.dtype == DType::kF8E4M3) {
        static_cast<uint8_t*>(d.data)[at] = F32ToF8E4M3(x);
      } else {
        const float r = std::clamp(std::nearbyint(x), -qmax, qmax);
        static_cast<int8_t*>(d.data)[at] = static_cast<int8_t>(r);
      }
    }
  }
}

}  // namespace

float KvQuantMax(DType dtype) {
  switch (dtype) {
    case DType::kF8E4M3: return 448.0f;
    case DType::kI8: return 127.0f;
    default: return 0.0f;
  }
}

float KvGet(const KvCacheView& c, int64_t slot, int64_t head, int64_t i) {
  const Tensor& d = c.data;
  const int64_t at = Offset(d, slot, head, i);
  if (!c.quantized()) return Get(d, at);
  const float q = d.dtype == DType::kF8E4M3 ? F8E4M3ToF32(static_cast<const uint8_t*>(d.data)[at])
                                            : static_cast<float>(static_cast<const int8_t*>(d.data)[at]);
  return q * Get(c.scales, Offset(c.scales, slot, head, i / c.group_size));
}

void KvWrite(const Tensor& k, const Tensor& v, KvCacheView k_cache, KvCacheView v_cache,
             const Tensor& slot_mapping) {
  const int64_t t_count = k.shape[0];
  DH_CHECK(slot_mapping.numel() == t_count, "kv write slot mapping {} for {} tokens",
           slot_mapping.ShapeString(), t_count);
  // Grow-only per thread: the CPU backend writes its cache through here on every decode step,
  // which must not allocate (tests/alloc).
  thread_local std::vector<float> row;
  auto write = [&](const Tensor& src, const KvCacheView& cache) {
    CheckView(cache);
    DH_CHECK(src.ndim == 3 && src.shape[1] == cache.dim(1) && src.shape[2] == cache.dim(2),
             "kv write {} into cache {}", src.ShapeString(), cache.data.ShapeString());
    row.resize(src.shape[2]);
    for (int64_t t = 0; t < t_count; ++t) {
      const int32_t slot = GetI32(slot_mapping, t);
      if (slot < 0) continue;  // padding token
      DH_CHECK(slot < cache.dim(0), "slot {} outside a cache of {}", slot, cache.dim(0));
      for (int64_t h = 0; h < src.shape[1]; ++h) {
        for (int64_t i = 0; i < src.shape[2]; ++i) row[i] = Get(src, Offset(src, t, h, i));
        WriteRow(cache, slot, h, row.data(), src.shape[2]);
      }
    }
  };
  write(k, k_cache);
  if (!v.empty()) write(v, v_cache);
}

void KvGather(const KvCacheView& cache, const Tensor& slots, Tensor out) {
  CheckView(cache);
  const int64_t n = slots.numel(), heads = cache.dim(1), dim = cache.dim(2);
  DH_CHECK(out.ndim == 3 && out.shape[0] == n && out.shape[1] == heads && out.shape[2] == dim,
           "kv gather out {} for {} slots of cache {}", out.ShapeString(), n,
           cache.data.ShapeString());
  for (int64_t r = 0; r < n; ++r) {
    const int32_t slot = GetI32(slots, r);
    DH_CHECK(slot >= 0 && slot < cache.dim(0), "kv gather slot {} of {}", slot, cache.dim(0));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < dim; ++i) Set(out, Offset(out, r, h, i), KvGet(cache, slot, h, i));
    }
  }
}

}  // namespace dh::ref
