// KvStorage: the device memory of the paged KV cache — per layer, one tensor of
// [num_blocks * block_size, heads, dim] for keys and one for values (MLA layers keep a single
// latent tensor and leave values empty). Allocated once at start. It lives in the model layer
// because the attention layers read and write it; the block bookkeeping (src/kvcache) never
// touches device memory.
#pragma once

#include <memory>
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
  DType dtype = DType::kF32;

  size_t BytesPerToken() const {
    return static_cast<size_t>(num_layers) * (k_heads * k_dim + v_heads * v_dim) *
           DTypeSize(dtype);
  }
};

class KvStorage {
 public:
  static Result<std::unique_ptr<KvStorage>> Allocate(Backend& backend, const KvCacheSpec& spec,
                                                     int num_blocks, int block_size);
  const KvCacheSpec& spec() const { return spec_; }
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  Tensor& k(int layer) { return k_[layer]; }
  Tensor& v(int layer) { return v_[layer]; }

 private:
  KvCacheSpec spec_;
  int num_blocks_ = 0;
  int block_size_ = 0;
  std::vector<std::unique_ptr<Buffer>> buffers_;
  std::vector<Tensor> k_, v_;
};

}  // namespace dh
