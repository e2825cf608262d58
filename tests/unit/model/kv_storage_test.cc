// KvStorage::Allocate: every layer's tensors (keys, values, and the scales of a quantized cache)
// live in one backend buffer, each 64-byte aligned and disjoint from the others, with the
// shapes and dtypes of the spec; an MLA-like spec (no values) leaves the value views empty; a
// size that overflows is refused, not allocated.
#include "model/kv_storage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/reference/reference_backend.h"

namespace dh {
namespace {

// [begin, end) of every non-empty tensor of every layer's views.
std::vector<std::pair<uintptr_t, uintptr_t>> Ranges(const KvStorage& kv, int layers) {
  std::vector<std::pair<uintptr_t, uintptr_t>> r;
  auto add = [&](const Tensor& t) {
    if (t.empty()) return;
    const auto b = reinterpret_cast<uintptr_t>(t.data);
    r.emplace_back(b, b + t.nbytes());
  };
  for (int l = 0; l < layers; ++l) {
    for (const KvCacheView& v : {kv.k(l), kv.v(l)}) {
      add(v.data);
      add(v.scales);
    }
  }
  return r;
}

void ExpectDisjointAligned(std::vector<std::pair<uintptr_t, uintptr_t>> r) {
  std::sort(r.begin(), r.end());
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(r[i].first % 64, 0u) << i;
    if (i > 0) {
      EXPECT_LE(r[i - 1].second, r[i].first) << i;
    }
  }
}

TEST(KvStorageTest, EveryLayerInOneBufferDisjointAndAligned) {
  ReferenceBackend backend{BackendOptions{}};
  KvCacheSpec spec;
  spec.num_layers = 3;
  spec.k_heads = 2;
  spec.k_dim = 24;
  spec.v_heads = 2;
  spec.v_dim = 20;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3}) {
    spec.dtype = dtype;
    spec.k_group = spec.quantized() ? 8 : 0;
    auto kv = KvStorage::Allocate(backend, spec, 5, 3);  // 15 slots: odd sizes, padding needed
    ASSERT_TRUE(kv.ok()) << kv.status().message();
    for (int l = 0; l < spec.num_layers; ++l) {
      const KvCacheView k = (*kv)->k(l), v = (*kv)->v(l);
      EXPECT_EQ(k.data.dtype, dtype);
      EXPECT_EQ(k.dim(0), 15);
      EXPECT_EQ(k.dim(1), 2);
      EXPECT_EQ(k.dim(2), 24);
      EXPECT_EQ(v.dim(2), 20);
      EXPECT_EQ(k.quantized(), spec.quantized());
      if (spec.quantized()) {
        EXPECT_EQ(k.scales.dim(2), 3);  // 24 / 8
        EXPECT_EQ(v.scales.dim(2), 1);  // one scale per row
        EXPECT_EQ(k.group_size, 8);
        EXPECT_EQ(v.group_size, 20);
      }
    }
    const auto ranges = Ranges(**kv, spec.num_layers);
    EXPECT_EQ(ranges.size(), spec.quantized() ? 12u : 6u);
    ExpectDisjointAligned(ranges);
    // Every tensor is writable end to end (ASan builds would flag one outside the buffer).
    for (const auto& [b, e] : ranges) std::fill(reinterpret_cast<uint8_t*>(b),
                                                reinterpret_cast<uint8_t*>(e), uint8_t{0x3c});
  }
}

// The Qwen2-1.5B shape at 512 slots: each layer's keys are 512 KiB, the cache 28 MiB. As one host
// buffer it starts on a 2 MiB huge page (base/host_memory.h), which per-layer buffers would not.
TEST(KvStorageTest, LargeHostCacheStartsOnAHugePage) {
  ReferenceBackend backend{BackendOptions{}};
  KvCacheSpec spec;
  spec.num_layers = 28;
  spec.k_heads = spec.v_heads = 2;
  spec.k_dim = spec.v_dim = 128;
  auto kv = KvStorage::Allocate(backend, spec, 32, 16);
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*kv)->k(0).data.data) % (size_t{2} << 20), 0u);
  EXPECT_EQ((*kv)->k(0).data.nbytes(), size_t{512} << 10);
  ExpectDisjointAligned(Ranges(**kv, spec.num_layers));
}

TEST(KvStorageTest, KeysOnlySpecLeavesValuesEmpty) {
  ReferenceBackend backend{BackendOptions{}};
  KvCacheSpec spec;
  spec.num_layers = 2;
  spec.k_heads = 1;
  spec.k_dim = 576;
  auto kv = KvStorage::Allocate(backend, spec, 4, 16);
  ASSERT_TRUE(kv.ok());
  EXPECT_TRUE((*kv)->v(0).empty());
  EXPECT_TRUE((*kv)->v(1).empty());
  ExpectDisjointAligned(Ranges(**kv, spec.num_layers));
}

TEST(KvStorageTest, OverflowingSizeIsRefused) {
  ReferenceBackend backend{BackendOptions{}};
  KvCacheSpec spec;
  spec.num_layers = 4;
  spec.k_heads = int64_t{1} << 30;
  spec.k_dim = int64_t{1} << 30;
  auto kv = KvStorage::Allocate(backend, spec, 1 << 20, 16);
  ASSERT_FALSE(kv.ok());
  EXPECT_NE(kv.status().message().find("overflows"), std::string::npos)
      << kv.status().message();
}

}  // namespace
}  // namespace dh
