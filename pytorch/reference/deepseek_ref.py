"""Independent float32 PyTorch reference for DeepSeek-family causal LMs with Hugging Face tensor names.

Architectures (config["architectures"][0]):
  DeepseekV3ForCausalLM  MLA, sigmoid/noaux_tc router with e_score_correction_bias, YaRN.
  DeepseekV2ForCausalLM  MLA, softmax router, greedy or group_limited_greedy.
  DeepseekForCausalLM    deepseek-moe: Llama-style MHA (rotate_half), softmax router, shared experts.

API (import with pytorch/reference on sys.path):
  cfg = tiny_config("DeepseekV3ForCausalLM", hidden_size=64, ...)   # HF config.json dict
  model = DeepseekRef(cfg)              # nn.Module; state_dict() keys are the HF tensor names,
                                        # e.g. "model.layers.0.self_attn.q_a_proj.weight",
                                        # "model.layers.1.mlp.gate.e_score_correction_bias" (buffer)
  init_random(model, seed=0, std=0.05)  # deterministic random init (norms around 1, bias +-)
  logits = model(input_ids)             # input_ids LongTensor [B, T] (or [T]) -> [B, T, vocab] f32,
                                        # causal, batched, differentiable (MoE via index_add)
  save_checkpoint(model, out_dir, dtype="f32"|"bf16", n_shards=1, fp8_block=None, extra=None)
        writes config.json, generation_config.json and model.safetensors (or shards + index).
        fp8_block=[b0,b1] stores every decoder *_proj weight as F8_E4M3 + weight_scale_inv
        (f32 [ceil(M/b0), ceil(N/b1)]) and sets quantization_config; the in-memory model is then
        replaced by the dequantized weights so its logits match the file. extra: dict of
        additional tensors to store (e.g. MTP layers).
  model = load_checkpoint(model_dir)    # reads config + safetensors (dequantizing FP8), f32 model.
  model.router_margins                  # list of per-call min top-k margins (set record_margins=True)

Semantics follow DeepSeek's inference/model.py and HF modeling_deepseek.py (see
shared/docs/reference/deepseek-semantics.md): MLA rope on adjacent pairs, softmax scale
(nope+rope)^-0.5 * mscale(factor, mscale_all_dim)^2, YaRN inv_freq from
original_max_position_embeddings, kv/q_a layernorm eps 1e-6, masked groups -inf, router in f32.
Routed weight normalisation: V3: norm (if norm_topk_prob and k>1) then * routed_scaling_factor;
V2 (HF): norm if norm_topk_prob and k>1, otherwise * routed_scaling_factor; V1: norm only.
Layers with index >= num_hidden_layers (MTP) are ignored.
"""
import copy
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rope  # noqa: E402
import safetensors_io as st  # noqa: E402

V3, V2, V1 = "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekForCausalLM"


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x = x.float()
        return self.weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, cfg, arch, owner):
        super().__init__()
        self.cfg, self.arch = cfg, arch
        self.n_experts = cfg["n_routed_experts"]
        self.weight = nn.Parameter(torch.empty(self.n_experts, cfg["hidden_size"]))
        self.topk_method = cfg.get("topk_method", "greedy")
        self.scoring = cfg.get("scoring_func", "softmax")
        if self.topk_method not in ("greedy", "group_limited_greedy", "noaux_tc"):
            raise ValueError("unknown topk_method %r" % self.topk_method)
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError("unknown scoring_func %r" % self.scoring)
        if self.topk_method == "noaux_tc":
            self.register_buffer("e_score_correction_bias", torch.zeros(self.n_experts))
        self._owner = [owner]  # the top model, for margin recording (list: not a submodule)

    def forward(self, x):
        """x [N, H] -> (topk_idx [N, k] long, topk_weight [N, k] f32)."""
        cfg = self.cfg
        k = cfg["num_experts_per_tok"]
        logits = F.linear(x.float(), self.weight.float())
        scores = logits.softmax(-1) if self.scoring == "softmax" else logits.sigmoid()
        choice = scores
        n = x.shape[0]
        group_margin = None
        if self.topk_method in ("group_limited_greedy", "noaux_tc"):
            g, tg = cfg["n_group"], cfg["topk_group"]
            if self.topk_method == "noaux_tc":
                choice = scores + self.e_score_correction_bias.float()[None, :]
                gs = choice.view(n, g, -1).topk(2, dim=-1)[0].sum(-1)
            else:
                gs = choice.view(n, g, -1).max(-1).values
            gsorted = gs.sort(-1, descending=True).values
            if tg < g:
                group_margin = (gsorted[:, tg - 1] - gsorted[:, tg]).min().item()
            gidx = gs.topk(tg, dim=-1)[1]
            gmask = torch.zeros(n, g, dtype=torch.bool).scatter_(1, gidx, True)
            emask = gmask[:, :, None].expand(n, g, self.n_experts // g).reshape(n, -1)
            choice = choice.masked_fill(~emask, float("-inf"))
        cs = choice.sort(-1, descending=True).values
        idx = choice.topk(k, dim=-1)[1]
        w = scores.gather(1, idx)
        norm = cfg.get("norm_topk_prob", False) and k > 1
        rsf = cfg.get("routed_scaling_factor", 1.0)
        if self.arch == V3:
            if norm:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
            w = w * rsf
        elif self.arch == V2:
            w = w / (w.sum(-1, keepdim=True) + 1e-20) if norm else w * rsf
        else:
            if norm:
                w = w / (w.sum(-1, keepdim=True) + 1e-20)
        owner = self._owner[0]
        if owner.record_margins:
            m = (cs[:, k - 1] - cs[:, k]).min().item() if k < self.n_experts else float("inf")
            if group_margin is not None:
                m = min(m, group_margin)
            owner.router_margins.append(m)
        return idx, w


class MoE(nn.Module):
    def __init__(self, cfg, arch, owner):
        super().__init__()
        h, mi = cfg["hidden_size"], cfg["moe_intermediate_size"]
        self.gate = Gate(cfg, arch, owner)
        self.experts = nn.ModuleList([MLP(h, mi) for _ in range(cfg["n_routed_experts"])])
        ns = cfg.get("n_shared_experts") or 0
        self.shared_experts = MLP(h, mi * ns) if ns else None

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        idx, w = self.gate(x)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(idx == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            y = expert(x[rows]) * w[rows, slot][:, None].to(x.dtype)
            out = out.index_add(0, rows, y)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out.view(shape)


def softmax_scale_mla(cfg):
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rs = cfg.get("rope_scaling")
    if rs:
        mad = rs.get("mscale_all_dim", 0)
        if mad:
            m = rope.yarn_get_mscale(rs["factor"], mad)
            scale = scale * m * m
    return scale


def _causal_softmax(scores):
    t, s = scores.shape[-2], scores.shape[-1]
    mask = torch.ones(t, s, dtype=torch.bool).tril(s - t)
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.float().softmax(-1)


class MLAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        self.nh = nh
        self.nope, self.rope_d, self.vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        self.kvr = cfg["kv_lora_rank"]
        qd = nh * (self.nope + self.rope_d)
        self.q_lora = cfg.get("q_lora_rank")
        if self.q_lora:
            self.q_a_proj = nn.Linear(h, self.q_lora, bias=cfg.get("attention_bias", False))
            self.q_a_layernorm = RMSNorm(self.q_lora, 1e-6)
            self.q_b_proj = nn.Linear(self.q_lora, qd, bias=False)
        else:
            self.q_proj = nn.Linear(h, qd, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.kvr + self.rope_d, bias=cfg.get("attention_bias", False))
        self.kv_a_layernorm = RMSNorm(self.kvr, 1e-6)
        self.kv_b_proj = nn.Linear(self.kvr, nh * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(nh * self.vd, h, bias=cfg.get("attention_bias", False))
        self.scale = softmax_scale_mla(cfg)

    def forward(self, x, positions):
        b, t, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_lora else self.q_proj(x)
        q = q.view(b, t, self.nh, self.nope + self.rope_d).transpose(1, 2)
        q_nope, q_pe = q.split([self.nope, self.rope_d], dim=-1)
        ckv = self.kv_a_proj_with_mqa(x)
        c, k_pe = ckv.split([self.kvr, self.rope_d], dim=-1)
        k_pe = k_pe.view(b, 1, t, self.rope_d)
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(b, t, self.nh, self.nope + self.vd).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        cos, sin = rope.cos_sin(self.cfg, self.rope_d, positions, int(positions.max()) + 1)
        q_pe = rope.apply_interleaved(q_pe, cos, sin)
        k_pe = rope.apply_interleaved(k_pe, cos, sin)
        scores = (q_nope @ k_nope.transpose(-1, -2) + q_pe @ k_pe.transpose(-1, -2)) * self.scale
        p = _causal_softmax(scores).to(v.dtype)
        o = (p @ v).transpose(1, 2).reshape(b, t, self.nh * self.vd)
        return self.o_proj(o)


class MHAttention(nn.Module):
    """deepseek-moe (V1) attention: Llama-style, rotate_half rope over the whole head."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        nkv = cfg.get("num_key_value_heads") or nh
        self.nh, self.nkv, self.hd = nh, nkv, h // nh
        bias = cfg.get("attention_bias", False)
        self.q_proj = nn.Linear(h, nh * self.hd, bias=bias)
        self.k_proj = nn.Linear(h, nkv * self.hd, bias=bias)
        self.v_proj = nn.Linear(h, nkv * self.hd, bias=bias)
        self.o_proj = nn.Linear(nh * self.hd, h, bias=bias)

    def forward(self, x, positions):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        cos, sin = rope.cos_sin(self.cfg, self.hd, positions, int(positions.max()) + 1)
        q = rope.apply_rotate_half(q, cos, sin)
        k = rope.apply_rotate_half(k, cos, sin)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        p = _causal_softmax((q @ k.transpose(-1, -2)) * self.hd ** -0.5).to(v.dtype)
        o = (p @ v).transpose(1, 2).reshape(b, t, self.nh * self.hd)
        return self.o_proj(o)


def is_moe_layer(cfg, i):
    return (cfg.get("n_routed_experts") is not None and i >= cfg.get("first_k_dense_replace", 0)
            and i % cfg.get("moe_layer_freq", 1) == 0)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, arch, i, owner):
        super().__init__()
        self.self_attn = MHAttention(cfg) if arch == V1 else MLAttention(cfg)
        self.mlp = MoE(cfg, arch, owner) if is_moe_layer(cfg, i) else MLP(cfg["hidden_size"], cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, x, positions):
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Body(nn.Module):
    def __init__(self, cfg, arch, owner):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(cfg, arch, i, owner) for i in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class DeepseekRef(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = copy.deepcopy(cfg)
        self.arch = cfg["architectures"][0]
        if self.arch not in (V3, V2, V1):
            raise ValueError("unsupported architecture %r" % self.arch)
        self.record_margins = False
        self.router_margins = []
        self.model = _Body(cfg, self.arch, self)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def final_hidden(self, input_ids, positions=None):
        """The final normed hidden states [B, T, hidden] (lm_head's input; MTP's h_i)."""
        t = input_ids.shape[1]
        if positions is None:
            positions = torch.arange(t)
        x = self.model.embed_tokens(input_ids).float()
        for layer in self.model.layers:
            x = layer(x, positions)
        return self.model.norm(x)

    def forward(self, input_ids, positions=None):
        squeeze = input_ids.dim() == 1
        if squeeze:
            input_ids = input_ids[None]
        x = self.final_hidden(input_ids, positions)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        logits = F.linear(x, w.float())
        return logits[0] if squeeze else logits


class _SharedHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)


class MtpLayer(nn.Module):
    """DeepSeek-V3's multi-token-prediction module, stored at layer index num_hidden_layers
    (docs/mtp.md). At position i it reads the main model's final normed hidden state h_i and the
    next token t_{i+1}:
        x = eh_proj(cat[enorm(embed_tokens(t_{i+1})), hnorm(h_i)])   (embedding first)
        x = decoder layer (MLA + MoE, causal over the MTP layer's own positions 0..i)
        logits(t_{i+2}) = shared_head.head(shared_head.norm(x))
    Checkpoint names: model.layers.<L>.{embed_tokens,enorm,hnorm,eh_proj,shared_head.*} as here,
    the decoder layer's tensors directly under model.layers.<L>. (load_mtp maps them)."""

    def __init__(self, cfg, arch, owner):
        super().__init__()
        h = cfg["hidden_size"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], h)
        self.enorm = RMSNorm(h, cfg["rms_norm_eps"])
        self.hnorm = RMSNorm(h, cfg["rms_norm_eps"])
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.block = DecoderLayer(cfg, arch, cfg["num_hidden_layers"], owner)
        self.shared_head = _SharedHead(cfg)

    def forward(self, hidden, next_ids, positions):
        e = self.enorm(self.embed_tokens(next_ids).float())
        x = F.linear(torch.cat([e, self.hnorm(hidden)], dim=-1), self.eh_proj.weight.float())
        x = self.block(x, positions)
        return F.linear(self.shared_head.norm(x), self.shared_head.head.weight.float())


_MTP_OWN = ("embed_tokens.", "enorm.", "hnorm.", "eh_proj.", "shared_head.")


def load_mtp(model_dir, model):
    """The checkpoint's first MTP layer (layer index num_hidden_layers) as an f32 MtpLayer."""
    cfg = model.config
    tensors, _, _ = st.load_dir(model_dir, with_dtypes=True)
    prefix = "model.layers.%d." % cfg["num_hidden_layers"]
    mtp = MtpLayer(cfg, model.arch, model)
    sd = mtp.state_dict(keep_vars=True)
    with torch.no_grad():
        for k, p in sd.items():
            name = prefix + (k if k.startswith(_MTP_OWN) else k[len("block."):])
            p.copy_(tensors[name].float())
    return mtp


# ---------------------------------------------------------------------------------------------
def tiny_config(arch, **over):
    """A small HF-format config for arch; keyword overrides replace/add fields."""
    base = {
        "architectures": [arch],
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu", "initializer_range": 0.02,
        "attention_bias": False, "attention_dropout": 0.0, "torch_dtype": "float32",
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "moe_intermediate_size": 16, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "norm_topk_prob": False, "scoring_func": "softmax", "rope_scaling": None,
    }
    if arch == V1:
        base.update({"model_type": "deepseek", "aux_loss_alpha": 0.001})
    else:
        base.update({
            "model_type": "deepseek_v3" if arch == V3 else "deepseek_v2",
            "q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
            "v_head_dim": 16, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
            "routed_scaling_factor": 1.0, "aux_loss_alpha": 0.001, "seq_aux": True,
        })
        if arch == V3:
            base.update({
                "q_lora_rank": 24, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 2,
                "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                "num_nextn_predict_layers": 0, "ep_size": 1,
                "max_position_embeddings": 256,
                "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                 "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
            })
    base.update(over)
    return base


def init_random(model, seed=0, std=0.05, norm_jitter=0.1, bias_std=0.05, gate_std=None, head_std=None):
    """Deterministic init: Linear/Embedding ~ N(0, std); router mlp.gate.weight ~ N(0, gate_std or
    std); lm_head ~ N(0, head_std or std); norms 1 + N(0, norm_jitter); linear biases ~
    N(0, bias_std); e_score_correction_bias ~ N(0, 0.1) (includes negatives)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.state_dict(keep_vars=True).items()):
            if name.endswith("e_score_correction_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif "norm" in name.split(".")[-2] and name.endswith("weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * norm_jitter)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * bias_std)
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * (gate_std or std))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=g) * (head_std or std))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


def round_bf16_(model):
    """Round every parameter/buffer to bfloat16 precision in place (kept as float32)."""
    with torch.no_grad():
        for p in model.state_dict(keep_vars=True).values():
            if p.is_floating_point():
                p.copy_(p.to(torch.bfloat16).float())
    return model


def is_fp8_target(name):
    """Decoder projection weights (q/kv/o, kv_a_proj_with_mqa, MLP and expert *_proj)."""
    parts = name.split(".")
    return (name.startswith("model.layers.") and parts[-1] == "weight"
            and (parts[-2].endswith("_proj") or parts[-2] == "kv_a_proj_with_mqa"))


def quantize_fp8(w, block):
    """w [M, N] f32 -> (uint8 e4m3 bytes [M, N], scale_inv f32 [ceil(M/b0), ceil(N/b1)])."""
    m, n = w.shape
    b0, b1 = block
    sm, sn = -(-m // b0), -(-n // b1)
    scale = torch.zeros(sm, sn)
    q = torch.zeros(m, n, dtype=torch.uint8)
    for i in range(sm):
        for j in range(sn):
            blk = w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1]
            s = float(blk.abs().max()) / 448.0
            s = s if s > 0 else 1.0
            scale[i, j] = s
            q[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = st.f32_to_e4m3(blk / s)
    return q, scale


def dequantize_fp8(q, scale, block):
    m, n = q.shape
    b0, b1 = block
    s = scale.float().repeat_interleave(b0, 0).repeat_interleave(b1, 1)[:m, :n]
    return st.e4m3_to_f32(q) * s


def _gen_config(cfg):
    return {"bos_token_id": cfg.get("bos_token_id", 0), "eos_token_id": cfg.get("eos_token_id", 1),
            "do_sample": True, "temperature": 0.6, "top_p": 0.95}


def save_checkpoint(model, out_dir, dtype="f32", n_shards=1, fp8_block=None, extra=None):
    os.makedirs(out_dir, exist_ok=True)
    cfg = copy.deepcopy(model.config)
    cfg["torch_dtype"] = "bfloat16" if (dtype == "bf16" or fp8_block) else "float32"
    if dtype == "bf16" or fp8_block:
        round_bf16_(model)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tensors, dtypes = {}, {}
    for k, v in state.items():
        keep_f32 = k.endswith("e_score_correction_bias")
        tensors[k] = v.to(torch.bfloat16) if (dtype == "bf16" or fp8_block) and not keep_f32 else v.float()
    if fp8_block:
        cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                      "quant_method": "fp8", "weight_block_size": list(fp8_block)}
        deq = {}
        for k in list(tensors):
            if is_fp8_target(k):
                q, s = quantize_fp8(state[k].float(), fp8_block)
                tensors[k] = q
                dtypes[k] = "F8_E4M3"
                tensors[k[:-len("weight")] + "weight_scale_inv"] = s
                deq[k] = dequantize_fp8(q, s, fp8_block)
        with torch.no_grad():
            sd = model.state_dict(keep_vars=True)
            for k, w in deq.items():
                sd[k].copy_(w)
    for k, v in (extra or {}).items():
        if isinstance(v, st.Raw):
            tensors[k] = v.data
            dtypes[k] = v.dtype
        else:
            tensors[k] = v
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(_gen_config(cfg), f, indent=2)
        f.write("\n")
    meta = {"format": "pt"}
    if n_shards > 1:
        st.save_sharded(out_dir, tensors, n_shards, meta, dtypes)
    else:
        st.save(os.path.join(out_dir, "model.safetensors"), tensors, meta, dtypes)
    return tensors, dtypes


def load_checkpoint(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tensors, dtypes, _ = st.load_dir(model_dir, with_dtypes=True)
    block = (cfg.get("quantization_config") or {}).get("weight_block_size")
    model = DeepseekRef(cfg)
    sd = model.state_dict(keep_vars=True)
    with torch.no_grad():
        for k, p in sd.items():
            w = tensors[k]
            if dtypes[k] == "F8_E4M3":
                w = dequantize_fp8(w, tensors[k[:-len("weight")] + "weight_scale_inv"], block)
            p.copy_(w.float())
    return model
