// KvStorage allocation with checked sizes, and the --kv-cache-dtype names.
#include "model/kv_storage.h"

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
  auto alloc = [&](int64_t heads, int64_t dim, DType dtype) -> Result<Tensor> {
    const int64_t dims[] = {slots, heads, dim};
    auto elems = CheckedProduct(dims);
    auto bytes = elems ? CheckedMul(*elems, DTypeSize(dtype)) : std::nullopt;
    if (!bytes) return ResourceExhausted("KV cache size overflows ({} slots)", slots);
    auto buf = backend.Allocate(*bytes);
    if (!buf) return ResourceExhausted("cannot allocate {} bytes of KV cache", *bytes);
    Tensor t(buf->data(), dtype, {slots, heads, dim});
    storage->buffers_.push_back(std::move(buf));
    return t;
  };
  auto view = [&](int64_t heads, int64_t dim, int64_t group) -> Result<KvCacheView> {
    DH_ASSIGN_OR_RETURN(Tensor data, alloc(heads, dim, spec.dtype));
    if (!spec.quantized()) return KvCacheView(data);
    DH_ASSIGN_OR_RETURN(Tensor scales, alloc(heads, spec.NumGroups(dim, group), DType::kF32));
    return KvCacheView(data, scales, group > 0 ? group : dim);
  };
  for (int l = 0; l < spec.num_layers; ++l) {
    DH_ASSIGN_OR_RETURN(KvCacheView k, view(spec.k_heads, spec.k_dim, spec.k_group));
    storage->k_.push_back(k);
    if (spec.v_dim > 0) {
      DH_ASSIGN_OR_RETURN(KvCacheView v, view(spec.v_heads, spec.v_dim, spec.v_group));
      storage->v_.push_back(v);
    } else {
      storage->v_.push_back(KvCacheView());
    }
  }
  return storage;
}

}  // namespace dh
