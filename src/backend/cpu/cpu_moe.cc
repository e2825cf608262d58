// CpuBackend's MoE ops. MoeGate: the reference router's arithmetic (same float/double steps, so
// the same ids and weights bit for bit) over backend-owned scratch instead of per-token vectors.
// MoeExperts: the routed (token, slot) pairs are grouped by expert with a stable
// counting sort, each expert's tokens are gathered into one block of rows and run through the
// backend's own MatMul (so the integer-dot, bf16, FP8 and tiled-GEMM kernels apply, one weight
// pass per expert for all its tokens) and SiluMul, and the outputs are combined per token in slot
// order, as the reference does. When every expert has few rows (decode), whole experts are dealt
// out to the pool's workers instead, each running its expert's FFN on its own thread. Every buffer is backend-owned scratch that only grows, so a
// decode step in the steady state allocates nothing (tests/alloc).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/kernel_note.h"
#include "base/check.h"

namespace dh {

namespace {

bool RowMajor2d(const Tensor& t, DType dtype, int64_t rows, int64_t cols) {
  return t.dtype == dtype && t.ndim == 2 && t.shape[0] == rows && t.shape[1] == cols &&
         (t.stride[1] == 1 || cols == 1) && (t.stride[0] >= cols || rows == 1);
}

// The grouped path needs one SwiGLU shape [I, H] / [H, I] for every expert that gets a token.
bool ExpertShapeOk(const ExpertWeights& e, int64_t hidden, int64_t inter) {
  return e.gate.rows == inter && e.gate.cols == hidden && e.up.rows == inter &&
         e.up.cols == hidden && e.down.rows == hidden && e.down.cols == inter;
}

// Experts run whole on one worker each when none has more rows than this (decode batches).
constexpr int64_t kExpertParallelMaxRows = 16;

// Grain (in rows of `cols` floats) of about 32K elements per chunk.
size_t RowGrain(int64_t cols) {
  return static_cast<size_t>(std::max<int64_t>(1, 32768 / std::max<int64_t>(1, cols)));
}

// Index of the largest v[i] not yet taken (the lowest index among equals), marking it taken; -1
// when every index is taken. The reference's partial_sort order, one pick at a time (k is small).
int TakeLargest(std::span<const float> v, std::span<uint8_t> taken) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(v.size()); ++i) {
    if (taken[i]) continue;
    if (best < 0 || v[i] > v[best]) best = i;
  }
  if (best >= 0) taken[best] = 1;
  return best;
}

}  // namespace

void CpuBackend::MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p,
                         Tensor topk_ids, Tensor topk_weights) {
  const bool layout_ok = logits.ndim == 2 && logits.dtype == DType::kF32 && logits.shape[0] >= 0 &&
                         RowMajor2d(logits, DType::kF32, logits.shape[0], logits.shape[1]) &&
                         RowMajor2d(topk_ids, DType::kI32, logits.shape[0], p.top_k) &&
                         RowMajor2d(topk_weights, DType::kF32, logits.shape[0], p.top_k) &&
                         (bias.empty() || (bias.dtype == DType::kF32 && bias.ndim == 1 &&
                                           (bias.stride[0] == 1 || bias.shape[0] == 1)));
  if (!layout_ok) {
    Trace("moe_gate reference (layout)");
    return ReferenceBackend::MoeGate(logits, bias, p, topk_ids, topk_weights);
  }
  const int64_t t_count = logits.shape[0];
  const int e_count = static_cast<int>(logits.shape[1]);
  DH_CHECK(p.top_k >= 1 && p.top_k <= e_count, "top_k {} of {} experts", p.top_k, e_count);
  const bool grouped = p.method != TopkMethod::kGreedy;
  if (grouped) {
    DH_CHECK(p.n_group >= 1 && e_count % p.n_group == 0 && p.topk_group >= 1 &&
                 p.topk_group <= p.n_group,
             "router groups: {} experts, n_group {}, topk_group {}", e_count, p.n_group,
             p.topk_group);
  }
  const bool use_bias = p.method == TopkMethod::kNoauxTc;
  DH_CHECK(!use_bias || bias.numel() == e_count, "noaux_tc needs a bias of {} experts, got {}",
           e_count, bias.ShapeString());
  NoteKernel("moe-gate");
  Trace("moe_gate T={} E={} k={} groups={}", t_count, e_count, p.top_k, grouped ? p.n_group : 1);
  const int n_group = grouped ? p.n_group : 1, group_size = e_count / n_group;
  GateScratch& g = gate_;
  g.scores.resize(e_count);
  g.choice.resize(e_count);
  g.taken.resize(e_count);
  g.group_scores.resize(n_group);
  g.group_taken.resize(n_group);
  g.chosen.resize(p.top_k);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < t_count; ++t) {
    const float* row = logits.as<const float>() + t * logits.stride[0];
    std::span<float> scores(g.scores), choice(g.choice);
    if (p.scoring == ScoringFunc::kSoftmax) {
      const float mx = *std::max_element(row, row + e_count);
      double sum = 0;
      for (int e = 0; e < e_count; ++e) {
        scores[e] = std::exp(row[e] - mx);
        sum += scores[e];
      }
      for (float& s : scores) s = static_cast<float>(s / sum);
    } else {
      for (int e = 0; e < e_count; ++e) scores[e] = 1.0f / (1.0f + std::exp(-row[e]));
    }
    for (int e = 0; e < e_count; ++e) {
      choice[e] = scores[e] + (use_bias ? bias.as<const float>()[e] : 0.0f);
    }
    if (grouped) {
      for (int gi = 0; gi < n_group; ++gi) {
        const std::span<const float> members = choice.subspan(gi * group_size, group_size);
        if (p.method == TopkMethod::kNoauxTc) {
          // Sum of the top two choices of the group.
          std::span<uint8_t> taken = std::span(g.taken).first(group_size);
          std::fill(taken.begin(), taken.end(), 0);
          float sum = 0;
          for (int i = 0; i < std::min(2, group_size); ++i)
            sum += members[TakeLargest(members, taken)];
          g.group_scores[gi] = sum;
        } else {
          g.group_scores[gi] = *std::max_element(members.begin(), members.end());
        }
      }
      std::fill(g.group_taken.begin(), g.group_taken.end(), 0);
      for (int i = 0; i < p.topk_group; ++i) TakeLargest(g.group_scores, g.group_taken);
      for (int e = 0; e < e_count; ++e) {
        if (!g.group_taken[e / group_size]) choice[e] = kNegInf;
      }
    }
    std::fill(g.taken.begin(), g.taken.end(), 0);
    double sum = 0;
    for (int i = 0; i < p.top_k; ++i) {
      g.chosen[i] = TakeLargest(choice, g.taken);
      sum += scores[g.chosen[i]];  // bias-free
    }
    const bool normalise = p.norm_topk_prob && p.top_k > 1;
    int32_t* ids = topk_ids.as<int32_t>() + t * topk_ids.stride[0];
    float* weights = topk_weights.as<float>() + t * topk_weights.stride[0];
    for (int i = 0; i < p.top_k; ++i) {
      const float w = scores[g.chosen[i]];
      float wi = normalise ? static_cast<float>(w / (sum + 1e-20)) : w;
      wi *= p.routed_scaling_factor;
      ids[i] = g.chosen[i];
      weights[i] = wi;
    }
  }
}

void CpuBackend::ExpertFfn(ThreadPool& pool, const ExpertWeights& ew, int64_t r0, int64_t n,
                           int64_t hidden, int64_t inter) {
  MoeScratch& s = moe_;
  const Tensor xs(s.xs.data() + r0 * hidden, DType::kF32, {n, hidden});
  const Tensor gate(s.gate.data() + r0 * inter, DType::kF32, {n, inter});
  const Tensor up(s.up.data() + r0 * inter, DType::kF32, {n, inter});
  const Tensor ys(s.ys.data() + r0 * hidden, DType::kF32, {n, hidden});
  const MatMulTarget gate_up[] = {{&ew.gate, Tensor(), gate}, {&ew.up, Tensor(), up}};
  MatMulsOn(pool, xs, gate_up);
  SiluMulOn(pool, gate, up, gate);
  MatMulOn(pool, gate, ew.down, Tensor(), ys);
}

void CpuBackend::MoeExperts(const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                            std::span<const ExpertWeights> experts, Tensor out) {
  DH_CHECK(x.ndim == 2 && out.ndim == 2 && topk_ids.ndim == 2, "moe experts wants 2-d tensors");
  const int64_t t_count = x.shape[0], hidden = x.shape[1], k = topk_ids.shape[1];
  DH_CHECK(out.shape[0] == t_count && out.shape[1] == hidden && topk_ids.shape[0] == t_count &&
               topk_weights.numel() == t_count * k,
           "moe experts x {} ids {} weights {} out {}", x.ShapeString(), topk_ids.ShapeString(),
           topk_weights.ShapeString(), out.ShapeString());
  const bool layout_ok = RowMajor2d(x, DType::kF32, t_count, hidden) &&
                         RowMajor2d(out, DType::kF32, t_count, hidden) &&
                         RowMajor2d(topk_ids, DType::kI32, t_count, k) &&
                         RowMajor2d(topk_weights, DType::kF32, t_count, k) && !experts.empty();
  if (!layout_ok) {
    Trace("moe_experts reference (layout)");
    return ReferenceBackend::MoeExperts(x, topk_ids, topk_weights, experts, out);
  }
  const int64_t num_experts = static_cast<int64_t>(experts.size());
  const int64_t pairs = t_count * k;
  MoeScratch& s = moe_;

  // Counting sort of the pairs by expert, stable in token order (the reference's row order).
  s.start.assign(num_experts + 1, 0);
  int64_t inter = -1;
  for (int64_t t = 0; t < t_count; ++t) {
    const int32_t* ids = topk_ids.as<const int32_t>() + t * topk_ids.stride[0];
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = ids[i];
      if (e < 0) continue;  // no expert in this slot
      DH_CHECK(e < num_experts, "expert id {} of {}", e, num_experts);
      if (inter < 0) inter = experts[e].gate.rows;
      if (!ExpertShapeOk(experts[e], hidden, inter)) {
        Trace("moe_experts reference (expert shapes differ)");
        return ReferenceBackend::MoeExperts(x, topk_ids, topk_weights, experts, out);
      }
      ++s.start[e + 1];
    }
  }
  for (int64_t e = 0; e < num_experts; ++e) s.start[e + 1] += s.start[e];
  const int64_t rows = s.start[num_experts];
  s.fill.assign(num_experts, 0);
  s.row_of_pair.resize(pairs);
  s.token_of_row.resize(rows);
  for (int64_t t = 0; t < t_count; ++t) {
    const int32_t* ids = topk_ids.as<const int32_t>() + t * topk_ids.stride[0];
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = ids[i];
      if (e < 0) {
        s.row_of_pair[t * k + i] = -1;
        continue;
      }
      const int32_t r = s.start[e] + s.fill[e]++;
      s.row_of_pair[t * k + i] = r;
      s.token_of_row[r] = static_cast<int32_t>(t);
    }
  }
  NoteKernel("moe-grouped", cpu::DispatchedTargetName);
  Trace("moe_experts grouped T={} H={} I={} experts={} k={}", t_count, hidden, inter, num_experts,
        k);
  if (rows == 0) {
    pool_->ParallelFor(t_count, RowGrain(hidden), [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) std::fill_n(out.as<float>() + t * out.stride[0], hidden, 0.f);
    });
    return;
  }
  s.xs.resize(rows * hidden);
  s.ys.resize(rows * hidden);
  s.gate.resize(rows * inter);
  s.up.resize(rows * inter);

  // Gather the tokens' rows in grouped order.
  const float* xd = x.as<const float>();
  const int64_t x_stride = x.stride[0];
  auto gather = [&](size_t b, size_t e) {
    for (size_t r = b; r < e; ++r) {
      std::copy_n(xd + s.token_of_row[r] * x_stride, hidden, s.xs.data() + r * hidden);
    }
  };
  pool_->ParallelFor(rows, RowGrain(hidden), gather);

  // Experts with few rows each (decode) run whole, one per worker at a time, most rows first:
  // one parallel loop per layer instead of four per expert, and each worker streams its
  // experts' three matrices in turn. Otherwise each expert's MatMuls use every thread.
  int64_t max_rows = 0;
  s.order.clear();
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t n = s.start[e + 1] - s.start[e];
    if (n == 0) continue;
    s.order.push_back(static_cast<int32_t>(e));
    max_rows = std::max(max_rows, n);
  }
  const bool per_worker = pool_->num_threads() > 1 &&
                          static_cast<int64_t>(s.order.size()) >= pool_->num_threads() &&
                          max_rows <= kExpertParallelMaxRows;
  if (per_worker) {
    std::sort(s.order.begin(), s.order.end(), [&](int32_t a, int32_t b) {  // no heap buffer
      const int32_t na = s.start[a + 1] - s.start[a], nb = s.start[b + 1] - s.start[b];
      return na != nb ? na > nb : a < b;
    });
    std::atomic<size_t> next{0};
    auto job = [&](int) {
      for (size_t i = next.fetch_add(1); i < s.order.size(); i = next.fetch_add(1)) {
        const int32_t e = s.order[i];
        ExpertFfn(*inline_pool_, experts[e], s.start[e], s.start[e + 1] - s.start[e], hidden,
                  inter);
      }
    };
    pool_->RunOnAll(std::function<void(int)>(std::ref(job)));  // by reference: no heap copy
  } else {
    for (const int32_t e : s.order) {
      ExpertFfn(*pool_, experts[e], s.start[e], s.start[e + 1] - s.start[e], hidden, inter);
    }
  }

  // out[t] = sum_i w[t, i] * ys[row of (t, i)], in slot order like the reference.
  float* od = out.as<float>();
  const int64_t o_stride = out.stride[0];
  auto combine = [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      float* o = od + t * o_stride;
      std::fill_n(o, hidden, 0.0f);
      const float* w = topk_weights.as<const float>() + t * topk_weights.stride[0];
      for (int64_t i = 0; i < k; ++i) {
        const int32_t r = s.row_of_pair[t * k + i];
        if (r < 0) continue;
        const float* y = s.ys.data() + static_cast<int64_t>(r) * hidden;
        for (int64_t c = 0; c < hidden; ++c) o[c] += w[i] * y[c];
      }
    }
  };
  pool_->ParallelFor(t_count, RowGrain(hidden * k), combine);
}

}  // namespace dh
