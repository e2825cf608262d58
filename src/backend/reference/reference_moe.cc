// Reference MoE router (DeepSeek semantics: docs/reference/deepseek-semantics.md "Router") and the
// grouped expert computation.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/reference/reference_ops.h"
#include "base/check.h"

namespace dh::ref {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Indices of the k largest values, largest first; ties go to the lower index.
std::vector<int> TopK(const std::vector<float>& v, int k) {
  std::vector<int> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  idx.resize(k);
  return idx;
}

}  // namespace

void MoeGate(const Tensor& logits, const Tensor& bias, const MoeGateParams& p, Tensor topk_ids,
             Tensor topk_weights) {
  DH_CHECK(logits.ndim == 2, "router logits must be [T, E], got {}", logits.ShapeString());
  const int64_t t_count = logits.shape[0];
  const int e_count = static_cast<int>(logits.shape[1]);
  DH_CHECK(p.top_k >= 1 && p.top_k <= e_count, "top_k {} of {} experts", p.top_k, e_count);
  DH_CHECK(topk_ids.numel() == t_count * p.top_k && topk_weights.numel() == t_count * p.top_k,
           "router outputs {} / {} for {} tokens x top {}", topk_ids.ShapeString(),
           topk_weights.ShapeString(), t_count, p.top_k);
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
  const int group_size = grouped ? e_count / p.n_group : e_count;

  std::vector<float> scores(e_count), choice(e_count), group_scores(grouped ? p.n_group : 0);
  for (int64_t t = 0; t < t_count; ++t) {
    for (int e = 0; e < e_count; ++e) scores[e] = Get(logits, Offset(logits, t, e));
    if (p.scoring == ScoringFunc::kSoftmax) {
      const float mx = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (float& s : scores) {
        s = std::exp(s - mx);
        sum += s;
      }
      for (float& s : scores) s = static_cast<float>(s / sum);
    } else {
      for (float& s : scores) s = 1.0f / (1.0f + std::exp(-s));
    }
    for (int e = 0; e < e_count; ++e) {
      choice[e] = scores[e] + (use_bias ? Get(bias, e * bias.stride[0]) : 0.0f);
    }
    if (grouped) {
      for (int g = 0; g < p.n_group; ++g) {
        std::vector<float> members(choice.begin() + g * group_size,
                                   choice.begin() + (g + 1) * group_size);
        if (p.method == TopkMethod::kNoauxTc) {
          // Sum of the top two choices of the group.
          const int take = std::min(2, group_size);
          float sum = 0;
          for (int i : TopK(members, take)) sum += members[i];
          group_scores[g] = sum;
        } else {
          group_scores[g] = *std::max_element(members.begin(), members.end());
        }
      }
      std::vector<bool> keep(p.n_group, false);
      for (int g : TopK(group_scores, p.topk_group)) keep[g] = true;
      for (int e = 0; e < e_count; ++e) {
        if (!keep[e / group_size]) choice[e] = kNegInf;
      }
    }
    const std::vector<int> chosen = TopK(choice, p.top_k);
    std::vector<float> w(p.top_k);
    double sum = 0;
    for (int i = 0; i < p.top_k; ++i) {
      w[i] = scores[chosen[i]];  // bias-free
      sum += w[i];
    }
    const bool normalise = p.norm_topk_prob && p.top_k > 1;
    for (int i = 0; i < p.top_k; ++i) {
      float wi = normalise ? static_cast<float>(w[i] / (sum + 1e-20)) : w[i];
      wi *= p.routed_scaling_factor;
      topk_ids.as<int32_t>()[Offset(topk_ids, t, i)] = chosen[i];
      Set(topk_weights, Offset(topk_weights, t, i), wi);
    }
  }
}

void MoeExperts(Backend& backend, const Tensor& x, const Tensor& topk_ids,
                const Tensor& topk_weights, std::span<const ExpertWeights> experts, Tensor out) {
  DH_CHECK(x.ndim == 2 && out.ndim == 2 && topk_ids.ndim == 2, "moe experts wants 2-d tensors");
  const int64_t t_count = x.shape[0], hidden = x.shape[1], k = topk_ids.shape[1];
  DH_CHECK(out.shape[0] == t_count && out.shape[1] == hidden && topk_ids.shape[0] == t_count &&
               topk_weights.numel() == t_count * k,
           "moe experts x {} ids {} weights {} out {}", x.ShapeString(), topk_ids.ShapeString(),
           topk_weights.ShapeString(), out.ShapeString());
  // (token, k) pairs per expert.
  std::vector<std::vector<int32_t>> routed(experts.size());
  for (int64_t t = 0; t < t_count; ++t) {
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = topk_ids.as<const int32_t>()[Offset(topk_ids, t, i)];
      if (e < 0) continue;  // no expert in this slot
      DH_CHECK(static_cast<size_t>(e) < experts.size(), "expert id {} of {}", e, experts.size());
      routed[e].push_back(static_cast<int32_t>(t * k + i));
    }
  }
  // y[t * k + i] = expert(x[t]) for each routed pair; combined in k order per token afterwards.
  std::vector<float> y(t_count * k * hidden, 0.0f);
  std::vector<int32_t> rows;
  for (size_t e = 0; e < experts.size(); ++e) {
    if (routed[e].empty()) continue;
    const ExpertWeights& ew = experts[e];
    const int64_t n = static_cast<int64_t>(routed[e].size()), inter = ew.gate.rows;
    rows.clear();
    for (int32_t pair : routed[e]) rows.push_back(static_cast<int32_t>(pair / k));
    std::vector<float> xs(n * hidden), gate(n * inter), up(n * inter), ys(n * hidden);
    const Tensor rows_t(rows.data(), DType::kI32, {n});
    const Tensor xs_t(xs.data(), DType::kF32, {n, hidden});
    const Tensor gate_t(gate.data(), DType::kF32, {n, inter});
    const Tensor up_t(up.data(), DType::kF32, {n, inter});
    const Tensor ys_t(ys.data(), DType::kF32, {n, hidden});
    backend.GatherRows(x, rows_t, xs_t);
    backend.MatMul(xs_t, ew.gate, Tensor(), gate_t);
    backend.MatMul(xs_t, ew.up, Tensor(), up_t);
    backend.SiluMul(gate_t, up_t, gate_t);
    backend.MatMul(gate_t, ew.down, Tensor(), ys_t);
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(ys.data() + r * hidden, hidden, y.data() + routed[e][r] * hidden);
    }
  }
  for (int64_t t = 0; t < t_count; ++t) {
    for (int64_t c = 0; c < hidden; ++c) {
      float acc = 0;
      for (int64_t i = 0; i < k; ++i) {
        const int32_t e = topk_ids.as<const int32_t>()[Offset(topk_ids, t, i)];
        if (e < 0) continue;
        acc += Get(topk_weights, Offset(topk_weights, t, i)) * y[(t * k + i) * hidden + c];
      }
      Set(out, Offset(out, t, c), acc);
    }
  }
}

}  // namespace dh::ref
