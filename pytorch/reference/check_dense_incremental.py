"""Cross-check of the Llama / Qwen2 / DeepSeek-MoE fixtures with a second implementation that
decodes incrementally over an explicit KV cache (keys stored rotated, as an engine does).
Prompt logits are compared with logits.npy and the 32-token greedy continuation with
expected.json. For dynamic-NTK rope the cache keeps each key's rotation and a new token at
position p uses base(seq_len = max(p + 1, prompt length)), as HF generate does.

  /usr/bin/python3 pytorch/reference/check_dense_incremental.py [fixtures_dir]
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
import rope  # noqa: E402
import safetensors_io as st  # noqa: E402


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


class Runner:
    def __init__(self, d):
        with open(os.path.join(d, "config.json")) as f:
            self.c = json.load(f)
        self.w = {k: v.float() for k, v in st.load_dir(d).items()}
        c = self.c
        self.arch = c["architectures"][0]
        self.nh = c["num_attention_heads"]
        self.nkv = c.get("num_key_value_heads") or self.nh
        self.hd = c.get("head_dim") or c["hidden_size"] // self.nh
        self.k = [[] for _ in range(c["num_hidden_layers"])]
        self.v = [[] for _ in range(c["num_hidden_layers"])]
        self.prompt_len = None

    def rotate(self, x, pos, seq_len):  # x [h, d] at one position
        inv, att = rope.inv_freq(self.c, self.hd, seq_len)
        a = pos * inv
        cos, sin = torch.cos(a) * att, torch.sin(a) * att
        h = self.hd // 2
        return torch.cat([x[:, :h] * cos - x[:, h:] * sin, x[:, h:] * cos + x[:, :h] * sin], -1)

    def lin(self, n, x):
        y = x @ self.w[n + ".weight"].t()
        b = self.w.get(n + ".bias")
        return y + b if b is not None else y

    def attn(self, i, x, start, seq_len_of):
        p = "model.layers.%d.self_attn." % i
        out = []
        for s in range(x.shape[0]):
            pos = start + s
            sl = seq_len_of(pos)
            q = self.rotate(self.lin(p + "q_proj", x[s]).view(self.nh, self.hd), pos, sl)
            self.k[i].append(self.rotate(self.lin(p + "k_proj", x[s]).view(self.nkv, self.hd), pos, sl))
            self.v[i].append(self.lin(p + "v_proj", x[s]).view(self.nkv, self.hd))
            K, V = torch.stack(self.k[i]), torch.stack(self.v[i])  # [t, nkv, d]
            g = self.nh // self.nkv
            sc = torch.einsum("hd,thd->ht", q, K.repeat_interleave(g, 1)) / math.sqrt(self.hd)
            o = torch.einsum("ht,thd->hd", sc.softmax(-1), V.repeat_interleave(g, 1))
            out.append(o.reshape(-1))
        return self.lin(p + "o_proj", torch.stack(out))

    def mlp(self, p, x):
        return self.lin(p + "down_proj", F.silu(self.lin(p + "gate_proj", x)) * self.lin(p + "up_proj", x))

    def moe(self, i, x):  # DeepSeek-MoE: softmax, greedy top-k, optional norm, no scaling
        c, p = self.c, "model.layers.%d.mlp." % i
        sc = (x @ self.w[p + "gate.weight"].t()).softmax(-1)
        wt, idx = sc.topk(c["num_experts_per_tok"], -1)
        if c.get("norm_topk_prob"):
            wt = wt / wt.sum(-1, keepdim=True)
        y = torch.stack([sum(wt[r, j] * self.mlp(p + "experts.%d." % int(idx[r, j]), x[r])
                             for j in range(idx.shape[1])) for r in range(x.shape[0])])
        return y + self.mlp(p + "shared_experts.", x)

    def step(self, ids, start, seq_len_of):
        c = self.c
        x = self.w["model.embed_tokens.weight"][ids]
        for i in range(c["num_hidden_layers"]):
            p = "model.layers.%d." % i
            x = x + self.attn(i, rms(x, self.w[p + "input_layernorm.weight"], c["rms_norm_eps"]), start, seq_len_of)
            h = rms(x, self.w[p + "post_attention_layernorm.weight"], c["rms_norm_eps"])
            moe = self.arch == ds.V1 and ds.is_moe_layer(c, i)
            x = x + (self.moe(i, h) if moe else self.mlp(p + "mlp.", h))
        x = rms(x, self.w["model.norm.weight"], c["rms_norm_eps"])
        return x @ self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"]).t()


def check(d):
    with open(os.path.join(d, "expected.json")) as f:
        exp = json.load(f)
    r = Runner(d)
    n = len(exp["input_ids"])
    seq_len_of = lambda pos: max(pos + 1, n)  # noqa: E731  (== n + steps for the non-dynamic cases)
    with torch.no_grad():
        lg = r.step(torch.tensor(exp["input_ids"]), 0, seq_len_of)
        err = float(np.abs(lg.numpy() - np.load(os.path.join(d, "logits.npy"))).max())
        out, pos, nxt = [], n, int(lg[-1].argmax())
        for _ in range(len(exp["greedy"])):
            out.append(nxt)
            nxt = int(r.step(torch.tensor([nxt]), pos, seq_len_of)[-1].argmax())
            pos += 1
    ok = err <= 1e-4 * max(1.0, exp["logits_scale"]) and out == exp["greedy"]
    print("%-18s max|dlogit| %.2e  greedy %s  %s" % (os.path.basename(d), err,
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
        if arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", ds.V1):
            ok = check(d) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
