#!/usr/bin/python3
"""Recomputes a saved tiny model's validation loss (as MODEL.md defines it) from its folder, with the
float32 reference model on the bf16 weights: a cross-check for the figure in MODEL.md / eval.json.
With an MTP layer in the checkpoint it also prints the MTP's loss, top-1 and greedy acceptance
(train.mtp_window_stats: MTP argmax for t_{i+2} == the main model's argmax at i+1).

Usage: /usr/bin/python3 pytorch/train_tiny/eval_model.py [--model DIR] [--context N] [--file TEXT]
"""
import argparse
import math
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "pytorch", "reference"))
import bpe  # noqa: E402
import deepseek_ref  # noqa: E402
from train import mtp_window_stats, window_loss  # noqa: E402
from train_tokenizer import split_corpus  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO, "models", "shakespeare-v3"))
    ap.add_argument("--corpus", default=os.path.join(REPO, "..", "shared", "data", "corpus",
                                                     "tinyshakespeare.txt"))
    ap.add_argument("--file", help="text to score instead of the corpus' validation split")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with open(args.file or args.corpus, encoding="utf-8") as f:
        text = f.read()
    if not args.file:
        text = text[split_corpus(text):]
    tok = bpe.Tokenizer(os.path.join(args.model, "tokenizer.json"))
    ids = tok.encode(text)
    model = deepseek_ref.load_checkpoint(args.model)
    loss, n = window_loss(model, ids, args.context)
    print("%d ids, %d predictions, loss %.6f nats/token, perplexity %.4f"
          % (len(ids), n, loss, math.exp(loss)))
    if model.config.get("num_nextn_predict_layers", 0) > 0:
        mtp = deepseek_ref.load_mtp(args.model, model)
        m = mtp_window_stats(model, mtp, ids, args.context)
        print("MTP: %d positions, loss %.6f nats/token, top-1 %.4f, main top-1 of t_{i+2} %.4f, "
              "greedy acceptance %.4f" % (m["n"], m["mtp_loss"], m["mtp_top1"], m["main_top1"],
                                          m["acceptance"]))


if __name__ == "__main__":
    main()
