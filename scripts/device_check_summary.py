#!/usr/bin/env python3
"""Writes the device check's summary.json (to stdout) from the logs in OUTDIR: stage results, the
roofline (copy bandwidth, cuBLAS bf16 GEMM rate), per model the decode/prefill rates of
deepharness and their fractions of the roofline, the per-op times of a decode step, the
agreement of its logits with the CPU path's, and the PyTorch ratio. Figures are only copied or
derived from what the run measured."""
import json
import os
import sys


def load_json_log(path):
    """The last JSON object in a log (bench --json prints one; log lines may precede it)."""
    try:
        text = open(path).read()
    except OSError:
        return None
    start = text.find("{")
    while start >= 0:
        try:
            return json.loads(text[start:])
        except ValueError:
            start = text.find("\n{", start + 1)
            if start >= 0:
                start += 1
    return None


def main(out):
    summary = {"stages": [], "models": {}}
    try:
        for line in open(os.path.join(out, "stages.tsv")):
            name, rc, secs = line.rstrip("\n").split("\t")
            summary["stages"].append({"stage": name, "status": int(rc), "seconds": int(secs)})
    except OSError:
        pass
    summary["passed"] = bool(summary["stages"]) and all(s["status"] == 0 for s in summary["stages"])
    roof = load_json_log(os.path.join(out, "roofline.log"))
    summary["roofline"] = roof
    copy_gbs = roof.get("d2d_copy_gb_per_s") if roof else None
    gemm = {(g["m"], g["n"], g["k"]): g["tflops"] for g in (roof or {}).get("gemm_bf16", [])}
    for name in ("qwen2-1.5b", "llama-8b", "v2-lite"):
        m = {}
        dec = load_json_log(os.path.join(out, f"decode_{name}.log"))
        if dec:
            m["weight_bytes"] = dec.get("weight_bytes")
            m["active_weight_bytes_per_token"] = dec.get("active_weight_bytes_per_token")
            for r in dec.get("results", []):
                if not str(r.get("test", "")).startswith("tg"):
                    continue
                tps = r["tokens_per_s_mean"]
                steps = tps / r["batch"]
                row = {"tokens_per_s": tps, "steps_per_s": steps}
                # Bytes a decode step must read: every weight touched once (active experts only at
                # batch 1; at batch 32 a MoE reads more experts, so this is a lower bound there).
                if m.get("active_weight_bytes_per_token") and copy_gbs:
                    gbs = m["active_weight_bytes_per_token"] * steps / 1e9
                    row["weight_read_gb_per_s"] = gbs
                    row["fraction_of_d2d_copy"] = gbs / copy_gbs
                m[f"decode_batch{r['batch']}"] = row
        pre = load_json_log(os.path.join(out, f"prefill_{name}.log"))
        if pre:
            for r in pre.get("results", []):
                if str(r.get("test", "")).startswith("pp"):
                    row = {"tokens_per_s": r["tokens_per_s_mean"], "gflops": r.get("gflops")}
                    shapes = [k for k in gemm if k[0] == 2048]
                    if r.get("gflops") and shapes:
                        # cuBLAS's rate on this model's shapes (the three GEMMs of its layer).
                        mine = [gemm[k] for k in shapes if name_shapes(name, k)]
                        if mine:
                            ref = sum(mine) / len(mine)
                            row["cublas_bf16_tflops_same_shapes"] = ref
                            row["fraction_of_cublas"] = r["gflops"] / 1e3 / ref
                    m["prefill_2048"] = row
        agree = load_json_log(os.path.join(out, f"agree_{name}.log"))
        if agree:
            m["logits_vs_cpu"] = agree
        ops = load_json_log(os.path.join(out, f"optimes_{name}.json"))
        if ops:
            steps = 8  # optimes runs --gen 8 --batch 1 (one prefill-free decode step per token)
            m["decode_step_op_ms"] = {k: {"calls_per_step": v["count"] / steps,
                                          "ms_per_step": v["ms"] / steps}
                                      for k, v in ops.get("ops", {}).items()}
        ops = load_json_log(os.path.join(out, f"optimes_prefill_{name}.json"))
        if ops:  # one 2048-token prefill (bench --repeat 1 --warmup 0)
            m["prefill_op_ms"] = {k: {"calls": v["count"], "ms": v["ms"]}
                                  for k, v in ops.get("ops", {}).items()}
        torch = load_json_log(os.path.join(out, f"torch_{name}.log"))
        if torch:
            m["torch"] = torch
            for key in ("decode_batch1", "decode_batch32", "prefill_2048"):
                ours = m.get(key, {}).get("tokens_per_s")
                theirs = torch.get(key, {}).get("tokens_per_s") if isinstance(torch.get(key), dict) else None
                if ours and theirs:
                    m.setdefault("ratio_vs_torch", {})[key] = ours / theirs
        if m:
            summary["models"][name] = m
    json.dump(summary, sys.stdout, indent=2)
    print()


SHAPES = {
    "qwen2-1.5b": {(2048, 8960, 1536), (2048, 1536, 8960), (2048, 2048, 1536)},
    "llama-8b": {(2048, 14336, 4096), (2048, 4096, 14336), (2048, 6144, 4096)},
    "v2-lite": {(2048, 10944, 2048), (2048, 2048, 10944), (2048, 1408, 2048)},
}


def name_shapes(name, k):
    return k in SHAPES.get(name, set())


if __name__ == "__main__":
    main(sys.argv[1])
