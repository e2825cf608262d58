"""Golden logits of the multi-token-prediction layer of tests/golden/fixtures/ds_v3_mtp.

Reads the committed fixture (its config, safetensors and expected.json input_ids), runs the main
model for h_i (final normed hidden states) and the MTP layer (deepseek_ref.MtpLayer) on
(h_i, t_{i+1}) at positions i = 0 .. T-2, and writes mtp_logits.npy (float32 [T-1, vocab]: row i
predicts t_{i+2}) and mtp.json (shape, logits scale, the smallest top-1/top-2 gap). Deterministic.

  /usr/bin/python3 pytorch/reference/make_mtp_golden.py
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepseek_ref as ds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASE = os.path.join(ROOT, "tests", "golden", "fixtures", "ds_v3_mtp")


def main():
    torch.set_num_threads(1)
    with open(os.path.join(CASE, "expected.json")) as f:
        ids = torch.tensor(json.load(f)["input_ids"])
    model = ds.load_checkpoint(CASE)
    mtp = ds.load_mtp(CASE, model)
    model.eval()
    mtp.eval()
    with torch.no_grad():
        hidden = model.final_hidden(ids[None])[0]            # [T, hidden]
        t = ids.shape[0]
        logits = mtp(hidden[None, : t - 1], ids[None, 1:], torch.arange(t - 1))[0]  # [T-1, vocab]
    top2 = logits.topk(2, dim=-1).values
    out = {"rows": t - 1, "vocab": int(logits.shape[1]),
           "logits_scale": float(logits.abs().max()),
           "min_top2_margin": float((top2[:, 0] - top2[:, 1]).min()),
           "argmax": logits.argmax(-1).tolist(),
           "semantics": "row i: MTP(h_i, t_{i+1}) at position i -> logits of t_{i+2}; h_i the main "
                        "model's final normed hidden state; eh_proj over [enorm(embed); hnorm(h)]"}
    np.save(os.path.join(CASE, "mtp_logits.npy"), logits.numpy().astype(np.float32))
    with open(os.path.join(CASE, "mtp.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("ds_v3_mtp: mtp_logits.npy [%d, %d], scale %.3f, min top-2 margin %.4f" %
          (t - 1, out["vocab"], out["logits_scale"], out["min_top2_margin"]))


if __name__ == "__main__":
    main()
