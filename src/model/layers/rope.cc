// Rope frequency tables, following transformers' modeling_rope_utils definitions.
// YaRN: https://arxiv.org/abs/2309.00071 (section 3.2 "NTK-by-parts", 3.4 the attention factor).
#include "model/layers/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace dh {

double YarnMscale(double factor, double mscale) {
  if (factor <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(factor) + 1.0;
}

namespace {

// f32 like HF: base ** (arange(0, dim, 2).float() / dim), then 1 / that.
std::vector<double> BaseInvFreq(int rot_dim, double theta) {
  std::vector<double> inv(rot_dim / 2);
  for (int i = 0; i < rot_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rot_dim);
    inv[i] = 1.0 / static_cast<double>(std::pow(static_cast<float>(theta), exponent));
  }
  return inv;
}

void ApplyLlama3(const RopeScaling& s, std::vector<double>& inv) {
  const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_ctx / s.low_freq_factor;
  const double high_wavelen = old_ctx / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f = f / s.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
}

float ApplyYarn(const ModelConfig& config, int rot_dim, double theta, std::vector<double>& inv) {
  const RopeScaling& s = config.rope_scaling;
  const double orig = s.original_max_position_embeddings > 0
                          ? static_cast<double>(s.original_max_position_embeddings)
                          : static_cast<double>(config.max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return rot_dim * std::log(orig / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(theta));
  };
  double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), static_cast<double>(rot_dim - 1));
  if (low == high) high += 0.001;
  for (int i = 0; i < rot_dim / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    inv[i] = inv[i] / s.factor * ramp + inv[i] * (1.0 - ramp);
  }
  if (s.attention_factor) return static_cast<float>(*s.attention_factor);
  if (s.mscale_all_dim != 0.0) {
    return static_cast<float>(YarnMscale(s.factor, s.mscale) /
                              YarnMscale(s.factor, s.mscale_all_dim));
  }
  return static_cast<float>(YarnMscale(s.factor, 1.0));
}

}  // namespace

RopeFrequencies ComputeRopeFrequencies(const ModelConfig& config, int rot_dim, double theta,
                                       int64_t seq_len) {
  const RopeScaling& s = config.rope_scaling;
  RopeFrequencies out;
  if (s.type == RopeType::kDynamic && seq_len > config.max_position_embeddings) {
    const double max_pos = static_cast<double>(config.max_position_embeddings);
    theta *= std::pow(s.factor * seq_len / max_pos - (s.factor - 1.0),
                      static_cast<double>(rot_dim) / (rot_dim - 2));
  }
  std::vector<double> inv = BaseInvFreq(rot_dim, theta);
  switch (s.type) {
    case RopeType::kLinear:
      for (double& f : inv) f /= s.factor;
      break;
    case RopeType::kLlama3: ApplyLlama3(s, inv); break;
    case RopeType::kYarn: out.attention_factor = ApplyYarn(config, rot_dim, theta, inv); break;
    case RopeType::kDefault:
    case RopeType::kDynamic: break;  // dynamic changed theta above
  }
  out.inv_freq.assign(inv.begin(), inv.end());
  return out;
}

}  // namespace dh
