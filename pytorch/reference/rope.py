"""Rotary-embedding frequencies as Hugging Face computes them (float32), shared by dense_ref and
deepseek_ref. inv_freq(config, dim, seq_len) -> (inv_freq [dim/2] float32, attention_factor).

rope_scaling types: None/default, linear, dynamic (NTK; base recomputed when seq_len >
max_position_embeddings), llama3, yarn (HF _compute_yarn_parameters; for DeepSeek configs
attention_factor = mscale(factor, mscale) / mscale(factor, mscale_all_dim)).
"""
import math

import torch


def _scaling(config):
    rs = config.get("rope_scaling")
    if not rs:
        return None, {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    return kind, rs


def yarn_get_mscale(scale, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def default_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def yarn_inv_freq(base, dim, factor, original_max, beta_fast=32, beta_slow=1):
    def corr_dim(rot):
        return (dim * math.log(original_max / (rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extra = 1.0 / pos_freqs
    inter = 1.0 / (factor * pos_freqs)
    extra_factor = 1 - ramp
    return inter * (1 - extra_factor) + extra * extra_factor


def inv_freq(config, dim, seq_len):
    base = float(config.get("rope_theta", 10000.0))
    kind, rs = _scaling(config)
    max_pos = config.get("max_position_embeddings", 2048)
    if kind in (None, "default"):
        return default_inv_freq(base, dim), 1.0
    factor = float(rs["factor"])
    if kind == "linear":
        return default_inv_freq(base, dim) / factor, 1.0
    if kind == "dynamic":
        if seq_len > max_pos:
            base = base * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
        return default_inv_freq(base, dim), 1.0
    if kind == "llama3":
        inv = default_inv_freq(base, dim)
        low_ff = float(rs["low_freq_factor"])
        high_ff = float(rs["high_freq_factor"])
        old_len = float(rs["original_max_position_embeddings"])
        low_wl = old_len / low_ff
        high_wl = old_len / high_ff
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old_len / wavelen - low_ff) / (high_ff - low_ff)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        return torch.where(medium, smoothed, inv_l), 1.0
    if kind == "yarn":
        orig = rs.get("original_max_position_embeddings") or max_pos
        inv = yarn_inv_freq(base, dim, factor, orig, rs.get("beta_fast") or 32, rs.get("beta_slow") or 1)
        att = rs.get("attention_factor")
        if att is None:
            m, mad = rs.get("mscale"), rs.get("mscale_all_dim")
            if m and mad:
                att = yarn_get_mscale(factor, m) / yarn_get_mscale(factor, mad)
            else:
                att = yarn_get_mscale(factor)
        return inv, float(att)
    raise ValueError("unsupported rope_scaling type %r" % kind)


def cos_sin(config, dim, positions, seq_len):
    """cos/sin [T, dim/2] for integer positions (float32 angles), times attention_factor."""
    inv, att = inv_freq(config, dim, seq_len)
    ang = positions.float()[:, None] * inv[None, :]
    return torch.cos(ang) * att, torch.sin(ang) * att


def apply_rotate_half(x, cos, sin):
    """Llama/Qwen2 layout: pairs (x[i], x[i+d/2]). x [..., T, d]; cos/sin [T, d/2]."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def apply_interleaved(x, cos, sin):
    """DeepSeek MLA layout: adjacent pairs (x[2i], x[2i+1]). x [..., T, d]; cos/sin [T, d/2]."""
    xe, xo = x[..., 0::2], x[..., 1::2]
    re = xe * cos - xo * sin
    ro = xo * cos + xe * sin
    return torch.stack([re, ro], dim=-1).flatten(-2)
