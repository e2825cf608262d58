// CpuBackend::Attention's blocking (backend/cpu/attention.h: blocks of up to kAttendMaxRows query
// rows of one sequence and kv head, keys in blocks of kAttendKeyBlock, keys cut into ranges when
// there are fewer row blocks than threads or, in a decode with several kv heads, into chunks of
// kAttendHeadChunk keys, merged after) against the reference, on every KV
// cache dtype and every SIMD target compiled in: row counts that are not a multiple of the block
// nor of a vector, GQA ratios 1, 4, 6 and 16, head dims 33, 64, 128, 192 (values 128) and MLA's
// 576 / 512 (values inside the keys), key counts around the key block, several sequences of
// different lengths and query counts in one call (prefill, chunked prefill, decode), shuffled
// block tables with unused blocks between them, strided query and output rows, caches slot by
// slot and head by head, 1 to 3 threads.
//
// Tolerance: |cpu - ref| <= 2e-5 * max(1, max |ref|) per element, as the other attention tests
// (both read identical dequantized cache values; f32 dots, Highway's Exp and an online softmax
// against the reference's double sums). With a bf16 cache the queries are bf16 values there, so
// that the scores on vdpbf16ps (attention.h, AttendBf16Dot: the queries rounded to bf16) are held
// to the same bound; Bf16CacheScoresRoundTheQueries tests that rounding itself.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_bf16.h"
#include "backend/reference/reference_backend.h"
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

struct BlockCase {
  int64_t hq, hkv, dk, dv;
  bool v_is_k_prefix;  // MLA: the values are the first dv key elements
  int block_size;
  std::vector<std::pair<int, int>> seqs;  // (cached length, queries: its last positions)
  int threads;
  int64_t row_pad = 0;  // extra floats between query (and output) rows
  bool head_major = false;  // the cache head by head (KvStorage's CPU layout), scales too
};

// How the queries meet the two backends.
enum class Queries {
  kAsDrawn,        // the drawn f32 values to both
  kBf16,           // rounded to bf16 for both (a bf16 cache in the every-case test)
  kBf16ForTheRef,  // drawn values to the CPU, rounded ones to the reference
};

// Returns how many output elements differ from the reference at all; *max_err (if given) gets
// the largest |cpu - ref| over max(1, max |ref|). check: expect them within the tolerance.
int RunBlockCase(CpuBackend& cpu, ReferenceBackend& ref, DType dtype, const BlockCase& c,
                 Rng& rng, Queries queries = Queries::kAsDrawn, float* max_err = nullptr,
                 bool check = true) {
  const int num_seqs = static_cast<int>(c.seqs.size());
  int max_blocks = 0, num_tokens = 0, max_len = 0;
  for (auto [len, nq] : c.seqs) {
    max_blocks = std::max(max_blocks, (len + c.block_size - 1) / c.block_size);
    num_tokens += nq;
    max_len = std::max(max_len, len);
  }
  // Twice the blocks needed, handed out shuffled: the tables skip over unused blocks.
  const int num_blocks = 2 * num_seqs * max_blocks;
  const int64_t slots = static_cast<int64_t>(num_blocks) * c.block_size;
  std::vector<int32_t> order(num_blocks);
  std::iota(order.begin(), order.end(), 0);
  for (int i = num_blocks - 1; i > 0; --i) std::swap(order[i], order[rng.Int(0, i)]);
  std::vector<int32_t> qs = {0}, lens, tables(num_seqs * max_blocks, 0);
  for (int s = 0; s < num_seqs; ++s) {
    lens.push_back(c.seqs[s].first);
    qs.push_back(qs.back() + c.seqs[s].second);
    for (int b = 0; b < max_blocks; ++b)
      tables[s * max_blocks + b] = order[2 * (s * max_blocks + b)];
  }
  // K and V share the group size (CpuBackend needs one cache format): the shorter row, so a
  // 192-wide key row has groups of 128 and 64 and MLA's latent and rope key one scale each.
  const int64_t group = std::min(c.dk, c.dv);
  auto groups = [&](int64_t dim) { return QuantizedCache(dtype) ? (dim + group - 1) / group : 1; };
  Owned kdata(dtype, {slots, c.hkv, c.dk}), vdata(dtype, {slots, c.hkv, c.dv});
  Owned kscales(DType::kF32, {slots, c.hkv, groups(c.dk)}),
      vscales(DType::kF32, {slots, c.hkv, groups(c.dv)});
  if (c.head_major) {  // the same buffers, a head's slots side by side
    for (Owned* o : {&kdata, &vdata, &kscales, &vscales}) o->t = HeadMajorKv(o->t);
  }
  KvCacheView k_view =
      QuantizedCache(dtype) ? KvCacheView(kdata.t, kscales.t, group) : KvCacheView(kdata.t);
  KvCacheView v_view =
      QuantizedCache(dtype) ? KvCacheView(vdata.t, vscales.t, group) : KvCacheView(vdata.t);
  Owned k(DType::kF32, {slots, c.hkv, c.dk}), v(DType::kF32, {slots, c.hkv, c.dv});
  rng.Fill(k, -2, 2);
  rng.Fill(v, -1, 1);
  std::vector<int32_t> all(slots);
  std::iota(all.begin(), all.end(), 0);
  const Tensor all_t(all.data(), DType::kI32, {slots});
  if (c.v_is_k_prefix) {
    ref.KvWrite(k.t, Tensor(), k_view, KvCacheView(), all_t);
    v_view = k_view.NarrowRow(0, c.dv);
  } else {
    ref.KvWrite(k.t, v.t, k_view, v_view, all_t);
  }
  // Query and output rows [tokens, heads, dim] inside wider rows when row_pad > 0.
  Owned qbuf(DType::kF32, {num_tokens, c.hq * c.dk + c.row_pad});
  Owned gotbuf(DType::kF32, {num_tokens, c.hq * c.dv + c.row_pad});
  Owned wantbuf(DType::kF32, {num_tokens, c.hq * c.dv + c.row_pad});
  rng.Fill(qbuf, -2, 2);
  Owned qref(DType::kF32, {num_tokens, c.hq * c.dk + c.row_pad});
  if (queries == Queries::kBf16) test::RoundToBf16(qbuf);
  std::copy_n(qbuf.f32(), qbuf.t.numel(), qref.f32());
  if (queries == Queries::kBf16ForTheRef) test::RoundToBf16(qref);
  auto rows3 = [&](Owned& buf, int64_t dim) {
    Tensor t = buf.t;
    t.ndim = 3;
    t.shape[1] = c.hq;
    t.shape[2] = dim;
    t.stride[0] = c.hq * dim + c.row_pad;
    t.stride[1] = dim;
    t.stride[2] = 1;
    return t;
  };
  const Tensor q = rows3(qbuf, c.dk), got = rows3(gotbuf, c.dv), want = rows3(wantbuf, c.dv);
  const Tensor q_ref = rows3(qref, c.dk);
  const AttentionMeta meta =
      HostAttentionMeta(qs, lens, tables, num_tokens, c.block_size, max_blocks, max_len);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  cpu.Attention(q, k_view, v_view, meta, scale, got);
  ref.Attention(q_ref, k_view, v_view, meta, scale, want);
  // Compared row by row without the padding (which neither backend writes).
  std::vector<float> g, w;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* gr = gotbuf.f32() + t * got.stride[0];
    const float* wr = wantbuf.f32() + t * want.stride[0];
    g.insert(g.end(), gr, gr + c.hq * c.dv);
    w.insert(w.end(), wr, wr + c.hq * c.dv);
  }
  if (max_err != nullptr) {
    float top = 1.0f, err = 0.0f;
    for (size_t i = 0; i < g.size(); ++i) {
      top = std::max(top, std::fabs(w[i]));
      err = std::max(err, std::fabs(g[i] - w[i]));
    }
    *max_err = err / top;
  }
  if (check) {
    ExpectClose(g, w, 2e-5f,
                fmt::format("attention {} Hq={} Hkv={} Dk={} Dv={} seqs={} threads={}",
                            DTypeName(dtype), c.hq, c.hkv, c.dk, c.dv, c.seqs.size(),
                            c.threads));
  }
  int differ = 0;
  for (size_t i = 0; i < g.size(); ++i) differ += g[i] != w[i];
  return differ;
}

TEST(AttentionBlocking, MatchesReferenceOnEveryShapeFormatAndTarget) {
  const BlockCase cases[] = {
      // Qwen2-1.5B's GQA 6 prefill: 270 rows = 8 blocks of 32 + 14, 45 keys = 32 + 13.
      {12, 2, 128, 128, false, 16, {{45, 45}}, 2},
      // GQA 4: a prefill, a decode and a chunked prefill (cached context before its queries).
      {8, 2, 64, 64, false, 16, {{70, 70}, {33, 1}, {100, 7}}, 3},
      // MHA (ratio 1) with 192-wide keys and 128-wide values, strided query and output rows.
      {3, 3, 192, 128, false, 4, {{37, 37}, {5, 2}}, 2, 8},
      // MLA absorbed: 16 heads on one latent kv head, 3 queries = 48 rows = 32 + 16.
      {16, 1, 576, 512, true, 16, {{40, 3}, {65, 1}}, 2},
      // Fewer row blocks than threads: keys cut into ranges of whole key blocks, merged after.
      // MLA decode alone (ranges 32 + 18), MLA two queries (64 + 6, rows seeing 69 and 70
      // keys), GQA 6 decode over 3 threads (64 + 36).
      {16, 1, 576, 512, true, 16, {{50, 1}}, 3},
      {16, 1, 576, 512, true, 16, {{70, 2}}, 2},
      {12, 2, 128, 128, false, 16, {{100, 1}}, 3},
      // Decode with several kv heads past kAttendHeadChunk (256) keys: keys cut into chunks,
      // every head of a chunk on one thread, merged after. GQA 6 on 2 threads (256 + 256 +
      // 88); three sequences of 300, 700 and 257 keys, one with 2 queries (12 rows); MHA with
      // 4 kv heads on one thread.
      {12, 2, 128, 128, false, 16, {{600, 1}}, 2},
      {12, 2, 64, 64, false, 16, {{300, 1}, {700, 2}, {257, 1}}, 3},
      {4, 4, 64, 64, false, 8, {{520, 1}}, 1},
      // The cache head by head, as KvStorage lays out the CPU backend's (no head chunks):
      // GQA 6 decode at 600 keys on 2 threads, the GQA 4 mix above, MHA with 4 kv heads, MHA
      // 192 / 128 with strided rows.
      {12, 2, 128, 128, false, 16, {{600, 1}}, 2, 0, true},
      {8, 2, 64, 64, false, 16, {{70, 70}, {33, 1}, {100, 7}}, 3, 0, true},
      {4, 4, 64, 64, false, 8, {{520, 1}}, 1, 0, true},
      {3, 3, 192, 128, false, 4, {{37, 37}, {5, 2}}, 2, 8, true},
      // Odd head dims (tails of every vector and tile), tiny pages, one thread.
      {6, 1, 33, 33, false, 4, {{9, 9}, {1, 1}, {64, 2}}, 1},
  };
  Rng rng(23);
  ReferenceBackend ref({});
  std::vector<std::unique_ptr<CpuBackend>> cpus;  // [threads - 1]
  for (int n = 1; n <= 3; ++n)
    cpus.push_back(std::make_unique<CpuBackend>(BackendOptions{.num_threads = n}));
  test::ForEachTarget([&](int64_t target) {
    ASSERT_STREQ(cpu::DispatchedTargetName(), hwy::TargetName(target));
    for (DType dtype : kKvCacheTypes) {
      for (const BlockCase& c : cases) {
        // f32 sums against double ones differ somewhere: identical outputs would mean the
        // reference ran (a format CpuBackend::Attention does not take).
        const Queries queries = dtype == DType::kBF16 ? Queries::kBf16 : Queries::kAsDrawn;
        EXPECT_GT(RunBlockCase(*cpus[c.threads - 1], ref, dtype, c, rng, queries), 0)
            << DTypeName(dtype) << " Hq=" << c.hq << " Dk=" << c.dk
            << ": bit-identical to the reference";
      }
    }
  });
}

// A bf16 cache where the CPU has vdpbf16ps (AttendBf16Dot): every path rounds the queries to
// bf16 (the row-vector tiles of prefill and of MLA's 16 heads in decode, decode's few rows of
// GQA and MHA, each scored on vdpbf16ps; the f32 tiles where dk does not fit those), so they
// match the reference given the rounded queries (the bound above) and miss the one given the
// drawn ones by far more; with DH_BF16_DOT=off (ScopedBf16DotForTest) the queries stay f32 and
// match the drawn ones.
TEST(AttentionBlocking, Bf16CacheScoresRoundTheQueries) {
  if (!cpu::AttendBf16Dot()) GTEST_SKIP() << "no AVX512-BF16 here (or DH_BF16_DOT=off)";
  const BlockCase cases[] = {
      {16, 1, 576, 512, true, 16, {{300, 1}}, 2},             // MLA decode, keys prefetched
      {16, 1, 576, 512, true, 16, {{40, 3}, {65, 1}}, 2},      // MLA, 48 rows: two vectors
      {12, 2, 128, 128, false, 16, {{45, 45}}, 2},             // GQA 6 prefill
      {3, 3, 192, 128, false, 4, {{37, 37}, {5, 2}}, 1, 8},    // MHA prefill, strided rows
      {12, 2, 128, 128, false, 16, {{600, 1}}, 2, 0, true},   // GQA 6 decode: bf16 row dots
      // The rounded rows on the f32 tiles: dk 48 (a multiple of 16, not of 32: DotScores) and
      // 33 (odd: the outer tile without pairs).
      {8, 2, 48, 48, false, 16, {{70, 1}, {20, 3}}, 2},
      {6, 1, 33, 33, false, 4, {{9, 9}, {64, 2}}, 1},
  };
  Rng rng(29);
  ReferenceBackend ref({});
  CpuBackend cpu1(BackendOptions{.num_threads = 1}), cpu2(BackendOptions{.num_threads = 2});
  for (const BlockCase& c : cases) {
    CpuBackend& cpu = c.threads == 1 ? cpu1 : cpu2;
    const std::string what = fmt::format("Hq={} Dk={} seqs={}", c.hq, c.dk, c.seqs.size());
    float err = 0.0f;
    RunBlockCase(cpu, ref, DType::kBF16, c, rng, Queries::kBf16ForTheRef, &err);
    EXPECT_LE(err, 2e-5f) << what << ": against the reference on bf16 queries";
    // Against the drawn queries the rounding shows: each moves by up to 2^-9 of itself.
    float drawn = 0.0f;
    RunBlockCase(cpu, ref, DType::kBF16, c, rng, Queries::kAsDrawn, &drawn, /*check=*/false);
    EXPECT_GT(drawn, 1e-4f) << what << ": the queries were not rounded";
    cpu::ScopedBf16DotForTest off(cpu::Bf16Dot::kOff);
    ASSERT_FALSE(cpu::AttendBf16Dot());
    RunBlockCase(cpu, ref, DType::kBF16, c, rng, Queries::kAsDrawn, &err);
    EXPECT_LE(err, 2e-5f) << what << ": DH_BF16_DOT=off against the drawn queries";
  }
}

}  // namespace
}  // namespace dh
