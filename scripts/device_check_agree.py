#!/usr/bin/env python3
"""Compares two [tokens, vocab] float32 logits files (.npy) of the device check: the CPU path's
and a device's. Prints one JSON object: the largest absolute difference, the logit scale (largest
|value| of the first), their ratio, and how many positions' argmax differ; exits 1 when the ratio
is over 2e-2 (the golden tests' bf16 tolerance) or an argmax differs without a near-tie (the CPU
path's top two within that tolerance)."""
import json
import sys

import numpy as np


def main(a_path, b_path):
    a = np.load(a_path)
    b = np.load(b_path)
    if a.shape != b.shape:
        print(json.dumps({"error": f"shapes differ: {a.shape} vs {b.shape}"}))
        return 1
    diff = float(np.max(np.abs(a.astype(np.float64) - b)))
    scale = float(np.max(np.abs(a)))
    tol = 2e-2 * scale
    flips, ties = 0, 0
    for row_a, row_b in zip(a, b):
        ia, ib = int(np.argmax(row_a)), int(np.argmax(row_b))
        if ia == ib:
            continue
        if abs(float(row_a[ia]) - float(row_a[ib])) <= tol:
            ties += 1
        else:
            flips += 1
    out = {"positions": int(a.shape[0]), "max_abs_diff": diff, "scale": scale,
           "relative": diff / scale if scale else diff, "argmax_differs": flips + ties,
           "argmax_differs_near_tie": ties}
    print(json.dumps(out))
    return 0 if diff <= tol and flips == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
