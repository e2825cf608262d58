"""Writes the golden fixtures tests/golden/fixtures/<case>/ from the float32 references.

  /usr/bin/python3 pytorch/reference/make_fixtures.py [--out DIR] [case ...]

Each case directory holds config.json, generation_config.json, the safetensors (one file or two
shards + model.safetensors.index.json), logits.npy (float32 [n_prompt, vocab], .npy v1.0) and
expected.json {"input_ids", "greedy" (32 ids, argmax with full recompute each step),
"weights_dtype" ("f32" | "bf16"), "logits_scale" (max |logit|), plus diagnostics}.
Logits are computed by reloading the written files (bf16-rounded / FP8-dequantized weights).
A seed is rejected (and the next one tried) when a greedy step's top-2 margin, or a router's
top-k / group margin, is too small for the comparison to be stable, or greedy emits eos/bos.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dense_ref as dr  # noqa: E402
import deepseek_ref as ds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
N_PROMPT, N_GREEDY = 12, 32
MAX_BYTES = 300 * 1024


# ---- case builders: seed -> (model, save kwargs, extra tensors, weights_dtype, description) ----
def _dense(arch, seed, std=0.08, **over):
    m = dr.DenseRef(dr.tiny_config(arch, **over))
    return ds.init_random(m, seed=seed, std=std)


def llama_f32(seed):
    m = _dense(dr.LLAMA, seed, hidden_size=48, num_attention_heads=3, num_key_value_heads=1,
               intermediate_size=96, vocab_size=256)
    return m, {}, None, "f32", "Llama, f32, GQA 3:1 (head_dim 16), untied lm_head, default rope"


def llama_bf16_tied(seed):
    rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}
    m = _dense(dr.LLAMA, seed, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=128, vocab_size=384, tie_word_embeddings=True, rope_scaling=rs,
               max_position_embeddings=2048, rope_theta=10000.0)
    return m, {"dtype": "bf16"}, None, "bf16", \
        "Llama, bf16 weights, tied embeddings, GQA 2:1, llama3 rope scaling (high/medium/low bands)"


def llama_bias_linear(seed):
    m = _dense(dr.LLAMA, seed, hidden_size=48, num_attention_heads=3, num_key_value_heads=3,
               intermediate_size=64, vocab_size=256, attention_bias=True,
               rope_scaling={"type": "linear", "factor": 2.0}, max_position_embeddings=512)
    return m, {}, None, "f32", "Llama, f32, attention_bias (q/k/v/o biases), MHA, linear rope x2"


def qwen2_f32(seed):
    m = _dense(dr.QWEN2, seed, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, vocab_size=288, tie_word_embeddings=True,
               rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 4.0},
               max_position_embeddings=128, rope_theta=10000.0)
    return m, {}, None, "f32", \
        "Qwen2, f32, q/k/v biases, tied, GQA 2:1, yarn factor 4 (attention_factor on cos/sin)"


def qwen2_sharded(seed):
    m = _dense(dr.QWEN2, seed, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=96, vocab_size=256, tie_word_embeddings=False,
               rope_scaling={"type": "dynamic", "factor": 2.0}, max_position_embeddings=64,
               num_hidden_layers=3)
    return m, {"dtype": "bf16", "n_shards": 2}, None, "bf16", \
        "Qwen2, bf16, untied, 3 layers, two shards + index, dynamic rope (not triggered: " \
        "max_position_embeddings 64 > 44 tokens)"


def llama_dynamic(seed):
    m = _dense(dr.LLAMA, seed, hidden_size=48, num_attention_heads=3, num_key_value_heads=1,
               intermediate_size=64, vocab_size=256, tie_word_embeddings=True,
               rope_scaling={"type": "dynamic", "factor": 2.0}, max_position_embeddings=8)
    return m, {}, None, "f32", \
        "Llama, f32, tied, dynamic NTK rope triggered (max_position_embeddings 8 < prompt 12): " \
        "logits.npy uses base(seq_len=12) for all prompt positions; greedy follows HF generate " \
        "with a KV cache: the token at position p is rotated with base(seq_len=max(p+1, 12)) " \
        "and cached keys keep their rotation (see expected.json greedy_semantics)"


def _ds(arch, seed, std=0.08, **over):
    m = ds.DeepseekRef(ds.tiny_config(arch, **over))
    return ds.init_random(m, seed=seed, std=std, gate_std=0.3)


_SMALL_MLA = dict(vocab_size=256, hidden_size=48, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=4, kv_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=8,
                  v_head_dim=8, moe_intermediate_size=12, n_routed_experts=8, n_shared_experts=1,
                  num_experts_per_tok=2)


def ds_v3(seed):
    m = _ds(ds.V3, seed, **dict(_SMALL_MLA, q_lora_rank=16))
    return m, {}, None, "f32", \
        "DeepSeek-V3-like, f32: sigmoid + noaux_tc, e_score_correction_bias random with negatives, " \
        "n_group 2 / topk_group 1, q_lora, YaRN factor 4 (orig 64, mscale = mscale_all_dim = 1), " \
        "1 shared expert, first_k_dense_replace 1, norm_topk_prob, routed_scaling_factor 2.5"


def ds_v2_lite(seed):
    m = _ds(ds.V2, seed, **dict(_SMALL_MLA, q_lora_rank=None, topk_method="greedy",
                                scoring_func="softmax", n_shared_experts=2, norm_topk_prob=False,
                                routed_scaling_factor=1.0, n_routed_experts=8, num_experts_per_tok=3,
                                hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                rope_scaling={"type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 64,
                                              "beta_fast": 32, "beta_slow": 1,
                                              "mscale": 0.707, "mscale_all_dim": 0.707},
                                max_position_embeddings=256))
    return m, {"dtype": "bf16"}, None, "bf16", \
        "DeepSeek-V2-Lite-like, bf16: softmax + greedy top-3, no q_lora (q_proj), 2 shared experts, " \
        "3 layers (first dense), YaRN with mscale = mscale_all_dim = 0.707, no renormalisation"


def ds_v2(seed):
    m = _ds(ds.V2, seed, **dict(_SMALL_MLA, q_lora_rank=16, topk_method="group_limited_greedy",
                                scoring_func="softmax", n_group=4, topk_group=2, n_routed_experts=8,
                                num_experts_per_tok=2, norm_topk_prob=False, routed_scaling_factor=16.0,
                                n_shared_experts=2, rope_scaling=None))
    return m, {}, None, "f32", \
        "DeepSeek-V2-like, f32: softmax + group_limited_greedy (n_group 4, topk_group 2), q_lora, " \
        "routed_scaling_factor 16, 2 shared experts, default rope (interleaved MLA pairs)"


def ds_moe(seed):
    m = _ds(ds.V1, seed, vocab_size=256, hidden_size=48, intermediate_size=64, num_attention_heads=3,
            num_key_value_heads=3, moe_intermediate_size=12, n_routed_experts=8, n_shared_experts=2,
            num_experts_per_tok=2, first_k_dense_replace=1, moe_layer_freq=2, num_hidden_layers=4,
            norm_topk_prob=False, scoring_func="softmax")
    return m, {"dtype": "bf16"}, None, "bf16", \
        "DeepSeek-MoE-like (DeepseekForCausalLM), bf16: MHA with rotate_half rope, softmax greedy " \
        "top-2 of 8 experts, 2 shared experts, no routed scaling, 4 layers with " \
        "first_k_dense_replace 1 and moe_layer_freq 2 (HF: MoE iff i >= 1 and i % 2 == 0, so only " \
        "layer 2 is MoE)"


def ds_v3_fp8(seed):
    m = _ds(ds.V3, seed, **dict(_SMALL_MLA, hidden_size=132, intermediate_size=130, q_lora_rank=32,
                                kv_lora_rank=32, num_attention_heads=4, qk_nope_head_dim=16,
                                qk_rope_head_dim=8, v_head_dim=16, moe_intermediate_size=8))
    return m, {"fp8_block": [128, 128]}, None, "bf16", \
        "DeepSeek-V3-like FP8 release format: every decoder *_proj weight F8_E4M3 with f32 " \
        "weight_scale_inv [ceil(M/128), ceil(N/128)] (hidden 132 and intermediate 130 give partial " \
        "edge blocks), embed/lm_head/norms/router bf16, e_score_correction_bias f32; reference " \
        "logits from the dequantized weights in f32"


def ds_v3_sharded(seed):
    m = _ds(ds.V3, seed, **dict(_SMALL_MLA, q_lora_rank=16, hidden_size=64, num_hidden_layers=3,
                                moe_layer_freq=1, first_k_dense_replace=1))
    return m, {"dtype": "bf16", "n_shards": 2}, None, "bf16", \
        "DeepSeek-V3-like, bf16, 3 layers, two shards + model.safetensors.index.json"


def ds_v3_mtp(seed):
    cfg = ds.tiny_config(ds.V3, **dict(_SMALL_MLA, q_lora_rank=16, num_nextn_predict_layers=1))
    m = ds.init_random(ds.DeepseekRef(cfg), seed=seed, std=0.08, gate_std=0.3)
    # The MTP module as DeepSeek-V3 stores it: layer index num_hidden_layers, a full MoE decoder
    # layer plus enorm/hnorm/eh_proj/embed_tokens/shared_head. The engine must skip it.
    L = cfg["num_hidden_layers"]
    extra_mod = ds.DecoderLayer(cfg, ds.V3, L, m)
    g = torch.Generator().manual_seed(seed + 1000)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    extra = {}
    for k, t in extra_mod.state_dict().items():
        extra["model.layers.%d.%s" % (L, k)] = (torch.randn(t.shape, generator=g) * 0.08).to(torch.bfloat16)
    for k, shape in (("enorm.weight", [h]), ("hnorm.weight", [h]), ("eh_proj.weight", [h, 2 * h]),
                     ("embed_tokens.weight", [v, h]), ("shared_head.norm.weight", [h]),
                     ("shared_head.head.weight", [v, h])):
        extra["model.layers.%d.%s" % (L, k)] = (torch.randn(shape, generator=g) * 0.08).to(torch.bfloat16)
    return m, {"dtype": "bf16", "extra": extra}, None, "bf16", \
        "DeepSeek-V3-like, bf16, num_nextn_predict_layers 1: layer %d (MTP: decoder layer + enorm, " \
        "hnorm, eh_proj, embed_tokens, shared_head) is stored and must be skipped" % L


CASES = {
    "llama_f32": llama_f32, "llama_bf16_tied": llama_bf16_tied, "llama_bias_linear": llama_bias_linear,
    "qwen2_f32": qwen2_f32, "qwen2_sharded": qwen2_sharded, "llama_dynamic": llama_dynamic,
    "ds_v3": ds_v3, "ds_v2_lite": ds_v2_lite, "ds_v2": ds_v2, "ds_moe": ds_moe,
    "ds_v3_fp8": ds_v3_fp8, "ds_v3_sharded": ds_v3_sharded, "ds_v3_mtp": ds_v3_mtp,
}
BASE_SEED = {name: 1000 * (i + 1) for i, name in enumerate(CASES)}


def _save(model, out_dir, kw):
    kw = dict(kw)
    extra = kw.pop("extra", None)
    if isinstance(model, ds.DeepseekRef):
        ds.save_checkpoint(model, out_dir, extra=extra, **kw)
    else:
        dr.save_checkpoint(model, out_dir, **kw)


def _reload(out_dir):
    with open(os.path.join(out_dir, "config.json")) as f:
        arch = json.load(f)["architectures"][0]
    return (ds if arch.startswith("Deepseek") else dr).load_checkpoint(out_dir)


def _dynamic_positions_logits(model, ids, prompt_len):
    """Logits of the last position when each position p was rotated with the dynamic-NTK base for
    seq_len max(p+1, prompt_len) (HF generate with a KV cache)."""
    import rope
    cfg = model.config
    orig = rope.cos_sin

    def per_pos(c, dim, positions, seq_len):
        cs, sn = [], []
        for p in positions.tolist():
            a, b = orig(c, dim, torch.tensor([p]), max(p + 1, prompt_len))
            cs.append(a)
            sn.append(b)
        return torch.cat(cs), torch.cat(sn)

    rope.cos_sin = per_pos
    try:
        return model(ids)
    finally:
        rope.cos_sin = orig
    del cfg


def evaluate(model, prompt, eos_ids, dynamic_hf=False):
    model.eval()
    if isinstance(model, ds.DeepseekRef):
        model.record_margins = True
        model.router_margins = []
    with torch.no_grad():
        logits = model(prompt)
        ids = prompt.clone()
        greedy, margins = [], []
        for _ in range(N_GREEDY):
            lg = (_dynamic_positions_logits(model, ids, len(prompt)) if dynamic_hf else model(ids))[-1]
            top2 = lg.topk(2).values
            margins.append((top2[0] - top2[1]).item())
            nxt = int(lg.argmax())
            greedy.append(nxt)
            ids = torch.cat([ids, torch.tensor([nxt])])
    rmargin = min(model.router_margins) if getattr(model, "router_margins", None) else None
    if isinstance(model, ds.DeepseekRef):
        model.record_margins = False
    return logits, greedy, margins, rmargin


def _dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def make_case(name, out_root, max_tries=40):
    torch.set_num_threads(1)
    for attempt in range(max_tries):
        seed = BASE_SEED[name] + attempt
        torch.manual_seed(seed)
        model, kw, _, wdtype, desc = CASES[name](seed)
        cfg = model.config
        eos = cfg.get("eos_token_id")
        eos_ids = set(eos if isinstance(eos, list) else [eos]) | {cfg.get("bos_token_id")}
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(2, cfg["vocab_size"], (N_PROMPT,), generator=g)
        tmp = tempfile.mkdtemp(prefix="fx_%s_" % name)
        try:
            _save(model, tmp, kw)
            ref = _reload(tmp)
            dyn = name == "llama_dynamic"
            logits, greedy, margins, rmargin = evaluate(ref, prompt, eos_ids, dynamic_hf=dyn)
            scale = float(logits.abs().max())
            need = (3e-3 if wdtype == "bf16" else 1e-3) * max(1.0, scale)
            rneed = 2e-4 if wdtype == "bf16" else 5e-5
            why = []
            if min(margins) < need:
                why.append("greedy margin %.2e < %.2e" % (min(margins), need))
            if rmargin is not None and rmargin < rneed:
                why.append("router margin %.2e < %.2e" % (rmargin, rneed))
            if eos_ids & set(greedy):
                why.append("greedy emits eos/bos")
            size = _dir_bytes(tmp)
            if size > MAX_BYTES:
                raise SystemExit("%s: %d bytes > %d" % (name, size, MAX_BYTES))
            if why:
                print("%s seed %d rejected: %s" % (name, seed, "; ".join(why)))
                continue
            np.save(os.path.join(tmp, "logits.npy"), logits.numpy().astype(np.float32))
            exp = {"input_ids": prompt.tolist(), "greedy": greedy, "weights_dtype": wdtype,
                   "logits_scale": scale, "case": name, "description": desc, "seed": seed,
                   "min_greedy_margin": min(margins), "architecture": cfg["architectures"][0]}
            if rmargin is not None:
                exp["min_router_margin"] = rmargin
            if kw.get("fp8_block"):
                exp["quantization"] = "fp8"
            if dyn:
                exp["greedy_semantics"] = "hf_kv_cache_dynamic_ntk"
            with open(os.path.join(tmp, "expected.json"), "w") as f:
                json.dump(exp, f, indent=1)
                f.write("\n")
            dest = os.path.join(out_root, name)
            if os.path.exists(dest):
                shutil.rmtree(dest)
            shutil.copytree(tmp, dest)
            print("%s: seed %d, %d bytes, scale %.3f, min margin %.4f, router margin %s" %
                  (name, seed, _dir_bytes(dest), scale, min(margins), rmargin))
            return
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise SystemExit("%s: no stable seed in %d tries" % (name, max_tries))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "fixtures"))
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.cases or list(CASES):
        make_case(name, a.out)


if __name__ == "__main__":
    main()
