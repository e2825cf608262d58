#!/usr/bin/env python3
"""On-paper model of a DeepSeek-V3 decode step split over N hosts with deepharness's collective
pattern (bench/README.md, "DeepSeek-V3 across hosts, on paper"). Nothing here is measured: it is
arithmetic on the model's shape, the collectives src/model runs per step, and the network and
memory figures given on the command line. Usage:

  bench/tp_model.py [--ranks 8 16] [--gbps 25 100 400] [--alpha-us 10] [--membw-gbs 200]
                    [--batch 1] [--context 4096] [--weight-bytes 2]

Per decode step of B sequences (one token each), per rank (src/model/step_broadcast.cc,
src/model/layers/decoder.cc, src/model/layers/parallel.cc):
  * step broadcast: two MPI_Bcast from rank 0 (a 64-byte header; the batch: 4 * (5B + 1 + B*W)
    bytes, W = block-table width = context / 16);
  * 2 all-reduces per layer (after attention, after the FFN; MoE routed + shared experts share
    the FFN one) of S = B * hidden * 4 bytes (f32 partial sums);
  * the logits gather to rank 0: an all-to-all-v in which every rank sends its vocabulary slice,
    B * ceil(V / N) * 4 bytes, to rank 0 alone.
Times (alpha = per-message latency, bw = link bandwidth in bytes/s):
  all-reduce, ring:               2 (N-1) alpha + 2 (N-1)/N * S / bw
  all-reduce, recursive doubling: log2(N) (alpha + S / bw)
  broadcast (binomial tree):      log2(N) (alpha + s / bw)
  logits gather (rank 0's link):  alpha + (N-1)/N * B * V * 4 / bw
Compute (a memory-bound decode step reads every weight it uses once per step):
  t_mem = (replicated + split / N + busiest rank's routed experts + KV read) * bytes / membw
The routed-expert term uses the busiest rank: V3's router picks 4 of 8 expert groups per token,
then 8 experts among them; with EP the step waits for the rank that got the most distinct experts,
estimated here by sampling that routing uniformly (seeded, 4000 draws).
"""
import argparse
import math
import random

# DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3)
H, L, DENSE_LAYERS, V = 7168, 61, 3, 129280
HEADS, Q_LORA, KV_LORA, NOPE, ROPE, VDIM = 128, 1536, 512, 128, 64, 128
DENSE_INTER, MOE_INTER, EXPERTS, TOPK, GROUPS, TOPK_GROUPS, SHARED = 18432, 2048, 256, 8, 8, 4, 1


def params():
  """Parameters by how they are split (docs/parallel.md, "What is split")."""
  attn_replicated = H * Q_LORA + H * (KV_LORA + ROPE)  # q_a_proj, kv_a_proj_with_mqa
  attn_split = Q_LORA * HEADS * (NOPE + ROPE) + KV_LORA * HEADS * (NOPE + VDIM) + HEADS * VDIM * H
  moe_layers = L - DENSE_LAYERS
  expert = 3 * H * MOE_INTER
  return {
      "replicated (per token)": L * attn_replicated + moe_layers * H * EXPERTS,  # + router
      "split by N": L * attn_split + DENSE_LAYERS * 3 * H * DENSE_INTER
                    + moe_layers * SHARED * expert + V * H,  # + shared experts, lm_head
      "one routed expert, all layers": moe_layers * expert,
      "embedding (looked up, replicated)": V * H,
  }


def busiest_rank_experts(n, batch, trials=4000, seed=1):
  rng = random.Random(seed)
  per_rank, per_group = EXPERTS // n, EXPERTS // GROUPS
  total = 0
  for _ in range(trials):
    chosen = set()
    for _ in range(batch):
      groups = rng.sample(range(GROUPS), TOPK_GROUPS)
      pool = [g * per_group + i for g in groups for i in range(per_group)]
      chosen.update(rng.sample(pool, TOPK))
    counts = [0] * n
    for e in chosen:
      counts[e // per_rank] += 1
    total += max(counts)
  return total / trials


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16])
  ap.add_argument("--gbps", type=float, nargs="+", default=[25, 100, 400])
  ap.add_argument("--alpha-us", type=float, default=10.0, help="per-message latency, µs")
  ap.add_argument("--membw-gbs", type=float, default=200.0,
                  help="memory bandwidth one rank's decode reaches, GB/s")
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--context", type=int, default=4096)
  ap.add_argument("--weight-bytes", type=float, default=2.0,
                  help="bytes per weight (2: FP8 checkpoints are sliced to bf16)")
  a = ap.parse_args()
  p = params()
  b, alpha = a.batch, a.alpha_us * 1e-6
  print(f"DeepSeek-V3: hidden {H}, {L} layers ({DENSE_LAYERS} dense), vocabulary {V}, "
        f"{EXPERTS} routed experts top-{TOPK}, batch {b}, context {a.context}, "
        f"alpha {a.alpha_us:g} µs, memory {a.membw_gbs:g} GB/s, {a.weight_bytes:g} B/weight")
  for k, v in p.items():
    print(f"  {k}: {v / 1e9:.3f} G parameters")
  s_ar = b * H * 4
  width = a.context // 16
  s_bcast = [64, 4 * (5 * b + 1 + b * width)]
  kv_read = L * a.context * (KV_LORA + ROPE) * 2 * b  # bf16 latent cache, every rank reads all
  print(f"  per step: {2 * L} all-reduces of {s_ar} B, 2 broadcasts of {s_bcast} B, "
        f"one logits gather of {b * V * 4} B in all")
  print()
  print("| N | link | all-reduce (ring / rec. doubling) | x 122 | broadcasts | logits gather "
        "| comm per step | weights per rank | busiest rank's experts | t_mem | tokens/s (comm only "
        "/ with t_mem) |")
  print("| --- " * 11 + "|")
  for n in a.ranks:
    lg = math.log2(n)
    busy = busiest_rank_experts(n, b)
    weights_rank = (p["replicated (per token)"] + p["embedding (looked up, replicated)"]
                    + p["split by N"] / n + p["one routed expert, all layers"] * EXPERTS / n)
    read = ((p["replicated (per token)"] + p["split by N"] / n
             + busy * p["one routed expert, all layers"]) * a.weight_bytes + kv_read)
    t_mem = read / (a.membw_gbs * 1e9)
    for gbps in a.gbps:
      bw = gbps * 1e9 / 8
      ring = 2 * (n - 1) * alpha + 2 * (n - 1) / n * s_ar / bw
      rd = lg * (alpha + s_ar / bw)
      ar = min(ring, rd)
      bc = sum(lg * (alpha + s / bw) for s in s_bcast)
      gather = alpha + (n - 1) / n * b * V * 4 / bw
      comm = 2 * L * ar + bc + gather
      print(f"| {n} | {gbps:g} Gb/s | {ring * 1e6:.1f} / {rd * 1e6:.1f} µs | "
            f"{2 * L * ar * 1e3:.2f} ms | {bc * 1e6:.0f} µs | {gather * 1e6:.0f} µs | "
            f"{comm * 1e3:.2f} ms | {weights_rank * a.weight_bytes / 1e9:.0f} GB | {busy:.2f} | "
            f"{t_mem * 1e3:.1f} ms | {b / comm:.0f} / {b / (comm + t_mem):.1f} |")


if __name__ == "__main__":
  main()
