// CpuBackend's Rope, KvWrite and KvGather (rope_kv.cc) against the reference on every SIMD target
// compiled in that the CPU supports. Tolerance: none. Every output byte must equal the
// reference's (rotated rows, cache values, scales, gathered rows), including the bytes an op must
// leave alone; each call's kernel note must name the SIMD kernel, so a fallback to the reference
// cannot pass. The stored formats are also swept over f32 bit patterns: every exponent, the ties
// of each format's rounding, subnormals, infinities and NaN (i8: finite values only, where the
// reference's cast is defined).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/kernel_note.h"
#include "backend/reference/reference_backend.h"
#include "base/log.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kernels/kernel_test_util.h"

namespace dh {
namespace {

using test::Owned;
using test::QuantizedCache;
using test::Rng;

constexpr DType kCacheTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3,
                                 DType::kI8};

// The first differing byte of two buffers, or -1.
int64_t FirstDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}
void ExpectSameBytes(const Owned& got, const Owned& want, const std::string& what) {
  const int64_t at = FirstDifference(got.bytes, want.bytes);
  EXPECT_EQ(at, -1) << what << ": byte " << at << " of " << got.bytes.size() << " differs";
}

void ExpectKernel(const char* name, const std::string& what) {
  const KernelNote note = TakeKernelNote();
  EXPECT_STREQ(note.name, name) << what;
}

class RopeKvTest : public ::testing::Test {
 protected:
  // Runs body once per SIMD target, forcing the dispatcher onto that target.
  template <typename Body>
  void ForEachTarget(Body body) {
    test::ForEachTarget([&](int64_t target) {
      ASSERT_STREQ(cpu::DispatchedTargetName(), hwy::TargetName(target));
      body();
    });
  }

  ReferenceBackend ref_{BackendOptions{}};
  CpuBackend cpu_{BackendOptions{.num_threads = 2}};
};

struct RopeCase {
  RopeStyle style;
  int64_t tokens, heads, fused_heads, dim;  // x is heads [1, 1 + heads) of [T, fused_heads, D]
  int offset, rot_dim;
  float factor;
};

// Rope on the same strided slice of two copies of one buffer, in place, both backends.
void RunRope(Backend& cpu, Backend& ref, const RopeCase& c, const std::vector<int32_t>& pos,
             float base, Rng& rng) {
  const std::string what =
      fmt::format("rope {} T={} H={} D={} offset={} rot={} factor={} base={}",
                  c.style == RopeStyle::kHalf ? "half" : "interleaved", c.tokens, c.heads, c.dim,
                  c.offset, c.rot_dim, c.factor, base);
  Owned got(DType::kF32, {c.tokens, c.fused_heads, c.dim}),
      want(DType::kF32, {c.tokens, c.fused_heads, c.dim});
  rng.Fill(want, -4, 4);
  got.bytes = want.bytes;
  Owned inv_freq(DType::kF32, {c.rot_dim / 2});
  for (int i = 0; i < c.rot_dim / 2; ++i) {
    inv_freq.f32()[i] =
        std::pow(base, -2.0f * static_cast<float>(i) / static_cast<float>(c.rot_dim));
  }
  RopeParams p;
  p.style = c.style;
  p.offset = c.offset;
  p.rot_dim = c.rot_dim;
  p.inv_freq = inv_freq.t;
  p.attention_factor = c.factor;
  const Tensor positions(const_cast<int32_t*>(pos.data()), DType::kI32, {c.tokens});
  TakeKernelNote();
  cpu.Rope(got.t.Narrow(1, 1, c.heads), positions, p);
  ExpectKernel("rope", what);
  ref.Rope(want.t.Narrow(1, 1, c.heads), positions, p);
  ExpectSameBytes(got, want, what);
}

TEST_F(RopeKvTest, RopeMatchesTheReferenceBitForBit) {
  Rng rng(21);
  const std::vector<RopeCase> cases = {
      {RopeStyle::kHalf, 7, 12, 16, 128, 0, 128, 1.0f},         // Qwen2 / Llama heads
      {RopeStyle::kHalf, 5, 3, 5, 72, 4, 46, 1.0f},             // half of 23: odd tails
      {RopeStyle::kInterleaved, 6, 4, 6, 192, 128, 64, 1.25f},  // DeepSeek's rope slice, YaRN
      {RopeStyle::kInterleaved, 3, 2, 4, 40, 2, 38, 1.0f},      // 19 pairs
      {RopeStyle::kHalf, 1, 1, 3, 2, 0, 2, 1.0f},               // one pair
  };
  ForEachTarget([&] {
    for (const RopeCase& c : cases) {
      // Positions out of order, repeated and far apart; then the same count at other positions,
      // and other frequencies, so a reused cos/sin table would show.
      std::vector<int32_t> pos(c.tokens);
      for (int64_t t = 0; t < c.tokens; ++t) pos[t] = static_cast<int32_t>((t * 7919 + 3) % 40000);
      pos[0] = 0;
      if (c.tokens > 2) pos[2] = pos[1];
      RunRope(cpu_, ref_, c, pos, 10000.0f, rng);
      RunRope(cpu_, ref_, c, pos, 10000.0f, rng);
      for (int32_t& p : pos) p += 1;
      RunRope(cpu_, ref_, c, pos, 10000.0f, rng);
      RunRope(cpu_, ref_, c, pos, 1000000.0f, rng);
      RopeCase other = c;
      other.factor = c.factor * 0.5f;
      RunRope(cpu_, ref_, other, pos, 1000000.0f, rng);
    }
  });
}

// A cache [slots, heads, dim] of `dtype` (scales in groups of `group` when quantized), its bytes
// filled with noise so that untouched slots compare too.
struct OwnedCache {
  Owned data, scales;
  KvCacheView view;
  OwnedCache(DType dtype, int64_t slots, int64_t heads, int64_t dim, int64_t group, Rng& rng)
      : data(dtype, {slots, heads, dim}),
        scales(DType::kF32, {slots, heads, QuantizedCache(dtype) ? (dim + group - 1) / group : 1}) {
    for (uint8_t& b : data.bytes) b = static_cast<uint8_t>(rng.Int(0, 255));
    rng.Fill(scales, 0, 1);
    view = QuantizedCache(dtype) ? KvCacheView(data.t, scales.t, group) : KvCacheView(data.t);
  }
  void CopyFrom(const OwnedCache& o) {
    data.bytes = o.data.bytes;
    scales.bytes = o.scales.bytes;
  }
};

struct KvCase {
  int64_t heads, dim, group;
  bool with_v;  // MLA writes its latent and rope key as one k row and no v
};

TEST_F(RopeKvTest, KvWriteAndGatherMatchTheReferenceBitForBit) {
  Rng rng(22);
  const std::vector<KvCase> cases = {
      {2, 128, 128, true}, {3, 72, 32, true}, {1, 576, 512, false}, {2, 5, 4, true}};
  // Tokens to slots with gaps, a padding token (-1) and a slot named twice (the later row wins).
  const std::vector<int32_t> slot_ids = {9, 2, -1, 17, 3, 2, 30, 0};
  const int64_t t_count = static_cast<int64_t>(slot_ids.size()), slots = 32;
  const Tensor slot_t(const_cast<int32_t*>(slot_ids.data()), DType::kI32, {t_count});
  const std::vector<int32_t> pick = {2, 0, 30, 2, 31, 9};
  const Tensor pick_t(const_cast<int32_t*>(pick.data()), DType::kI32, {6});
  ForEachTarget([&] {
    for (const KvCase& c : cases) {
      for (DType dtype : kCacheTypes) {
        const std::string what = fmt::format("kv {} H={} D={} group={} v={}", DTypeName(dtype),
                                             c.heads, c.dim, c.group, c.with_v);
        // k and v are slices of one fused [T, 3 * heads, dim] projection (strided tokens).
        Owned kv(DType::kF32, {t_count, 3 * c.heads, c.dim});
        rng.Fill(kv, -3, 3);
        for (int64_t i = 0; i < 3 * c.heads * c.dim; ++i) {
          kv.f32()[4 * 3 * c.heads * c.dim + i] *= 1e-5f;  // fp8 subnormals after scaling
          kv.f32()[3 * 3 * c.heads * c.dim + i] = 0.0f;    // all-zero groups
        }
        const Tensor k = kv.t.Narrow(1, c.heads, c.heads);
        const Tensor v = c.with_v ? kv.t.Narrow(1, 2 * c.heads, c.heads) : Tensor();
        OwnedCache kc_got(dtype, slots, c.heads, c.dim, c.group, rng),
            vc_got(dtype, slots, c.heads, c.dim, c.group, rng),
            kc_want(dtype, slots, c.heads, c.dim, c.group, rng),
            vc_want(dtype, slots, c.heads, c.dim, c.group, rng);
        kc_want.CopyFrom(kc_got);
        vc_want.CopyFrom(vc_got);
        TakeKernelNote();
        cpu_.KvWrite(k, v, kc_got.view, c.with_v ? vc_got.view : KvCacheView(), slot_t);
        ExpectKernel("kv-write", what);
        ref_.KvWrite(k, v, kc_want.view, c.with_v ? vc_want.view : KvCacheView(), slot_t);
        ExpectSameBytes(kc_got.data, kc_want.data, what + " k values");
        ExpectSameBytes(kc_got.scales, kc_want.scales, what + " k scales");
        ExpectSameBytes(vc_got.data, vc_want.data, what + " v values");
        ExpectSameBytes(vc_got.scales, vc_want.scales, what + " v scales");

        // The gather reads the written slots and unwritten ones (whose noise holds NaNs and
        // infinities in the float formats).
        Owned got(DType::kF32, {6, c.heads, c.dim}), want(DType::kF32, {6, c.heads, c.dim});
        TakeKernelNote();
        cpu_.KvGather(kc_want.view, pick_t, got.t);
        ExpectKernel("kv-gather", what);
        ref_.KvGather(kc_want.view, pick_t, want.t);
        ExpectSameBytes(got, want, what + " gather");
      }
    }
  });
}

// f32 bit patterns for a format that keeps `kept` mantissa bits: a sweep over all of f32, and
// around every exponent the ties of that rounding and their neighbours.
std::vector<float> Patterns(int kept) {
  std::vector<uint32_t> bits;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 40009) bits.push_back(static_cast<uint32_t>(u));
  const uint32_t tie = 1u << (22 - kept);
  for (uint32_t e = 0; e < 255; ++e) {
    for (uint32_t m : {0u, 1u, 2u, 5u, (1u << kept) - 1}) {
      const uint32_t base = (e << 23) | (m << (23 - kept)) | tie;
      for (uint32_t u : {base - 1, base, base + 1}) bits.push_back(u);
    }
  }
  bits.push_back(0x7f800000u);  // inf
  bits.push_back(0x7fc00001u);  // NaN
  bits.push_back(0x7f800001u);  // signalling NaN
  std::vector<float> out;
  for (uint32_t u : bits) {
    for (uint32_t sign : {0u, 0x80000000u}) out.push_back(std::bit_cast<float>(u | sign));
  }
  return out;
}

// One token written into one head row of `dtype`: f32 values exactly as the rows hold them (the
// quantized types get a first element that makes the scale 1, so the row itself is converted).
void SweepFormat(Backend& cpu, Backend& ref, DType dtype, std::vector<float> row) {
  const int64_t dim = static_cast<int64_t>(row.size());
  Rng rng(23);
  OwnedCache got(dtype, 2, 1, dim, dim, rng), want(dtype, 2, 1, dim, dim, rng);
  want.CopyFrom(got);
  const std::vector<int32_t> slot = {1};
  const Tensor slot_t(const_cast<int32_t*>(slot.data()), DType::kI32, {1});
  const Tensor k(row.data(), DType::kF32, {1, 1, dim});
  TakeKernelNote();
  cpu.KvWrite(k, Tensor(), got.view, KvCacheView(), slot_t);
  ExpectKernel("kv-write", std::string(DTypeName(dtype)));
  ref.KvWrite(k, Tensor(), want.view, KvCacheView(), slot_t);
  if (QuantizedCache(dtype)) {
    ASSERT_EQ(want.scales.f32()[1], 1.0f) << DTypeName(dtype);
  }
  ExpectSameBytes(got.data, want.data, fmt::format("{} sweep of {}", DTypeName(dtype), dim));
}

TEST_F(RopeKvTest, StoredFormatsRoundAsTheReferenceOverF32BitPatterns) {
  ForEachTarget([&] {
    SweepFormat(cpu_, ref_, DType::kBF16, Patterns(7));
    SweepFormat(cpu_, ref_, DType::kF16, Patterns(10));
    for (DType dtype : {DType::kF8E4M3, DType::kI8}) {
      const float qmax = dtype == DType::kI8 ? 127.0f : 448.0f;
      std::vector<float> row = {qmax};
      for (float v : Patterns(dtype == DType::kI8 ? 0 : 3)) {
        if (std::fabs(v) <= qmax || (dtype == DType::kF8E4M3 && std::isnan(v))) row.push_back(v);
      }
      // Halfway between integers (i8) and between subnormal steps of 2^-9 (f8e4m3).
      for (int i = -254; i <= 254; ++i) row.push_back(static_cast<float>(i) * 0.5f);
      for (int i = 0; i < 40; ++i) row.push_back((static_cast<float>(i) + 0.5f) * 0x1p-9f);
      SweepFormat(cpu_, ref_, dtype, row);
    }
  });
}

TEST_F(RopeKvTest, TraceNamesTheKernels) {
  SetLogLevel(LogLevel::kInfo);
  CpuBackend traced(BackendOptions{.num_threads = 2, .trace_kernels = true});
  Rng rng(24);
  Owned x(DType::kF32, {3, 2, 8}), inv_freq(DType::kF32, {4});
  rng.Fill(x);
  rng.Fill(inv_freq, 0, 1);
  const std::vector<int32_t> pos = {0, 1, 2};
  const Tensor pos_t(const_cast<int32_t*>(pos.data()), DType::kI32, {3});
  RopeParams p;
  p.rot_dim = 8;
  p.inv_freq = inv_freq.t;
  OwnedCache cache(DType::kI8, 4, 2, 8, 4, rng);
  Owned gathered(DType::kF32, {3, 2, 8});
  ::testing::internal::CaptureStderr();
  traced.Rope(x.t, pos_t, p);
  traced.KvWrite(x.t, Tensor(), cache.view, KvCacheView(), pos_t);
  traced.KvGather(cache.view, pos_t, gathered.t);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("rope half T=3 H=2 D=8 rot=8 target="), std::string::npos) << log;
  EXPECT_NE(log.find("kv_write i8 T=3 H=2 D=8 target="), std::string::npos) << log;
  EXPECT_NE(log.find("kv_gather i8 N=3 H=2 D=8 target="), std::string::npos) << log;
  EXPECT_EQ(log.find("reference"), std::string::npos) << log;
  EXPECT_TRUE(traced.Supports({OpKind::kRope}));
  EXPECT_TRUE(traced.Supports({OpKind::kKvWrite, WeightFormat::kDense, DType::kF8E4M3}));
  EXPECT_FALSE(traced.Supports({OpKind::kKvGather, WeightFormat::kDense, DType::kI32}));
}

}  // namespace
}  // namespace dh
