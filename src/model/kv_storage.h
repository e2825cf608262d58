// KvStorage: the device memory of the paged KV cache — per layer, one tensor of
// [num_blocks * block_size, heads, dim] for keys and one for values (MLA layers keep a single
// latent tensor and leave values empty), in the cache dtype (--kv-cache-dtype); the quantized
// dtypes add f32 scales [slots, heads, groups] (backend.h KvCacheView). Allocated once at start,
// as one backend buffer holding every layer's tensors (on a host backend: 2 MiB pages); laid
// out head by head where the backend asks (Backend::KvCacheHeadMajor: the CPU), else slot by
// slot.
// It lives in the model layer because the attention layers read and write it; the block
// bookkeeping (src/kvcache) never touches device memory.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"

namespace dh {

// What one cached token needs in one layer. v_dim == 0 means keys only (MLA latent cache).
struct KvCacheSpec {
  int num_layers = 0;
  int64_t k_heads = 0;
  int64_t k_dim = 0;
  int64_t v_heads = 0;
  int64_t v_dim = 0;
  DType dtype = DType::kF32;  // f32, bf16, or quantized f8e4m3 / i8 with scales
  // Quantized dtypes: elements of a head row per scale; 0 is the whole row (one scale per token
  // and head). MLA sets kv_lora_rank, so its latent and its rope key get a scale each.
  int64_t k_group = 0;
  int64_t v_group = 0;

  bool quantized() const { return dtype == DType::kF8E4M3 || dtype == DType::kI8; }
  // Scales per head row of dim elements in groups of `group` (0 when not quantized).
  int64_t NumGroups(int64_t dim, int64_t group) const {
    if (!quantized() || dim == 0) return 0;
    const int64_t g = group > 0 ? group : dim;
    return (dim + g - 1) / g;
  }
  size_t BytesPerToken() const {
    const int64_t esize = static_cast<int64_t>(DTypeSize(dtype));
    const int64_t k = k_heads * (k_dim * esize + NumGroups(k_dim, k_group) * 4);
    const int64_t v = v_heads * (v_dim * esize + NumGroups(v_dim, v_group) * 4);
    return static_cast<size_t>(num_layers) * static_cast<size_t>(k + v);
  }
};

// --kv-cache-dtype: auto (the activations' f32, exact), bf16 (= bfloat16), fp8 (= fp8_e4m3),
// int8. InvalidArgument naming the flag and the accepted values otherwise.
Result<DType> ParseKvCacheDtype(std::string_view text);
// The flag's name for a cache dtype ("auto" for f32).
std::string_view KvCacheDtypeName(DType dtype);

class KvStorage {
 public:
  static Result<std::unique_ptr<KvStorage>> Allocate(Backend& backend, const KvCacheSpec& spec,
                                                     int num_blocks, int block_size);
  const KvCacheSpec& spec() const { return spec_; }
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  KvCacheView k(int layer) const { return k_[layer]; }
  KvCacheView v(int layer) const { return v_[layer]; }

 private:
  KvCacheSpec spec_;
  int num_blocks_ = 0;
  int block_size_ = 0;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<KvCacheView> k_, v_;
};

}  // namespace dh
