// KvStorage::Allocate: every layer's tensors (keys, values, and the scales of a quantized cache)
// live in one backend buffer, each 64-byte aligned and disjoint from the others, with the
// shapes and dtypes of the spec; an MLA-like spec (no values) leaves the value views empty; a
// size that overflows is refused, not allocated; a backend that asks for its cache head by
// head (Backend::KvCacheHeadMajor) gets views with those strides, which hold what the ops
// write as the slot-by-slot views do.
#include "model/kv_storage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
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

// The reference backend with its KV cache laid out head by head.
class HeadMajorBackend final : public ReferenceBackend {
 public:
  HeadMajorBackend() : ReferenceBackend(BackendOptions{}) {}
  bool KvCacheHeadMajor() const override { return true; }
};

TEST(KvStorageTest, HeadMajorWhereTheBackendAsks) {
  ReferenceBackend slot_major{BackendOptions{}};
  HeadMajorBackend head_major;
  KvCacheSpec spec;
  spec.num_layers = 2;
  spec.k_heads = spec.v_heads = 3;
  spec.k_dim = 16;
  spec.v_dim = 8;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8}) {
    spec.dtype = dtype;
    spec.k_group = spec.v_group = spec.quantized() ? 8 : 0;
    auto a = KvStorage::Allocate(slot_major, spec, 4, 5);  // 20 slots
    auto b = KvStorage::Allocate(head_major, spec, 4, 5);
    ASSERT_TRUE(a.ok() && b.ok());
    const KvCacheView ka = (*a)->k(1), kb = (*b)->k(1), vb = (*b)->v(1);
    EXPECT_EQ(ka.data.stride[0], 3 * 16);
    EXPECT_EQ(ka.data.stride[1], 16);
    EXPECT_EQ(kb.data.stride[0], 16);
    EXPECT_EQ(kb.data.stride[1], 20 * 16);
    EXPECT_EQ(kb.data.stride[2], 1);
    EXPECT_EQ(vb.data.stride[1], 20 * 8);
    if (spec.quantized()) {
      EXPECT_EQ(kb.scales.stride[0], 2);  // 16 / 8 groups
      EXPECT_EQ(kb.scales.stride[1], 20 * 2);
    }
    ExpectDisjointAligned(Ranges(**b, spec.num_layers));
    // The same rows written to slots 0-6 (out of order) read back the same from both layouts.
    std::vector<float> k(7 * 3 * 16), v(7 * 3 * 8), got_a(k.size()), got_b(k.size());
    for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i % 29) * 0.25f - 3.0f;
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 13) * 0.5f - 2.0f;
    std::vector<int32_t> slots = {6, 0, 19, 3, 12, 5, 1};
    const Tensor st(slots.data(), DType::kI32, {7});
    for (auto* kv : {&a, &b}) {
      slot_major.KvWrite(Tensor(k.data(), DType::kF32, {7, 3, 16}),
                         Tensor(v.data(), DType::kF32, {7, 3, 8}), (**kv)->k(1), (**kv)->v(1), st);
    }
    slot_major.KvGather((*a)->k(1), st, Tensor(got_a.data(), DType::kF32, {7, 3, 16}));
    slot_major.KvGather((*b)->k(1), st, Tensor(got_b.data(), DType::kF32, {7, 3, 16}));
    EXPECT_EQ(got_a, got_b) << DTypeName(dtype);
    // And slot 19's head 2 row really lies where the head-major strides say.
    if (dtype == DType::kF32) {
      const float* row = kb.data.as<const float>() + 19 * 16 + 2 * 20 * 16;
      EXPECT_EQ(row[0], k[(2 * 3 + 2) * 16]);  // token 2 went to slot 19
    }
  }
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
