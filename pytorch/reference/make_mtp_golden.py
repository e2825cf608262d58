"""Golden logits of the multi-token-prediction layer, from the independent PyTorch reference.

Two cases:
  ds_v3_mtp        tests/golden/fixtures/ds_v3_mtp, a tiny V3-shaped random checkpoint: reads its
                   config, safetensors and expected.json input_ids.
  shakespeare_mtp  the embedded model models/shakespeare-v3 (trained with an MTP layer,
                   pytorch/train_tiny/train.py); the prompt is BOS + the first PROMPT_TOKENS ids of
                   the validation text, and the data goes to tests/golden/fixtures/shakespeare_mtp
                   (expected.json with the input ids, logits.npy of the main model [T, vocab]).
For each: runs the main model for h_i (final normed hidden states) and the MTP layer
(deepseek_ref.MtpLayer) on (h_i, t_{i+1}) at positions i = 0 .. T-2, and writes mtp_logits.npy
(float32 [T-1, vocab]: row i predicts t_{i+2}) and mtp.json (shape, logits scale, the smallest
top-1/top-2 gap, argmax). Deterministic.

  /usr/bin/python3 pytorch/reference/make_mtp_golden.py [ds_v3_mtp] [shakespeare_mtp]
"""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import deepseek_ref as ds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(ROOT, "tests", "golden", "fixtures")
EMBEDDED = os.path.join(ROOT, "models", "shakespeare-v3")
PROMPT_TOKENS = 40


def mtp_golden(model_dir, ids, out_dir, name, main_logits_too):
    model = ds.load_checkpoint(model_dir)
    mtp = ds.load_mtp(model_dir, model)
    model.eval()
    mtp.eval()
    with torch.no_grad():
        hidden = model.final_hidden(ids[None])[0]            # [T, hidden]
        t = ids.shape[0]
        logits = mtp(hidden[None, : t - 1], ids[None, 1:], torch.arange(t - 1))[0]  # [T-1, vocab]
        main = model(ids[None])[0]
    top2 = logits.topk(2, dim=-1).values
    out = {"rows": t - 1, "vocab": int(logits.shape[1]),
           "logits_scale": float(logits.abs().max()),
           "min_top2_margin": float((top2[:, 0] - top2[:, 1]).min()),
           "argmax": logits.argmax(-1).tolist(),
           "semantics": "row i: MTP(h_i, t_{i+1}) at position i -> logits of t_{i+2}; h_i the main "
                        "model's final normed hidden state; eh_proj over [enorm(embed); hnorm(h)]"}
    os.makedirs(out_dir, exist_ok=True)
    np.save(os.path.join(out_dir, "mtp_logits.npy"), logits.numpy().astype(np.float32))
    if main_logits_too:
        np.save(os.path.join(out_dir, "logits.npy"), main.numpy().astype(np.float32))
        with open(os.path.join(out_dir, "expected.json"), "w") as f:
            json.dump({"case": name, "model": os.path.relpath(model_dir, ROOT),
                       "input_ids": ids.tolist(),
                       "logits_scale": float(main.abs().max()),
                       "description": "the embedded model's main logits over the prompt (BOS + "
                                      "the first %d validation ids) and its MTP layer's logits"
                                      % (t - 1)}, f, indent=1)
            f.write("\n")
    with open(os.path.join(out_dir, "mtp.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("%s: mtp_logits.npy [%d, %d], scale %.3f, min top-2 margin %.4f" %
          (name, t - 1, out["vocab"], out["logits_scale"], out["min_top2_margin"]))


def main():
    torch.set_num_threads(1)
    cases = sys.argv[1:] or ["ds_v3_mtp", "shakespeare_mtp"]
    if "ds_v3_mtp" in cases:
        case = os.path.join(FIXTURES, "ds_v3_mtp")
        with open(os.path.join(case, "expected.json")) as f:
            ids = torch.tensor(json.load(f)["input_ids"])
        mtp_golden(case, ids, case, "ds_v3_mtp", False)
    if "shakespeare_mtp" in cases:
        sys.path.insert(0, os.path.join(ROOT, "pytorch", "train_tiny"))
        import bpe  # noqa: E402
        from train_tokenizer import split_corpus  # noqa: E402
        with open(os.path.join(ROOT, "..", "shared", "data", "corpus", "tinyshakespeare.txt"),
                  encoding="utf-8") as f:
            text = f.read()
        tok = bpe.Tokenizer(os.path.join(EMBEDDED, "tokenizer.json"))
        ids = tok.encode(text[split_corpus(text):split_corpus(text) + 2000])[:PROMPT_TOKENS + 1]
        mtp_golden(EMBEDDED, torch.tensor(ids), os.path.join(FIXTURES, "shakespeare_mtp"),
                   "shakespeare_mtp", True)


if __name__ == "__main__":
    main()
