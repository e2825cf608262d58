// The KV cache formats (backend.h KvCacheView: f32, bf16, and f8e4m3 / i8 with per-token,
// per-head, per-group scales): the reference's write and dequantizing read, and CpuBackend's
// Attention over every format against the reference on every SIMD target compiled in.
//
// Tolerances:
//   round trip (reference KvWrite then KvGet), per element x of a group with max |x| = a:
//     i8:     |x - read| <= a / 254 (half a step of a / 127) + 1 f32 ulp of a
//     f8e4m3: |x - read| <= |x| / 16 (half a step of 3 mantissa bits) + a / 448 * 2^-10
//             (half the subnormal step)
//     bf16:   |x - read| <= |x| * 2^-8
//   Attention, CPU vs reference over the same cache: 2e-5 (both read identical dequantized
//   values; f32 dots and Highway's Exp vs double sums, as for f32 caches)
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/reference/reference_backend.h"
#include "backend/reference/reference_ops.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kernels/kernel_test_util.h"

namespace dh {
namespace {

using test::ExpectClose;
using test::Owned;
using test::kKvCacheTypes;
using test::QuantizedCache;
using test::Rng;

// A cache of [slots, heads, dim] in `dtype` with scales in groups of `group` when quantized.
struct OwnedCache {
  Owned data, scales;
  KvCacheView view;
  OwnedCache(DType dtype, int64_t slots, int64_t heads, int64_t dim, int64_t group)
      : data(dtype, {slots, heads, dim}),
        scales(DType::kF32, {slots, heads, QuantizedCache(dtype) ? (dim + group - 1) / group : 1}) {
    view = QuantizedCache(dtype) ? KvCacheView(data.t, scales.t, group) : KvCacheView(data.t);
  }
};

TEST(KvCacheFormat, WriteThenReadIsWithinHalfAStep) {
  ReferenceBackend ref({});
  Rng rng(11);
  const int64_t slots = 8, heads = 2, dim = 48, group = 32;  // groups of 32 and 16 (MLA-like)
  for (DType dtype : kKvCacheTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    OwnedCache cache(dtype, slots, heads, dim, group);
    // Three tokens to slots 5, 1, 6; the second group of token 1 is all zeros, token 2 spans
    // magnitudes from 1e-4 to 30 (fp8 subnormals after scaling).
    Owned k(DType::kF32, {3, heads, dim});
    rng.Fill(k, -3, 3);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = group; i < dim; ++i) k.f32()[(1 * heads + h) * dim + i] = 0.0f;
      for (int64_t i = 0; i < dim; ++i) {
        k.f32()[(2 * heads + h) * dim + i] = (i % 2 ? -1.0f : 1.0f) * 1e-4f * std::pow(1.3f, i);
      }
    }
    std::vector<int32_t> slot_ids = {5, 1, 6};
    ref.KvWrite(k.t, Tensor(), cache.view, KvCacheView(),
                Tensor(slot_ids.data(), DType::kI32, {3}));
    for (int64_t t = 0; t < 3; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t g0 = 0; g0 < dim; g0 += group) {
          const int64_t g1 = std::min(dim, g0 + group);
          float amax = 0;
          for (int64_t i = g0; i < g1; ++i) {
            amax = std::max(amax, std::fabs(k.f32()[(t * heads + h) * dim + i]));
          }
          if (QuantizedCache(dtype)) {
            const float scale = cache.scales.f32()[(slot_ids[t] * heads + h) * 2 + g0 / group];
            EXPECT_EQ(scale, amax / ref::KvQuantMax(dtype));
          }
          for (int64_t i = g0; i < g1; ++i) {
            const float x = k.f32()[(t * heads + h) * dim + i];
            const float got = ref::KvGet(cache.view, slot_ids[t], h, i);
            float tol = 0;
            switch (dtype) {
              case DType::kF32: tol = 0; break;
              case DType::kBF16: tol = std::fabs(x) * 0x1p-8f; break;
              case DType::kF8E4M3: tol = std::fabs(x) / 16 + amax / 448 * 0x1p-10f; break;
              default: tol = amax / 254 + amax * 0x1p-23f; break;
            }
            ASSERT_LE(std::fabs(got - x), tol) << "token " << t << " head " << h << " i " << i;
            if (amax == 0) {
              EXPECT_EQ(got, 0.0f);
            }
          }
        }
      }
    }
  }
}

TEST(KvCacheFormat, NarrowRowKeepsTheGroupsScales) {
  Owned data(DType::kI8, {4, 1, 12}), scales(DType::kF32, {4, 1, 2});
  const KvCacheView full(data.t, scales.t, 8);
  const KvCacheView latent = full.NarrowRow(0, 8);
  EXPECT_EQ(latent.dim(2), 8);
  EXPECT_EQ(latent.scales.shape[2], 1);
  const KvCacheView rope = full.NarrowRow(8, 4);
  EXPECT_EQ(rope.scales.data, static_cast<char*>(scales.t.data) + sizeof(float));
  EXPECT_EQ(rope.scales.shape[2], 1);
}

TEST(KvCacheFormat, GatherDequantizesRows) {
  ReferenceBackend ref({});
  Rng rng(12);
  OwnedCache cache(DType::kI8, 6, 1, 10, 8);
  Owned k(DType::kF32, {6, 1, 10});
  rng.Fill(k, -2, 2);
  std::vector<int32_t> all = {0, 1, 2, 3, 4, 5}, pick = {4, 0, 4};
  ref.KvWrite(k.t, Tensor(), cache.view, KvCacheView(), Tensor(all.data(), DType::kI32, {6}));
  Owned out(DType::kF32, {3, 1, 10});
  ref.KvGather(cache.view, Tensor(pick.data(), DType::kI32, {3}), out.t);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 10; ++i) {
      EXPECT_EQ(out.f32()[r * 10 + i], ref::KvGet(cache.view, pick[r], 0, i));
    }
  }
}

// A paged batch over a cache of `dtype`: per sequence its cached length and query count.
struct QuantAttnCase {
  int64_t hq, hkv, dk, dv, group;
  bool v_is_k_prefix;  // MLA: the values are the first dv (= group) elements of the key rows
  int block_size;
  std::vector<std::pair<int, int>> seqs;
};

// Returns how many output elements differ from the reference at all (the CPU kernel's f32 sums
// are not the reference's double sums, so 0 everywhere would mean the reference ran).
int RunCase(Backend& cpu, Backend& ref, DType dtype, const QuantAttnCase& c, Rng& rng) {
  const int num_seqs = static_cast<int>(c.seqs.size());
  int max_blocks = 0, num_tokens = 0, max_len = 0;
  for (auto [len, nq] : c.seqs) {
    max_blocks = std::max(max_blocks, (len + c.block_size - 1) / c.block_size);
    num_tokens += nq;
    max_len = std::max(max_len, len);
  }
  const int num_blocks = num_seqs * max_blocks + 2;
  const int64_t slots = static_cast<int64_t>(num_blocks) * c.block_size;
  std::vector<int32_t> order(num_blocks);
  std::iota(order.begin(), order.end(), 0);
  for (int i = num_blocks - 1; i > 0; --i) std::swap(order[i], order[rng.Int(0, i)]);
  std::vector<int32_t> qs = {0}, lens, tables(num_seqs * max_blocks, 0);
  for (int s = 0; s < num_seqs; ++s) {
    lens.push_back(c.seqs[s].first);
    qs.push_back(qs.back() + c.seqs[s].second);
    for (int b = 0; b < max_blocks; ++b) tables[s * max_blocks + b] = order[s * max_blocks + b];
  }
  // Every slot written through the reference KvWrite (keys and values of different ranges).
  OwnedCache kc(dtype, slots, c.hkv, c.dk, c.group), vc(dtype, slots, c.hkv, c.dv, c.group);
  Owned k(DType::kF32, {slots, c.hkv, c.dk}), v(DType::kF32, {slots, c.hkv, c.dv});
  rng.Fill(k, -2, 2);
  rng.Fill(v, -0.5f, 0.5f);
  std::vector<int32_t> all(slots);
  std::iota(all.begin(), all.end(), 0);
  const Tensor all_t(all.data(), DType::kI32, {slots});
  KvCacheView k_view = kc.view, v_view = vc.view;
  if (c.v_is_k_prefix) {
    ref.KvWrite(k.t, Tensor(), kc.view, KvCacheView(), all_t);
    v_view = kc.view.NarrowRow(0, c.dv);
  } else {
    ref.KvWrite(k.t, v.t, kc.view, vc.view, all_t);
  }
  Owned q(DType::kF32, {num_tokens, c.hq, c.dk});
  rng.Fill(q, -2, 2);
  // bf16 values for a bf16 cache, whose scores the CPU takes on bf16 queries where it has
  // AVX512-BF16 (backend/cpu/attention.h, AttendBf16Dot): the same bound holds on both paths.
  if (dtype == DType::kBF16) test::RoundToBf16(q);
  const AttentionMeta meta =
      HostAttentionMeta(qs, lens, tables, num_tokens, c.block_size, max_blocks, max_len);
  Owned got(DType::kF32, {num_tokens, c.hq, c.dv}), want(DType::kF32, {num_tokens, c.hq, c.dv});
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  cpu.Attention(q.t, k_view, v_view, meta, scale, got.t);
  ref.Attention(q.t, k_view, v_view, meta, scale, want.t);
  ExpectClose(got.ToVector(), want.ToVector(), 2e-5f,
              fmt::format("attention {} Hq={} Hkv={} Dk={} Dv={} group={} seqs={}",
                          DTypeName(dtype), c.hq, c.hkv, c.dk, c.dv, c.group, c.seqs.size()));
  int differ = 0;
  for (int64_t i = 0; i < got.t.numel(); ++i) differ += got.f32()[i] != want.f32()[i];
  return differ;
}

TEST(KvCacheAttention, CpuMatchesReferenceOnEveryFormatAndTarget) {
  CpuBackend cpu({.num_threads = 2});
  ReferenceBackend ref({});
  const QuantAttnCase cases[] = {
      {8, 2, 33, 33, 33, false, 4, {{5, 5}, {17, 1}, {1, 1}}},      // GQA 4, odd head dim
      {4, 4, 64, 64, 64, false, 16, {{40, 3}, {9, 9}}},             // MHA, chunked prefill
      {6, 1, 40, 32, 32, true, 4, {{37, 1}, {12, 2}}},              // MLA: latent 32 + rope 8
      {16, 1, 576, 512, 512, true, 16, {{50, 1}}},                  // DeepSeek-V3's latent row
  };
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  Rng rng(13);
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    ASSERT_STREQ(cpu::DispatchedTargetName(), hwy::TargetName(target));
    for (DType dtype : kKvCacheTypes) {
      int differ = 0;
      for (const QuantAttnCase& c : cases) differ += RunCase(cpu, ref, dtype, c, rng);
      EXPECT_GT(differ, 0) << DTypeName(dtype) << ": bit-identical to the reference everywhere";
    }
    if (HasFatalFailure()) break;
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(KvCacheAttention, CpuSupportsEveryCacheFormat) {
  CpuBackend cpu({.num_threads = 1});
  for (DType dtype : kKvCacheTypes) {
    EXPECT_TRUE(cpu.Supports({OpKind::kAttention, WeightFormat::kDense, dtype})) << DTypeName(dtype);
  }
}

}  // namespace
}  // namespace dh
