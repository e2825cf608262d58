// KvStorage allocation with checked sizes.
#include "model/kv_storage.h"

#include "base/checked_math.h"

namespace dh {

Result<std::unique_ptr<KvStorage>> KvStorage::Allocate(Backend& backend, const KvCacheSpec& spec,
                                                       int num_blocks, int block_size) {
  if (num_blocks <= 0 || block_size <= 0) {
    return InvalidArgument("KV cache needs at least one block (got {} blocks of {})", num_blocks,
                           block_size);
  }
  auto storage = std::unique_ptr<KvStorage>(new KvStorage());
  storage->spec_ = spec;
  storage->num_blocks_ = num_blocks;
  storage->block_size_ = block_size;
  const int64_t slots = static_cast<int64_t>(num_blocks) * block_size;
  auto alloc = [&](int64_t heads, int64_t dim) -> Result<Tensor> {
    const int64_t dims[] = {slots, heads, dim};
    auto elems = CheckedProduct(dims);
    auto bytes = elems ? CheckedMul(*elems, DTypeSize(spec.dtype)) : std::nullopt;
    if (!bytes) return ResourceExhausted("KV cache size overflows ({} slots)", slots);
    auto buf = backend.Allocate(*bytes);
    if (!buf) return ResourceExhausted("cannot allocate {} bytes of KV cache", *bytes);
    Tensor t(buf->data(), spec.dtype, {slots, heads, dim});
    storage->buffers_.push_back(std::move(buf));
    return t;
  };
  for (int l = 0; l < spec.num_layers; ++l) {
    DH_ASSIGN_OR_RETURN(Tensor k, alloc(spec.k_heads, spec.k_dim));
    storage->k_.push_back(k);
    if (spec.v_dim > 0) {
      DH_ASSIGN_OR_RETURN(Tensor v, alloc(spec.v_heads, spec.v_dim));
      storage->v_.push_back(v);
    } else {
      storage->v_.push_back(Tensor());
    }
  }
  return storage;
}

}  // namespace dh
