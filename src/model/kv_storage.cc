// KvStorage allocation with checked sizes, and the --kv-cache-dtype names.
#include "model/kv_storage.h"

#include <cstdint>

#include "base/checked_math.h"

namespace dh {

Result<DType> ParseKvCacheDtype(std::string_view text) {
  if (text == "auto") return DType::kF32;
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  if (text == "fp8" || text == "fp8_e4m3") return DType::kF8E4M3;
  if (text == "int8") return DType::kI8;
  return InvalidArgument("--kv-cache-dtype: '{}': expected auto, bf16, fp8 or int8", text);
}

std::string_view KvCacheDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bf16";
    case DType::kF8E4M3: return "fp8";
    case DType::kI8: return "int8";
    default: return "auto";
  }
}

Result<std::unique_ptr<KvStorage>> KvStorage::Allocate(Backend& backend, const KvCacheSpec& spec,
                                                       int num_blocks, int block_size) {
  if (num_blocks <= 0 || block_size <= 0) {
    return InvalidArgument("KV cache needs at least one block (got {} blocks of {})", num_blocks,
                           block_size);
  }
  if (spec.dtype != DType::kF32 && spec.dtype != DType::kBF16 && !spec.quantized()) {
    return InvalidArgument("KV cache dtype {} is not one of f32, bf16, f8e4m3, i8",
                           DTypeName(spec.dtype));
  }
  auto storage = std::unique_ptr<KvStorage>(new KvStorage());
  storage->spec_ = spec;
  storage->num_blocks_ = num_blocks;
  storage->block_size_ = block_size;
  const int64_t slots = static_cast<int64_t>(num_blocks) * block_size;
  // One allocation holds every layer's tensors (each 64-byte aligned): a host backend then
  // backs it with 2 MiB pages even when one layer's share is smaller than that, and rounds the
  // whole cache, not each of its tensors, up to a huge page (base/host_memory.h).
  struct Part {
    int64_t heads, dim;
    DType dtype;
    uint64_t offset;
  };
  std::vector<Part> parts;
  uint64_t total = 0;
  auto add = [&](int64_t heads, int64_t dim, DType dtype) -> Status {
    const int64_t dims[] = {slots, heads, dim};
    auto elems = CheckedProduct(dims);
    auto bytes = elems ? CheckedMul(static_cast<uint64_t>(*elems), DTypeSize(dtype)) : std::nullopt;
    auto end = bytes ? CheckedAdd(total, *bytes) : std::nullopt;
    auto aligned = end ? CheckedAdd(*end, uint64_t{63}) : std::nullopt;
    if (!aligned || *aligned > static_cast<uint64_t>(SIZE_MAX)) {
      return ResourceExhausted("KV cache size overflows ({} slots)", slots);
    }
    parts.push_back(Part{heads, dim, dtype, total});
    total = *aligned / 64 * 64;
    return Status::Ok();
  };
  auto add_view = [&](int64_t heads, int64_t dim, int64_t group) -> Status {
    DH_RETURN_IF_ERROR(add(heads, dim, spec.dtype));
    if (spec.quantized()) DH_RETURN_IF_ERROR(add(heads, spec.NumGroups(dim, group), DType::kF32));
    return Status::Ok();
  };
  for (int l = 0; l < spec.num_layers; ++l) {
    DH_RETURN_IF_ERROR(add_view(spec.k_heads, spec.k_dim, spec.k_group));
    if (spec.v_dim > 0) DH_RETURN_IF_ERROR(add_view(spec.v_heads, spec.v_dim, spec.v_group));
  }
  uint8_t* base = nullptr;
  if (total > 0) {
    auto buf = backend.Allocate(static_cast<size_t>(total));
    if (!buf) return ResourceExhausted("cannot allocate {} bytes of KV cache", total);
    base = static_cast<uint8_t*>(buf->data());
    storage->buffers_.push_back(std::move(buf));
  }
  size_t next = 0;
  const bool head_major = backend.KvCacheHeadMajor();
  auto tensor = [&]() {
    const Part& p = parts[next++];
    const Tensor t(base + p.offset, p.dtype, {slots, p.heads, p.dim});
    return head_major ? HeadMajorKv(t) : t;
  };
  auto view = [&](int64_t group, int64_t dim) {
    Tensor data = tensor();
    if (!spec.quantized()) return KvCacheView(data);
    Tensor scales = tensor();
    return KvCacheView(data, scales, group > 0 ? group : dim);
  };
  for (int l = 0; l < spec.num_layers; ++l) {
    storage->k_.push_back(view(spec.k_group, spec.k_dim));
    storage->v_.push_back(spec.v_dim > 0 ? view(spec.v_group, spec.v_dim) : KvCacheView());
  }
  return storage;
}

}  // namespace dh
