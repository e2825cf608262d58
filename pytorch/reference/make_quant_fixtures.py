"""Writes AWQ / GPTQ int4 golden fixtures tests/golden/fixtures/<case>/ with an independent
quantizer (round to nearest, 4 bits, per group of 128 input columns) and the float32 references.

  /usr/bin/python3 pytorch/reference/make_quant_fixtures.py [--out DIR] [case ...]

Each decoder projection weight W [out, in] (q/k/v/o, MLA q/kv, MLP and expert *_proj) is
quantized per row and group to codes q in 0..15, an integer zero point z and an f16 scale s, so
that the checkpoint's value is (q - z) * s, and stored in the packing of the tool named by
quantization_config (nothing else is quantized; embeddings, norms, router and lm_head are f16):

  AWQ (version gemm): qweight int32 [in, out/8], nibble i (bits 4i..4i+3) of word j holds output
      column 8j + [0,2,4,6,1,3,5,7][i]; qzeros int32 [in/128, out/8] packed the same way; scales
      f16 [in/128, out].
  GPTQ: qweight int32 [in/8, out], nibble i of word p holds input row 8p + i; qzeros int32
      [groups, out/8], nibble i of word j holds column 8j + i, storing z - 1 (checkpoint_format
      gptq, "v1") or z (gptq_v2); scales f16 [groups, out]; g_idx int32 [in] = group of each input
      column. Act-order (desc_act): columns are quantized in a random order, group g being
      columns order[128g : 128(g+1)], so g_idx is a non-monotone assignment.

The reference logits come from pytorch/reference's DenseRef / DeepseekRef run in float32 on weights
dequantized here from the written, packed tensors (unpacking code separate from the packing
code). The rest follows make_fixtures.py (expected.json format, seed rejection on small margins;
weights_dtype "f32": the engine's conversion is exact, so the f32 tolerance applies).
"""
import argparse
import copy
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
import make_fixtures as mf  # noqa: E402
import safetensors_io as st  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
GROUP = 128
MAX_BYTES = 1536 * 1024
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


# ---- quantizer: W [out, in] f32 -> codes [out, in], zeros [out, groups], f16 scales, g_idx ----
def quantize_rtn(w, group, sym=False, order=None):
    """Round-to-nearest 4-bit quantization per row and group. `order` (a permutation of the input
    columns) makes group g = columns order[g*group:(g+1)*group] (act-order); g_idx[k] = group of
    column k. Zero points: asymmetric z = round(-min / s) in 0..15 (v1-safe: kept >= 1); sym z = 8."""
    out_f, in_f = w.shape
    groups = in_f // group
    order = torch.arange(in_f) if order is None else order
    g_idx = torch.empty(in_f, dtype=torch.int32)
    g_idx[order] = (torch.arange(in_f) // group).to(torch.int32)
    codes = torch.empty(out_f, in_f, dtype=torch.int32)
    zeros = torch.empty(out_f, groups, dtype=torch.int32)
    scales = torch.empty(out_f, groups, dtype=torch.float16)
    for g in range(groups):
        cols = order[g * group:(g + 1) * group]
        blk = w[:, cols].double()
        if sym:
            amax = blk.abs().amax(dim=1).clamp(min=1e-6)
            s = (2 * amax / 15).half()
            z = torch.full((out_f,), 8, dtype=torch.int32)
        else:
            lo = blk.amin(dim=1).clamp(max=0)
            hi = blk.amax(dim=1).clamp(min=0)
            s = ((hi - lo).clamp(min=1e-6) / 15).half()
            z = torch.round(-lo / s.double()).clamp(1, 15).to(torch.int32)
        q = torch.round(blk / s.double()[:, None]) + z[:, None]
        codes[:, cols] = q.clamp(0, 15).to(torch.int32)
        zeros[:, g] = z
        scales[:, g] = s
    return codes, zeros, scales, g_idx


def _words(nibbles):
    """[..., 8] ints 0..15 -> int32 words (nibble i at bits 4i..4i+3)."""
    n = nibbles.to(torch.int64) & 15
    w = torch.zeros(n.shape[:-1], dtype=torch.int64)
    for i in range(8):
        w |= n[..., i] << (4 * i)
    return torch.from_numpy(w.numpy().astype(np.uint32).view(np.int32))


def pack_awq(codes, zeros, scales):
    out_f, in_f = codes.shape
    order = torch.tensor(AWQ_ORDER)
    # word j of input row k holds columns 8j + order[i]
    qweight = _words(codes.t().reshape(in_f, out_f // 8, 8)[:, :, order])
    qzeros = _words(zeros.t().reshape(-1, out_f // 8, 8)[:, :, order])
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales.t().contiguous()}


def pack_gptq(codes, zeros, scales, g_idx, v1):
    out_f, in_f = codes.shape
    qweight = _words(codes.t().reshape(in_f // 8, 8, out_f).permute(0, 2, 1))
    stored = zeros - 1 if v1 else zeros
    qzeros = _words(stored.t().reshape(-1, out_f // 8, 8))
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales.t().contiguous(),
            "g_idx": g_idx.clone()}


# ---- independent unpacking: packed tensors -> f32 W [out, in] ----
def _nibbles(words):
    """int32 [...] -> int64 [..., 8], nibble i = (word >> 4i) & 15 of the unsigned word."""
    u = words.to(torch.int64) & 0xFFFFFFFF
    return torch.stack([(u >> (4 * i)) & 15 for i in range(8)], dim=-1)


def dequant_awq(t, out_f, in_f):
    inv = [AWQ_ORDER.index(c) for c in range(8)]       # column 8j + c sits in nibble inv[c]
    q = _nibbles(t["qweight"])[:, :, inv].reshape(in_f, out_f)       # [in, out]
    z = _nibbles(t["qzeros"])[:, :, inv].reshape(-1, out_f)          # [groups, out]
    s = t["scales"].double()                                         # [groups, out]
    g = torch.arange(in_f) // (in_f // z.shape[0])
    return ((q - z[g]).double() * s[g]).t().float()


def dequant_gptq(t, out_f, in_f, v1):
    q = _nibbles(t["qweight"]).permute(0, 2, 1).reshape(in_f, out_f)  # [in, out]
    z = _nibbles(t["qzeros"]).reshape(-1, out_f) + (1 if v1 else 0)   # [groups, out]
    s = t["scales"].double()
    g = t["g_idx"].long()
    return ((q - z[g]).double() * s[g]).t().float()


# ---- cases ----
def _dense(arch, seed, **over):
    m = dr.DenseRef(dr.tiny_config(arch, **over))
    return ds.init_random(m, seed=seed, std=0.08)


def llama_awq(seed):
    m = _dense(dr.LLAMA, seed, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=256, vocab_size=256)
    return m, {"method": "awq"}, \
        "Llama AWQ (GEMM packing): every decoder *_proj int4, group 128, zero points; " \
        "hidden 128, intermediate 256 (down_proj has 2 groups), GQA 2:1; embed/lm_head/norms f16"


def qwen2_gptq(seed):
    m = _dense(dr.QWEN2, seed, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=256, vocab_size=256, tie_word_embeddings=True)
    return m, {"method": "gptq", "sym": True, "desc_act": False, "format": "gptq_v2"}, \
        "Qwen2 GPTQ: symmetric (zero 8), desc_act false (g_idx = c / 128), checkpoint_format " \
        "gptq_v2 (zeros stored as is), q/k/v biases f16, tied embeddings"


def qwen2_gptq_actorder(seed):
    m = _dense(dr.QWEN2, seed, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=384, vocab_size=256, tie_word_embeddings=False)
    return m, {"method": "gptq", "sym": False, "desc_act": True, "format": "gptq"}, \
        "Qwen2 GPTQ act-order: asymmetric, desc_act true (each projection's input columns " \
        "quantized in a random order, non-monotone g_idx over 2-3 groups), checkpoint_format " \
        "gptq (v1: zeros stored minus 1), untied lm_head"


def ds_v2_lite_awq(seed):
    m = ds.DeepseekRef(ds.tiny_config(
        ds.V2, vocab_size=256, hidden_size=128, intermediate_size=256, num_attention_heads=2,
        num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=128, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=64, moe_intermediate_size=128, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, topk_method="greedy", scoring_func="softmax",
        norm_topk_prob=False, routed_scaling_factor=1.0, first_k_dense_replace=1,
        num_hidden_layers=2))
    m = ds.init_random(m, seed=seed, std=0.08, gate_std=0.3)
    return m, {"method": "awq"}, \
        "DeepSeek-V2-Lite-like AWQ: MLA (q_proj, kv_a_proj_with_mqa, kv_b_proj: in = " \
        "kv_lora_rank 128, o_proj), dense MLP, 4 routed experts + 1 shared expert all int4 " \
        "group 128; router (mlp.gate), embed, lm_head, norms f16; softmax greedy top-2"


CASES = {"llama_awq": llama_awq, "qwen2_gptq": qwen2_gptq,
         "qwen2_gptq_actorder": qwen2_gptq_actorder, "ds_v2_lite_awq": ds_v2_lite_awq}
BASE_SEED = {name: 20000 + 1000 * i for i, name in enumerate(CASES)}


def quant_config(spec):
    if spec["method"] == "awq":
        return {"bits": 4, "group_size": GROUP, "modules_to_not_convert": None,
                "quant_method": "awq", "version": "gemm", "zero_point": True}
    return {"bits": 4, "checkpoint_format": spec["format"], "damp_percent": 0.01,
            "desc_act": spec["desc_act"], "group_size": GROUP, "model_file_base_name": None,
            "model_name_or_path": None, "quant_method": "gptq", "static_groups": False,
            "sym": spec["sym"], "true_sequential": True}


def write_checkpoint(model, spec, out_dir, seed):
    """Quantizes and packs the decoder projections; everything else f16."""
    cfg = copy.deepcopy(model.config)
    cfg["torch_dtype"] = "float16"
    cfg["quantization_config"] = quant_config(spec)
    g = torch.Generator().manual_seed(seed + 7)
    tensors = {}
    for k, v in model.state_dict().items():
        v = v.detach().float()
        if not ds.is_fp8_target(k):
            tensors[k] = v if k.endswith("e_score_correction_bias") else v.half()
            continue
        base = k[:-len(".weight")]
        if spec["method"] == "awq":
            codes, zeros, scales, _ = quantize_rtn(v, GROUP)
            packed = pack_awq(codes, zeros, scales)
        else:
            order = torch.randperm(v.shape[1], generator=g) if spec["desc_act"] else None
            codes, zeros, scales, g_idx = quantize_rtn(v, GROUP, sym=spec["sym"], order=order)
            packed = pack_gptq(codes, zeros, scales, g_idx, v1=spec["format"] == "gptq")
        for suffix, t in packed.items():
            tensors[base + "." + suffix] = t
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(ds._gen_config(cfg), f, indent=2)
        f.write("\n")
    st.save(os.path.join(out_dir, "model.safetensors"), tensors, {"format": "pt"})


def load_dequantized(model_dir):
    """A reference model with weights read back from model_dir, packed ones dequantized."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    q = cfg["quantization_config"]
    tensors = st.load_dir(model_dir)
    arch = cfg["architectures"][0]
    model = ds.DeepseekRef(cfg) if arch.startswith("Deepseek") else dr.DenseRef(cfg)
    with torch.no_grad():
        for k, p in model.state_dict(keep_vars=True).items():
            base = k[:-len(".weight")] if k.endswith(".weight") else None
            if base is not None and base + ".qweight" in tensors:
                parts = {s: tensors[base + "." + s] for s in ("qweight", "qzeros", "scales", "g_idx")
                         if base + "." + s in tensors}
                out_f, in_f = p.shape
                if q["quant_method"] == "awq":
                    w = dequant_awq(parts, out_f, in_f)
                else:
                    w = dequant_gptq(parts, out_f, in_f, v1=q.get("checkpoint_format", "gptq") == "gptq")
                p.copy_(w)
            else:
                p.copy_(tensors[k].float())
    return model


def make_case(name, out_root, max_tries=40):
    torch.set_num_threads(1)
    for attempt in range(max_tries):
        seed = BASE_SEED[name] + attempt
        torch.manual_seed(seed)
        model, spec, desc = CASES[name](seed)
        cfg = model.config
        eos_ids = {cfg.get("eos_token_id"), cfg.get("bos_token_id")}
        gen = torch.Generator().manual_seed(seed)
        prompt = torch.randint(2, cfg["vocab_size"], (mf.N_PROMPT,), generator=gen)
        tmp = tempfile.mkdtemp(prefix="qfx_%s_" % name)
        try:
            write_checkpoint(model, spec, tmp, seed)
            ref = load_dequantized(tmp)
            logits, greedy, margins, rmargin = mf.evaluate(ref, prompt, eos_ids)
            scale = float(logits.abs().max())
            why = []
            if min(margins) < 1e-3 * max(1.0, scale):
                why.append("greedy margin %.2e" % min(margins))
            if rmargin is not None and rmargin < 5e-5:
                why.append("router margin %.2e" % rmargin)
            if eos_ids & set(greedy):
                why.append("greedy emits eos/bos")
            size = mf._dir_bytes(tmp)
            if size > MAX_BYTES:
                raise SystemExit("%s: %d bytes > %d" % (name, size, MAX_BYTES))
            if why:
                print("%s seed %d rejected: %s" % (name, seed, "; ".join(why)))
                continue
            np.save(os.path.join(tmp, "logits.npy"), logits.numpy().astype(np.float32))
            exp = {"input_ids": prompt.tolist(), "greedy": greedy, "weights_dtype": "f32",
                   "logits_scale": scale, "case": name, "description": desc, "seed": seed,
                   "min_greedy_margin": min(margins), "architecture": cfg["architectures"][0],
                   "quantization": spec["method"]}
            if rmargin is not None:
                exp["min_router_margin"] = rmargin
            with open(os.path.join(tmp, "expected.json"), "w") as f:
                json.dump(exp, f, indent=1)
                f.write("\n")
            dest = os.path.join(out_root, name)
            if os.path.exists(dest):
                shutil.rmtree(dest)
            shutil.copytree(tmp, dest)
            print("%s: seed %d, %d bytes, scale %.3f, min margin %.4f, router margin %s" %
                  (name, seed, mf._dir_bytes(dest), scale, min(margins), rmargin))
            return
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise SystemExit("%s: no stable seed in %d tries" % (name, max_tries))


def self_check():
    """Packing and unpacking agree with the quantizer's (q - z) * s for every layout."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(24, 256, generator=g)
    for sym in (False, True):
        order = torch.randperm(256, generator=g)
        codes, zeros, scales, g_idx = quantize_rtn(w, GROUP, sym=sym, order=order)
        want = ((codes - zeros[:, g_idx.long()]).double() * scales.double()[:, g_idx.long()]).float()
        for v1 in (True, False):
            got = dequant_gptq(pack_gptq(codes, zeros, scales, g_idx, v1), 24, 256, v1)
            assert torch.equal(got, want), "gptq v1=%s sym=%s" % (v1, sym)
        codes, zeros, scales, g_idx = quantize_rtn(w, GROUP, sym=sym)
        want = ((codes - zeros[:, g_idx.long()]).double() * scales.double()[:, g_idx.long()]).float()
        assert torch.equal(dequant_awq(pack_awq(codes, zeros, scales), 24, 256), want), "awq"
        assert (want - w).abs().max() < 0.5, "quantization error too large"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "fixtures"))
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args()
    self_check()
    os.makedirs(a.out, exist_ok=True)
    for name in a.cases or list(CASES):
        make_case(name, a.out)


if __name__ == "__main__":
    main()
