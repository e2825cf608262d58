"""Cross-check of the MLA fixtures with a second, differently written implementation in the style
of DeepSeek's inference/model.py: complex-number rope (torch.view_as_complex on adjacent pairs),
the absorbed attention over a cache of normalised latents + rotated k_pe, and incremental decode
with start_pos. For every DeepseekV2/V3 fixture it checks the prompt logits against logits.npy and
the 32-token incremental greedy continuation against expected.json.

  /usr/bin/python3 pytorch/reference/check_mla_absorbed.py [fixtures_dir]
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import deepseek_ref as ds  # noqa: E402
import safetensors_io as st  # noqa: E402


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def freqs_cis(cfg, seqlen):
    d = cfg["qk_rope_head_dim"]
    base = cfg.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    rs = cfg.get("rope_scaling")
    if rs:  # YaRN, applied regardless of the allocated context
        factor, orig = rs["factor"], rs["original_max_position_embeddings"]
        bf, bs = rs.get("beta_fast", 32), rs.get("beta_slow", 1)

        def cdim(nrot):
            return d * math.log(orig / (nrot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(cdim(bf)), 0)
        high = min(math.ceil(cdim(bs)), d - 1)
        if low == high:
            high += 0.001
        smooth = 1 - torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    t = torch.arange(seqlen)
    f = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(f), f)


def rot(x, fc):  # x [..., s, h?, d] with s at dim 0 here: x [s, h, d], fc [s, d/2]
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * fc[:, None, :]).flatten(-2)


class Runner:
    def __init__(self, d):
        with open(os.path.join(d, "config.json")) as f:
            self.cfg = json.load(f)
        t, dt, _ = st.load_dir(d, with_dtypes=True)
        block = (self.cfg.get("quantization_config") or {}).get("weight_block_size")
        self.w = {}
        for k, v in t.items():
            if dt[k] == "F8_E4M3":
                v = ds.dequantize_fp8(v, t[k[:-len("weight")] + "weight_scale_inv"], block)
            self.w[k] = v.float()
        self.arch = self.cfg["architectures"][0]
        c = self.cfg
        self.scale = (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) ** -0.5
        rs = c.get("rope_scaling")
        if rs and rs.get("mscale_all_dim"):
            m = 0.1 * rs["mscale_all_dim"] * math.log(rs["factor"]) + 1.0
            self.scale *= m * m
        self.fc = freqs_cis(c, 512)
        n = c["num_hidden_layers"]
        self.kv_cache = [torch.zeros(0, c["kv_lora_rank"]) for _ in range(n)]
        self.pe_cache = [torch.zeros(0, c["qk_rope_head_dim"]) for _ in range(n)]

    def lin(self, name, x):
        return x @ self.w[name + ".weight"].t()

    def mla(self, i, x, start):
        c, p = self.cfg, "model.layers.%d.self_attn." % i
        s, h = x.shape[0], c["num_attention_heads"]
        dn, dr, dv, r = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
        if c.get("q_lora_rank"):
            q = self.lin(p + "q_b_proj", rms(self.lin(p + "q_a_proj", x), self.w[p + "q_a_layernorm.weight"], 1e-6))
        else:
            q = self.lin(p + "q_proj", x)
        q = q.view(s, h, dn + dr)
        q_nope, q_pe = q[..., :dn], q[..., dn:]
        fc = self.fc[start:start + s]
        q_pe = rot(q_pe, fc)
        kv = self.lin(p + "kv_a_proj_with_mqa", x)
        lat, k_pe = kv[:, :r], kv[:, r:]
        k_pe = rot(k_pe[:, None, :], fc)[:, 0]
        self.kv_cache[i] = torch.cat([self.kv_cache[i], rms(lat, self.w[p + "kv_a_layernorm.weight"], 1e-6)])
        self.pe_cache[i] = torch.cat([self.pe_cache[i], k_pe])
        wkv_b = self.w[p + "kv_b_proj.weight"].view(h, dn + dv, r)
        q_abs = torch.einsum("shd,hdc->shc", q_nope, wkv_b[:, :dn])
        sc = (torch.einsum("shc,tc->sht", q_abs, self.kv_cache[i]) +
              torch.einsum("shr,tr->sht", q_pe, self.pe_cache[i])) * self.scale
        end = start + s
        mask = torch.full((s, end), float("-inf")).triu(start + 1)
        sc = (sc + mask[:, None, :]).softmax(-1)
        o = torch.einsum("sht,tc->shc", sc, self.kv_cache[i])
        o = torch.einsum("shc,hdc->shd", o, wkv_b[:, dn:])
        return self.lin(p + "o_proj", o.reshape(s, h * dv))

    def mlp(self, p, x):
        return self.lin(p + "down_proj", F.silu(self.lin(p + "gate_proj", x)) * self.lin(p + "up_proj", x))

    def moe(self, i, x):
        c, p = self.cfg, "model.layers.%d.mlp." % i
        s = x @ self.w[p + "gate.weight"].t()
        s = s.softmax(-1) if c["scoring_func"] == "softmax" else s.sigmoid()
        orig = s
        bias = self.w.get(p + "gate.e_score_correction_bias")
        if bias is not None:
            s = s + bias
        g = c.get("n_group", 1)
        if g > 1:
            s = s.view(x.shape[0], g, -1)
            gs = s.amax(-1) if bias is None else s.topk(2, -1)[0].sum(-1)
            keep = gs.topk(c["topk_group"], -1)[1]
            mask = torch.ones(x.shape[0], g, dtype=torch.bool).scatter_(1, keep, False)
            s = s.masked_fill(mask[..., None], float("-inf")).flatten(1)
        idx = s.topk(c["num_experts_per_tok"], -1)[1]
        wts = orig.gather(1, idx)
        if c.get("norm_topk_prob"):
            wts = wts / wts.sum(-1, keepdim=True)
        if self.arch == ds.V3 or not c.get("norm_topk_prob"):
            wts = wts * c.get("routed_scaling_factor", 1.0)
        y = torch.zeros_like(x)
        for e in range(c["n_routed_experts"]):
            rows, top = torch.where(idx == e)
            if len(rows):
                y[rows] += self.mlp(p + "experts.%d." % e, x[rows]) * wts[rows, top, None]
        if c.get("n_shared_experts"):
            y = y + self.mlp(p + "shared_experts.", x)
        return y

    def step(self, ids, start):
        c = self.cfg
        x = self.w["model.embed_tokens.weight"][ids]
        for i in range(c["num_hidden_layers"]):
            p = "model.layers.%d." % i
            x = x + self.mla(i, rms(x, self.w[p + "input_layernorm.weight"], c["rms_norm_eps"]), start)
            hx = rms(x, self.w[p + "post_attention_layernorm.weight"], c["rms_norm_eps"])
            moe = ds.is_moe_layer(c, i)
            x = x + (self.moe(i, hx) if moe else self.mlp(p + "mlp.", hx))
        x = rms(x, self.w["model.norm.weight"], c["rms_norm_eps"])
        head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        return x @ head.t()


def check(d):
    with open(os.path.join(d, "expected.json")) as f:
        exp = json.load(f)
    r = Runner(d)
    ids = torch.tensor(exp["input_ids"])
    with torch.no_grad():
        lg = r.step(ids, 0)
        ref = np.load(os.path.join(d, "logits.npy"))
        err = float(np.abs(lg.numpy() - ref).max())
        out, pos, nxt = [], len(ids), int(lg[-1].argmax())
        for _ in range(len(exp["greedy"])):
            out.append(nxt)
            nxt = int(r.step(torch.tensor([nxt]), pos)[-1].argmax())
            pos += 1
    ok = err <= 1e-4 * max(1.0, exp["logits_scale"]) and out == exp["greedy"]
    print("%-16s max|dlogit| %.2e  greedy %s  %s" % (os.path.basename(d), err,
                                                     "same" if out == exp["greedy"] else "DIFFERENT",
                                                     "OK" if ok else "FAIL"))
    return ok


def main():
    torch.set_num_threads(1)
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                               "tests", "golden", "fixtures")
    ok = True
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        with open(os.path.join(d, "config.json")) as f:
            arch = json.load(f)["architectures"][0]
        if arch in (ds.V2, ds.V3):
            ok = check(d) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
