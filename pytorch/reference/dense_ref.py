"""Independent float32 PyTorch reference for LlamaForCausalLM and Qwen2ForCausalLM with Hugging
Face tensor names.

API (import with pytorch/reference on sys.path):
  cfg = tiny_config("LlamaForCausalLM" | "Qwen2ForCausalLM", **overrides)   # HF config.json dict
  model = DenseRef(cfg)           # nn.Module; state_dict() keys are HF names:
        model.embed_tokens.weight, model.layers.N.{input_layernorm,post_attention_layernorm}.weight,
        model.layers.N.self_attn.{q,k,v,o}_proj.weight (+ q/k/v bias for Qwen2; all four when
        Llama's attention_bias is true), model.layers.N.mlp.{gate,up,down}_proj.weight,
        model.norm.weight, lm_head.weight (absent when tie_word_embeddings).
  init_random(model, seed, std)   # deterministic random init (deepseek_ref.init_random)
  logits = model(input_ids)       # [T] or [B, T] -> [T, V] / [B, T, V] float32, causal
  save_checkpoint(model, dir, dtype="f32"|"bf16", n_shards=1)
  load_checkpoint(dir)

Semantics (HF modeling_llama / modeling_qwen2): RMSNorm in float32, rotate_half RoPE on the full
head_dim (head_dim = config head_dim or hidden/heads) with rope_scaling default/linear/dynamic/llama3/
yarn (rope.py; yarn's attention_factor multiplies cos and sin), GQA by repeating kv heads,
softmax scale head_dim^-0.5, SiLU-gated MLP, logits = lm_head(norm(h)).
Dynamic NTK uses seq_len = max(position)+1 of the forward call (full recompute).
"""
import copy
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rope  # noqa: E402
import safetensors_io as st  # noqa: E402
from deepseek_ref import MLP, RMSNorm, _causal_softmax, init_random, round_bf16_  # noqa: E402,F401

LLAMA, QWEN2 = "LlamaForCausalLM", "Qwen2ForCausalLM"


class Attention(nn.Module):
    def __init__(self, cfg, arch):
        super().__init__()
        self.cfg = cfg
        h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        nkv = cfg.get("num_key_value_heads") or nh
        self.nh, self.nkv = nh, nkv
        self.hd = cfg.get("head_dim") or h // nh
        if arch == QWEN2:
            qkv_bias, o_bias = True, False
        else:
            qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
        self.q_proj = nn.Linear(h, nh * self.hd, bias=qkv_bias)
        self.k_proj = nn.Linear(h, nkv * self.hd, bias=qkv_bias)
        self.v_proj = nn.Linear(h, nkv * self.hd, bias=qkv_bias)
        self.o_proj = nn.Linear(nh * self.hd, h, bias=o_bias)

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
        return self.o_proj((p @ v).transpose(1, 2).reshape(b, t, self.nh * self.hd))


class Layer(nn.Module):
    def __init__(self, cfg, arch):
        super().__init__()
        self.self_attn = Attention(cfg, arch)
        self.mlp = MLP(cfg["hidden_size"], cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, x, positions):
        x = x + self.self_attn(self.input_layernorm(x), positions)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Body(nn.Module):
    def __init__(self, cfg, arch):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([Layer(cfg, arch) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class DenseRef(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = copy.deepcopy(cfg)
        self.arch = cfg["architectures"][0]
        if self.arch not in (LLAMA, QWEN2):
            raise ValueError("unsupported architecture %r" % self.arch)
        self.model = _Body(cfg, self.arch)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        if not self.tied:
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def forward(self, input_ids, positions=None):
        squeeze = input_ids.dim() == 1
        if squeeze:
            input_ids = input_ids[None]
        if positions is None:
            positions = torch.arange(input_ids.shape[1])
        x = self.model.embed_tokens(input_ids).float()
        for layer in self.model.layers:
            x = layer(x, positions)
        x = self.model.norm(x)
        w = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        logits = F.linear(x, w.float())
        return logits[0] if squeeze else logits


def tiny_config(arch, **over):
    cfg = {
        "architectures": [arch], "model_type": "llama" if arch == LLAMA else "qwen2",
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5 if arch == LLAMA else 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1, "hidden_act": "silu",
        "initializer_range": 0.02, "rope_scaling": None, "torch_dtype": "float32",
    }
    if arch == LLAMA:
        cfg.update({"attention_bias": False, "mlp_bias": False, "pretraining_tp": 1})
    else:
        cfg.update({"use_sliding_window": False, "sliding_window": None, "max_window_layers": 2})
    cfg.update(over)
    return cfg


def save_checkpoint(model, out_dir, dtype="f32", n_shards=1):
    os.makedirs(out_dir, exist_ok=True)
    cfg = copy.deepcopy(model.config)
    cfg["torch_dtype"] = "bfloat16" if dtype == "bf16" else "float32"
    if dtype == "bf16":
        round_bf16_(model)
    tensors = {k: (v.detach().to(torch.bfloat16) if dtype == "bf16" else v.detach().float().clone())
               for k, v in model.state_dict().items()}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                   "do_sample": True, "temperature": 0.6, "top_p": 0.95}, f, indent=2)
        f.write("\n")
    if n_shards > 1:
        st.save_sharded(out_dir, tensors, n_shards, {"format": "pt"})
    else:
        st.save(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})
    return tensors


def load_checkpoint(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    tensors = st.load_dir(model_dir)
    model = DenseRef(cfg)
    with torch.no_grad():
        for k, p in model.state_dict(keep_vars=True).items():
            p.copy_(tensors[k].float())
    return model
