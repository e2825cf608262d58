// Every registered backend (backend/registry.h) against ReferenceBackend, through the backend's
// own memory: inputs are uploaded with Allocate + CopyToDevice, outputs read back with CopyToHost,
// and whole output buffers are compared (so writes outside a strided view are caught). A backend
// whose creation fails here (cuda without a GPU) is skipped with the reason.
//
// Tolerances (|got - ref| <= tol * max(1, max|ref|)) hold for any backend that accumulates in f32:
//   MatMul f32 weights:                 2e-5
//   MatMul bf16 / f16 weights:          8e-3 / 1e-3 (a GPU GEMM may round activations to the
//                                       weight's 16-bit type before its tensor cores; f32 sums)
//   MatMul fp8 / int8 / int4:           2e-5 (exact weights; f32 products)
//   Attention:                          1e-4 (f32 dots and online softmax vs double sums)
//   RmsNorm, AddRmsNorm, SiluMul, Rope: 1e-5
//   MoeGate weights:                    1e-6; expert ids exact
//   MoeExperts:                         f32 5e-5, bf16 8e-3
//   Embedding, Add, Copy, GatherRows, KvWrite: exact
#include <cctype>
#include <cmath>
#include <cstring>
#include <tuple>
#include <numeric>
#include <string>

#include <gtest/gtest.h>

#include "backend/reference/reference_backend.h"
#include "backend/registry.h"
#include "kernels/kernel_test_util.h"

namespace dh {
namespace {

using test::ExpectClose;
using test::Owned;
using test::Rng;

// A view `t` into a device buffer holding a copy of a host Owned's bytes.
struct Dev {
  std::unique_ptr<Buffer> buf;
  Tensor t;
  size_t bytes = 0;
};

class BackendConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    BackendOptions o;
    o.num_threads = 2;
    auto b = CreateBackend(GetParam(), o);
    if (!b.ok()) GTEST_SKIP() << "backend " << GetParam() << " unavailable: " << b.status().message();
    backend_ = std::move(*b);
  }
  Backend& dev() { return *backend_; }

  // Uploads all of `o`'s bytes; the device view has `view`'s shape/strides at the same offset.
  Dev Up(const Owned& o, const Tensor& view) {
    Dev d;
    d.bytes = o.bytes.size();
    d.buf = dev().Allocate(d.bytes);
    EXPECT_TRUE(d.buf != nullptr);
    dev().CopyToDevice(Tensor(d.buf->data(), DType::kU8, {static_cast<int64_t>(d.bytes)}),
                       o.bytes.data());
    d.t = view;
    d.t.data = static_cast<char*>(d.buf->data()) +
               (static_cast<const char*>(view.data) - reinterpret_cast<const char*>(o.bytes.data()));
    return d;
  }
  Dev Up(const Owned& o) { return Up(o, o.t); }
  std::vector<uint8_t> DownBytes(const Dev& d) {
    std::vector<uint8_t> out(d.bytes);
    dev().CopyToHost(out.data(), Tensor(d.buf->data(), DType::kU8, {static_cast<int64_t>(d.bytes)}));
    return out;
  }
  // The whole buffer as floats (f32, bf16 or f16 elements).
  std::vector<float> Down(const Dev& d, DType dtype = DType::kF32) {
    return Floats(DownBytes(d), dtype);
  }
  static std::vector<float> Floats(const std::vector<uint8_t>& bytes, DType dtype) {
    std::vector<float> f(bytes.size() / DTypeSize(dtype));
    for (size_t i = 0; i < f.size(); ++i) {
      uint16_t h;
      switch (dtype) {
        case DType::kBF16: std::memcpy(&h, &bytes[2 * i], 2); f[i] = BF16ToF32(h); break;
        case DType::kF16: std::memcpy(&h, &bytes[2 * i], 2); f[i] = F16ToF32(h); break;
        default: std::memcpy(&f[i], &bytes[4 * i], 4); break;
      }
    }
    return f;
  }
  static std::vector<float> Floats(const Owned& o) { return Floats(o.bytes, o.t.dtype); }
  ReferenceBackend ref_{BackendOptions{}};
  std::unique_ptr<Backend> backend_;
};

// Deep copy of an Owned (same dtype, shape, bytes).
void Clone(const Owned& src, Owned& dst) {
  dst.bytes = src.bytes;
  dst.t = src.t;
  dst.t.data = dst.bytes.data();
}

TEST_P(BackendConformance, MatMulDense) {
  struct Shape {
    int64_t m, n, k;
  };
  // M <= 8 and M > 8 (a GPU backend's GEMV and GEMM paths), odd and multiple-of-8 K.
  const Shape shapes[] = {{1, 7, 5}, {1, 33, 64}, {3, 40, 255}, {8, 64, 96}, {9, 17, 128},
                          {33, 31, 100}, {64, 48, 256}};
  Rng rng(11);
  for (DType wt : {DType::kF32, DType::kBF16, DType::kF16}) {
    const float tol = wt == DType::kF32 ? 2e-5f : wt == DType::kBF16 ? 8e-3f : 1e-3f;
    for (const Shape& s : shapes) {
      for (bool with_bias : {false, true}) {
        Owned x(DType::kF32, {s.m, s.k + 3}), w(wt, {s.n, s.k}), bias(DType::kF32, {s.n});
        Owned out(DType::kF32, {s.m, s.n});
        rng.Fill(x);
        rng.Fill(w);
        rng.Fill(bias);
        rng.Fill(out);
        Tensor xv = x.t;
        xv.shape[1] = s.k;  // strided rows
        Owned want;
        Clone(out, want);
        ref_.MatMul(xv, Weight::Dense(w.t), with_bias ? bias.t : Tensor(), want.t);
        Dev dx = Up(x, xv), dw = Up(w), db = Up(bias), dout = Up(out);
        dev().MatMul(dx.t, Weight::Dense(dw.t), with_bias ? db.t : Tensor(), dout.t);
        ExpectClose(Down(dout), Floats(want), tol,
                    fmt::format("matmul {} M={} N={} K={} bias={}", DTypeName(wt), s.m, s.n, s.k,
                                with_bias));
      }
    }
  }
}

TEST_P(BackendConformance, MatMulQuantized) {
  if (GetParam() == "cpu") {
    // The CPU backend quantizes x for its int8/int4 integer-dot kernels by default: its f32-product
    // path is checked in conformance_test.cc and the integer-dot error bound in
    // quant_matmul_test.cc.
    GTEST_SKIP() << "cpu: covered by ConformanceTest.MatMulQuantized and quant_matmul_test.cc";
  }
  Rng rng(12);
  for (int64_t m : {1, 12}) {
    Owned q(DType::kF8E4M3, {37, 70}), sc(DType::kF32, {3, 3});
    rng.Fill(q);
    rng.Fill(sc, 0.01f, 0.1f);
    Owned x(DType::kF32, {m, 70}), out(DType::kF32, {m, 37});
    rng.Fill(x);
    Weight w;
    w.format = WeightFormat::kFp8Block;
    w.rows = 37;
    w.cols = 70;
    w.block_rows = 16;
    w.block_cols = 32;
    w.data = q.t;
    w.scales = sc.t;
    Owned want;
    Clone(out, want);
    ref_.MatMul(x.t, w, Tensor(), want.t);
    Dev dq = Up(q), ds = Up(sc), dx = Up(x), dout = Up(out);
    Weight dw = w;
    dw.data = dq.t;
    dw.scales = ds.t;
    dev().MatMul(dx.t, dw, Tensor(), dout.t);
    ExpectClose(Down(dout), Floats(want), 2e-5f, fmt::format("fp8 M={}", m));
    for (WeightFormat f : {WeightFormat::kInt8, WeightFormat::kInt4}) {
      const bool int4 = f == WeightFormat::kInt4;
      Owned qi(int4 ? DType::kU8 : DType::kI8, {29, int4 ? 48 : 96});
      Owned sci(DType::kF16, {29, 6}), zeros(DType::kU8, {29, 3});
      rng.Fill(qi);
      rng.Fill(sci, 0.01f, 0.1f);
      rng.Fill(zeros);
      Owned xi(DType::kF32, {m, 96}), oi(DType::kF32, {m, 29});
      rng.Fill(xi);
      Weight wi;
      wi.format = f;
      wi.rows = 29;
      wi.cols = 96;
      wi.group_size = 16;
      wi.data = qi.t;
      wi.scales = sci.t;
      if (int4) wi.zeros = zeros.t;
      Owned wanti;
      Clone(oi, wanti);
      ref_.MatMul(xi.t, wi, Tensor(), wanti.t);
      Dev dqi = Up(qi), dsi = Up(sci), dmi = Up(zeros), dxi = Up(xi), doi = Up(oi);
      Weight dwi = wi;
      dwi.data = dqi.t;
      dwi.scales = dsi.t;
      if (int4) dwi.zeros = dmi.t;
      dev().MatMul(dxi.t, dwi, Tensor(), doi.t);
      ExpectClose(Down(doi), Floats(wanti), 2e-5f, fmt::format("{} M={}", WeightFormatName(f), m));
    }
  }
}

TEST_P(BackendConformance, EmbeddingNormsElementwise) {
  Rng rng(13);
  for (DType wt : {DType::kF32, DType::kBF16}) {
    Owned table(wt, {50, 40}), ids(DType::kI32, {7}), out(DType::kF32, {7, 40});
    rng.Fill(table);
    for (int i = 0; i < 7; ++i) ids.i32()[i] = rng.Int(0, 49);
    Owned want;
    Clone(out, want);
    ref_.Embedding(Weight::Dense(table.t), ids.t, want.t);
    Dev dt = Up(table), di = Up(ids), dout = Up(out);
    dev().Embedding(Weight::Dense(dt.t), di.t, dout.t);
    ExpectClose(Down(dout), Floats(want), 0, fmt::format("embedding {}", DTypeName(wt)));
  }
  for (int64_t h : {1, 37, 300}) {
    Owned x(DType::kF32, {5, h}), w(DType::kBF16, {h}), res(DType::kF32, {5, h});
    rng.Fill(x, -3, 3);
    rng.Fill(w);
    rng.Fill(res);
    // RmsNorm in place (out aliases x).
    Owned want;
    Clone(x, want);
    ref_.RmsNorm(want.t, w.t, 1e-6f, want.t);
    Dev dx = Up(x), dw = Up(w);
    dev().RmsNorm(dx.t, dw.t, 1e-6f, dx.t);
    ExpectClose(Down(dx), Floats(want), 1e-5f, fmt::format("rmsnorm H={}", h));
    // AddRmsNorm: residual updated and normalised into a separate out.
    Owned want_res, out(DType::kF32, {5, h}), want_out;
    Clone(res, want_res);
    Clone(out, want_out);
    ref_.AddRmsNorm(want_res.t, x.t, w.t, 1e-6f, want_out.t);
    Dev dx2 = Up(x), dres = Up(res), dout = Up(out);
    dev().AddRmsNorm(dres.t, dx2.t, dw.t, 1e-6f, dout.t);
    ExpectClose(Down(dres), Floats(want_res), 1e-6f, fmt::format("add_rmsnorm residual H={}", h));
    ExpectClose(Down(dout), Floats(want_out), 1e-5f, fmt::format("add_rmsnorm out H={}", h));
    // SiluMul and Add over strided column slices of one [5, 2h] buffer (a fused gate/up).
    Owned gu(DType::kF32, {5, 2 * h}), o2(DType::kF32, {5, h});
    rng.Fill(gu, -4, 4);
    Tensor g = gu.t.Narrow(1, 0, h), u = gu.t.Narrow(1, h, h);
    Owned want_silu, want_add;
    Clone(o2, want_silu);
    Clone(o2, want_add);
    ref_.SiluMul(g, u, want_silu.t);
    ref_.Add(g, u, want_add.t);
    Dev dg = Up(gu, g), du = Up(gu, u), ds = Up(o2), da = Up(o2);
    dev().SiluMul(dg.t, du.t, ds.t);
    dev().Add(dg.t, du.t, da.t);
    ExpectClose(Down(ds), Floats(want_silu), 1e-5f, fmt::format("silu_mul H={}", h));
    ExpectClose(Down(da), Floats(want_add), 0, fmt::format("add H={}", h));
  }
}

TEST_P(BackendConformance, CopyGatherRope) {
  Rng rng(14);
  // Strided copy: a head slice of [T, H, D] into a contiguous tensor, and f32 -> bf16.
  Owned src(DType::kF32, {6, 4, 10}), dst(DType::kF32, {6, 2, 10}), dst16(DType::kBF16, {6, 2, 10});
  rng.Fill(src);
  rng.Fill(dst);
  rng.Fill(dst16);
  const Tensor view = src.t.Narrow(1, 1, 2);
  Owned want, want16;
  Clone(dst, want);
  Clone(dst16, want16);
  ref_.Copy(view, want.t);
  ref_.Copy(view, want16.t);
  Dev ds = Up(src, view), dd = Up(dst), dd16 = Up(dst16);
  dev().Copy(ds.t, dd.t);
  dev().Copy(ds.t, dd16.t);
  ExpectClose(Down(dd), Floats(want), 0, "copy strided");
  ExpectClose(Down(dd16, DType::kBF16), Floats(want16), 0, "copy f32 -> bf16");
  // GatherRows.
  Owned x(DType::kF32, {9, 33}), rows(DType::kI32, {4}), out(DType::kF32, {4, 33});
  rng.Fill(x);
  for (int i = 0; i < 4; ++i) rows.i32()[i] = rng.Int(0, 8);
  Owned want_g;
  Clone(out, want_g);
  ref_.GatherRows(x.t, rows.t, want_g.t);
  Dev dx = Up(x), dr = Up(rows), dout = Up(out);
  dev().GatherRows(dx.t, dr.t, dout.t);
  ExpectClose(Down(dout), Floats(want_g), 0, "gather rows");
  // Rope, both pairings, on a strided head slice with a partial rotation at an offset.
  for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    Owned q(DType::kF32, {5, 6, 24}), pos(DType::kI32, {5}), inv(DType::kF32, {8});
    rng.Fill(q);
    for (int i = 0; i < 5; ++i) pos.i32()[i] = rng.Int(0, 4000);
    for (int i = 0; i < 8; ++i) inv.f32()[i] = std::pow(10000.0f, -static_cast<float>(i) / 8);
    const Tensor heads = q.t.Narrow(1, 1, 4);
    RopeParams p;
    p.style = style;
    p.offset = 4;
    p.rot_dim = 16;
    p.inv_freq = inv.t;
    p.attention_factor = 1.25f;
    Owned want_q;
    Clone(q, want_q);
    ref_.Rope(want_q.t.Narrow(1, 1, 4), pos.t, p);
    Dev dq = Up(q, heads), dp = Up(pos), di = Up(inv);
    RopeParams dp_params = p;
    dp_params.inv_freq = di.t;
    dev().Rope(dq.t, dp.t, dp_params);
    ExpectClose(Down(dq), Floats(want_q), 1e-5f,
                fmt::format("rope {}", style == RopeStyle::kHalf ? "half" : "interleaved"));
  }
}

TEST_P(BackendConformance, KvWriteAndPagedAttention) {
  Rng rng(15);
  struct Case {
    int64_t hq, hkv, dk, dv;
    DType cache;
    int block_size;
    std::vector<std::pair<int, int>> seqs;  // (seq_len, num_queries)
  };
  const Case cases[] = {
      {4, 4, 16, 16, DType::kF32, 16, {{5, 5}}},
      {8, 2, 32, 32, DType::kBF16, 4, {{5, 5}, {17, 1}, {1, 1}}},
      {6, 1, 72, 64, DType::kF32, 4, {{40, 7}, {9, 1}}},  // MLA-like: one latent head
  };
  for (const Case& c : cases) {
    const int num_seqs = static_cast<int>(c.seqs.size());
    int max_blocks = 0, num_tokens = 0;
    for (auto [len, nq] : c.seqs) {
      max_blocks = std::max(max_blocks, (len + c.block_size - 1) / c.block_size);
      num_tokens += nq;
    }
    const int num_blocks = num_seqs * max_blocks + 2;
    const int64_t slots = int64_t{num_blocks} * c.block_size;
    std::vector<int32_t> order(num_blocks);
    std::iota(order.begin(), order.end(), 0);
    for (int i = num_blocks - 1; i > 0; --i) std::swap(order[i], order[rng.Int(0, i)]);
    Owned qs(DType::kI32, {num_seqs + 1}), lens(DType::kI32, {num_seqs}),
        tables(DType::kI32, {num_seqs, max_blocks}), slot_map(DType::kI32, {num_tokens});
    qs.i32()[0] = 0;
    int tok = 0;
    for (int s = 0; s < num_seqs; ++s) {
      const auto [len, nq] = c.seqs[s];
      lens.i32()[s] = len;
      qs.i32()[s + 1] = qs.i32()[s] + nq;
      for (int b = 0; b < max_blocks; ++b) tables.i32()[s * max_blocks + b] = order[s * max_blocks + b];
      for (int j = len - nq; j < len; ++j) {
        slot_map.i32()[tok++] =
            tables.i32()[s * max_blocks + j / c.block_size] * c.block_size + j % c.block_size;
      }
    }
    if (num_tokens > 1) slot_map.i32()[1] = -1;  // a padding token is not written
    Owned kc(c.cache, {slots, c.hkv, c.dk}), vc(c.cache, {slots, c.hkv, c.dv});
    rng.Fill(kc);
    rng.Fill(vc);
    Owned k(DType::kF32, {num_tokens, c.hkv, c.dk}), v(DType::kF32, {num_tokens, c.hkv, c.dv});
    rng.Fill(k);
    rng.Fill(v);
    Owned want_kc, want_vc;
    Clone(kc, want_kc);
    Clone(vc, want_vc);
    ref_.KvWrite(k.t, v.t, want_kc.t, want_vc.t, slot_map.t);
    Dev dk = Up(k), dv = Up(v), dkc = Up(kc), dvc = Up(vc), dsm = Up(slot_map);
    dev().KvWrite(dk.t, dv.t, dkc.t, dvc.t, dsm.t);
    const std::string what = fmt::format("Hq={} Hkv={} Dk={} Dv={} {} bs={}", c.hq, c.hkv, c.dk,
                                         c.dv, DTypeName(c.cache), c.block_size);
    ExpectClose(Down(dkc, c.cache), Floats(want_kc), 0, "kv write k " + what);
    ExpectClose(Down(dvc, c.cache), Floats(want_vc), 0, "kv write v " + what);

    Owned q(DType::kF32, {num_tokens, c.hq, c.dk}), out(DType::kF32, {num_tokens, c.hq, c.dv});
    rng.Fill(q, -2, 2);
    // bf16 values against a bf16 cache, which a backend may score on bf16 queries (the CPU on
    // AVX512-BF16: backend/cpu/attention.h, AttendBf16Dot).
    if (c.cache == DType::kBF16) test::RoundToBf16(q);
    AttentionMeta meta;
    meta.num_seqs = num_seqs;
    meta.num_tokens = num_tokens;
    meta.block_size = c.block_size;
    meta.max_blocks_per_seq = max_blocks;
    for (auto [len, nq] : c.seqs) meta.max_seq_len = std::max(meta.max_seq_len, len);
    meta.host_query_start = std::span(qs.i32(), num_seqs + 1);
    meta.host_seq_lens = std::span(lens.i32(), num_seqs);
    meta.host_block_tables = std::span(tables.i32(), num_seqs * max_blocks);
    AttentionMeta host_meta = meta;
    host_meta.query_start = qs.t;
    host_meta.seq_lens = lens.t;
    host_meta.block_tables = tables.t;
    host_meta.slot_mapping = slot_map.t;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
    Owned want;
    Clone(out, want);
    ref_.Attention(q.t, want_kc.t, want_vc.t, host_meta, scale, want.t);
    Dev dq = Up(q), dout = Up(out), dqs = Up(qs), dl = Up(lens), dt = Up(tables);
    AttentionMeta dmeta = meta;
    dmeta.query_start = dqs.t;
    dmeta.seq_lens = dl.t;
    dmeta.block_tables = dt.t;
    dmeta.slot_mapping = dsm.t;
    dev().Attention(dq.t, dkc.t, dvc.t, dmeta, scale, dout.t);
    ExpectClose(Down(dout), Floats(want), 1e-4f, "attention " + what);
  }
}

TEST_P(BackendConformance, MoeGateAndExperts) {
  Rng rng(16);
  struct GateCase {
    ScoringFunc scoring;
    TopkMethod method;
    int experts, top_k, n_group, topk_group;
    bool norm;
  };
  const GateCase cases[] = {
      {ScoringFunc::kSoftmax, TopkMethod::kGreedy, 16, 4, 1, 1, false},
      {ScoringFunc::kSoftmax, TopkMethod::kGroupLimitedGreedy, 16, 3, 4, 2, true},
      {ScoringFunc::kSigmoid, TopkMethod::kNoauxTc, 32, 6, 8, 3, true},
  };
  for (const GateCase& c : cases) {
    const int64_t T = 9;
    Owned logits(DType::kF32, {T, c.experts}), bias(DType::kF32, {c.experts});
    rng.Fill(logits, -3, 3);
    rng.Fill(bias, -0.2f, 0.2f);
    Owned ids(DType::kI32, {T, c.top_k}), w(DType::kF32, {T, c.top_k});
    MoeGateParams p;
    p.scoring = c.scoring;
    p.method = c.method;
    p.top_k = c.top_k;
    p.n_group = c.n_group;
    p.topk_group = c.topk_group;
    p.norm_topk_prob = c.norm;
    p.routed_scaling_factor = 2.5f;
    const bool noaux = c.method == TopkMethod::kNoauxTc;
    Owned want_ids, want_w;
    Clone(ids, want_ids);
    Clone(w, want_w);
    ref_.MoeGate(logits.t, noaux ? bias.t : Tensor(), p, want_ids.t, want_w.t);
    Dev dl = Up(logits), db = Up(bias), di = Up(ids), dw = Up(w);
    dev().MoeGate(dl.t, noaux ? db.t : Tensor(), p, di.t, dw.t);
    const auto got_ids = DownBytes(di);
    EXPECT_EQ(std::memcmp(got_ids.data(), want_ids.bytes.data(), got_ids.size()), 0)
        << "moe gate ids, method " << static_cast<int>(c.method);
    ExpectClose(Down(dw), Floats(want_w), 1e-6f,
                fmt::format("moe gate weights method {}", static_cast<int>(c.method)));
  }
  // Experts: 6 experts, top 2 of 7 tokens (one slot unrouted), f32 and bf16 weights.
  for (DType wt : {DType::kF32, DType::kBF16}) {
    const int64_t T = 7, H = 24, I = 40, E = 6, K = 2;
    Owned x(DType::kF32, {T, H}), ids(DType::kI32, {T, K}), w(DType::kF32, {T, K});
    Owned out(DType::kF32, {T, H});
    rng.Fill(x);
    rng.Fill(w, 0.1f, 1.0f);
    for (int i = 0; i < T * K; ++i) ids.i32()[i] = rng.Int(0, E - 1);
    ids.i32()[3] = -1;
    std::vector<std::unique_ptr<Owned>> mats;
    std::vector<ExpertWeights> host_experts, dev_experts;
    std::vector<Dev> keep;
    for (int e = 0; e < E; ++e) {
      ExpertWeights hw, dw;
      for (auto [hp, dp, rows, cols] : {std::tuple{&hw.gate, &dw.gate, I, H},
                                        std::tuple{&hw.up, &dw.up, I, H},
                                        std::tuple{&hw.down, &dw.down, H, I}}) {
        mats.push_back(std::make_unique<Owned>(wt, std::initializer_list<int64_t>{rows, cols}));
        rng.Fill(*mats.back(), -0.3f, 0.3f);
        *hp = Weight::Dense(mats.back()->t);
        keep.push_back(Up(*mats.back()));
        *dp = Weight::Dense(keep.back().t);
      }
      host_experts.push_back(hw);
      dev_experts.push_back(dw);
    }
    Owned want;
    Clone(out, want);
    ref_.MoeExperts(x.t, ids.t, w.t, host_experts, want.t);
    Dev dx = Up(x), di = Up(ids), dwt = Up(w), dout = Up(out);
    dev().MoeExperts(dx.t, di.t, dwt.t, dev_experts, dout.t);
    ExpectClose(Down(dout), Floats(want), wt == DType::kF32 ? 5e-5f : 8e-3f,
                fmt::format("moe experts {}", DTypeName(wt)));
  }
}

std::vector<std::string> BackendsUnderTest() {
  std::vector<std::string> names;
  for (const std::string& n : RegisteredBackends()) {
    if (n != "reference") names.push_back(n);  // the oracle itself
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(Registered, BackendConformance, ::testing::ValuesIn(BackendsUnderTest()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace dh
