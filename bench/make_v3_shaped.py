#!/usr/bin/env python3
"""Writes a random bf16 checkpoint in DeepSeek-V3's layout (MLA with q_lora, MoE with a sigmoid
noaux_tc router, shared expert, dense first layers, one MTP layer) at a size chosen on the command
line, for timing speculative decoding where a decode step is bound by reading the weights
(bench/README.md, "A bandwidth-bound V3-shaped checkpoint"). `deepharness make-model --preset
tiny-v3` has the same tensor layout (src/tools/random_model.cc) but a fixed 64-wide shape.

Standard library only. Weights are random bf16 of magnitude 2^-7..2^-5 with a random sign (the
byte that holds the sign and the high exponent bits is fixed, the other byte random, from a seeded
stream); norm weights are 1, the router's score-correction bias 0 (f32). Timing does not depend on
the values beyond the router's choices, which are random either way.

  bench/make_v3_shaped.py --output DIR [--hidden 1024] [--layers 12] [--dense-layers 1]
      [--experts 128] [--top-k 8] [--moe-inter 256] [--inter 2816] [--heads 8] [--q-lora 384]
      [--vocab 8192] [--seed 0]
"""
import argparse
import json
import os
import random
import struct

BF16_ONE = b"\x80\x3f"
# High byte of a random value: keep the sign bit, exponent bits 0x3C (2^-7 or 2^-6 with the low
# byte's top bit).
HIGH = bytes((x & 0x80) | 0x3C for x in range(256))


def config(a):
  return {
      "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
      "vocab_size": a.vocab, "hidden_size": a.hidden, "intermediate_size": a.inter,
      "moe_intermediate_size": a.moe_inter, "num_hidden_layers": a.layers,
      "num_attention_heads": a.heads, "num_key_value_heads": a.heads,
      "n_shared_experts": 1, "n_routed_experts": a.experts, "num_experts_per_tok": a.top_k,
      "routed_scaling_factor": 2.5, "first_k_dense_replace": a.dense_layers,
      "moe_layer_freq": 1, "norm_topk_prob": True, "scoring_func": "sigmoid",
      "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
      "q_lora_rank": a.q_lora, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
      "qk_rope_head_dim": 64, "v_head_dim": 128, "num_nextn_predict_layers": 1,
      "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "tie_word_embeddings": False, "attention_bias": False, "bos_token_id": 0,
      "eos_token_id": 1, "hidden_act": "silu", "torch_dtype": "bfloat16",
  }


def tensors(c):
  """(name, shape, kind) in make-model's order; kind: 'w' random bf16, '1' ones bf16, '0' zeros f32."""
  H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
  heads, q_lora, kv_lora = c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
  nope, rope, vdim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
  E, mi = c["n_routed_experts"], c["moe_intermediate_size"]
  out = [("model.embed_tokens.weight", [V, H], "w")]

  def mlp(p, width):
    out.extend([(p + "gate_proj.weight", [width, H], "w"), (p + "up_proj.weight", [width, H], "w"),
                (p + "down_proj.weight", [H, width], "w")])

  for l in range(L + c["num_nextn_predict_layers"]):
    p = "model.layers.%d." % l
    if l >= L:
      out.extend([(p + "embed_tokens.weight", [V, H], "w"), (p + "enorm.weight", [H], "1"),
                  (p + "hnorm.weight", [H], "1"), (p + "eh_proj.weight", [H, 2 * H], "w"),
                  (p + "shared_head.norm.weight", [H], "1"),
                  (p + "shared_head.head.weight", [V, H], "w")])
    a = p + "self_attn."
    out.extend([(p + "input_layernorm.weight", [H], "1"),
                (p + "post_attention_layernorm.weight", [H], "1"),
                (a + "q_a_proj.weight", [q_lora, H], "w"), (a + "q_a_layernorm.weight", [q_lora], "1"),
                (a + "q_b_proj.weight", [heads * (nope + rope), q_lora], "w"),
                (a + "kv_a_proj_with_mqa.weight", [kv_lora + rope, H], "w"),
                (a + "kv_a_layernorm.weight", [kv_lora], "1"),
                (a + "kv_b_proj.weight", [heads * (nope + vdim), kv_lora], "w"),
                (a + "o_proj.weight", [H, heads * vdim], "w")])
    if l < c["first_k_dense_replace"]:
      mlp(p + "mlp.", c["intermediate_size"])
      continue
    for e in range(E):
      mlp(p + "mlp.experts.%d." % e, mi)
    out.append((p + "mlp.gate.weight", [E, H], "w"))
    out.append((p + "mlp.gate.e_score_correction_bias", [E], "0"))
    mlp(p + "mlp.shared_experts.", mi * c["n_shared_experts"])
  out.append(("model.norm.weight", [H], "1"))
  out.append(("lm_head.weight", [V, H], "w"))
  return out


def nbytes(shape, kind):
  n = 4 if kind == "0" else 2
  for d in shape:
    n *= d
  return n


def data(shape, kind, rng):
  n = nbytes(shape, kind)
  if kind == "0":
    return bytes(n)
  if kind == "1":
    return BF16_ONE * (n // 2)
  b = bytearray(rng.randbytes(n))
  b[1::2] = bytes(b[1::2]).translate(HIGH)
  return b


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--output", required=True)
  ap.add_argument("--hidden", type=int, default=1024)
  ap.add_argument("--layers", type=int, default=12)
  ap.add_argument("--dense-layers", type=int, default=1)
  ap.add_argument("--experts", type=int, default=128)
  ap.add_argument("--top-k", type=int, default=8)
  ap.add_argument("--moe-inter", type=int, default=256)
  ap.add_argument("--inter", type=int, default=2816)
  ap.add_argument("--heads", type=int, default=8)
  ap.add_argument("--q-lora", type=int, default=384)
  ap.add_argument("--vocab", type=int, default=8192)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--shard-bytes", type=int, default=1 << 30)
  a = ap.parse_args()
  for k in ("hidden", "layers", "experts", "top_k", "moe_inter", "inter", "heads", "q_lora", "vocab"):
    if getattr(a, k) < 1:
      ap.error("--%s: expected >= 1, got %d" % (k.replace("_", "-"), getattr(a, k)))
  if a.experts % 8 or a.experts < 16 or a.top_k > a.experts // 2:
    ap.error("--experts: expected a multiple of 8, at least 16 (8 router groups of 2 or more, 4 "
             "chosen), and --top-k at most half of them; got %d and %d" % (a.experts, a.top_k))
  if not 0 <= a.dense_layers <= a.layers:
    ap.error("--dense-layers: expected 0..%d, got %d" % (a.layers, a.dense_layers))
  c = config(a)
  specs = tensors(c)
  shards, cur, size = [], [], 0
  for s in specs:
    b = nbytes(s[1], s[2])
    if cur and size + b > a.shard_bytes:
      shards.append(cur)
      cur, size = [], 0
    cur.append(s)
    size += b
  shards.append(cur)
  os.makedirs(a.output, exist_ok=True)
  rng = random.Random(a.seed)
  weight_map, total, params = {}, 0, 0
  for i, shard in enumerate(shards):
    name = ("model-%05d-of-%05d.safetensors" % (i + 1, len(shards)) if len(shards) > 1
            else "model.safetensors")
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for tname, shape, kind in shard:
      b = nbytes(shape, kind)
      header[tname] = {"dtype": "F32" if kind == "0" else "BF16", "shape": shape,
                       "data_offsets": [off, off + b]}
      off += b
      weight_map[tname] = name
      total += b
      params += b // (4 if kind == "0" else 2)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(a.output, name), "wb") as f:
      f.write(struct.pack("<Q", len(h)))
      f.write(h)
      for _, shape, kind in shard:
        f.write(data(shape, kind, rng))
  if len(shards) > 1:
    with open(os.path.join(a.output, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  with open(os.path.join(a.output, "config.json"), "w") as f:
    json.dump(c, f, indent=2)
  with open(os.path.join(a.output, "generation_config.json"), "w") as f:
    json.dump({"bos_token_id": 0, "eos_token_id": 1}, f, indent=2)
  print("wrote %s: %d tensors, %.1f M parameters, %.3f GiB in %d file(s)" %
        (a.output, len(specs), params / 1e6, total / 2**30, len(shards)))


if __name__ == "__main__":
  main()
