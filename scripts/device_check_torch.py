#!/usr/bin/env python3
"""PyTorch + transformers on a checkpoint directory, for the device check's comparison: decode
tokens/s at batch 1 and 32 (greedy generate of 32 new tokens from a 1-token prompt) and a
2048-token prefill (one forward). Prints one JSON object; exits 0 with {"skipped": reason} when
torch, transformers or a GPU is missing, or the architecture does not load."""
import json
import sys
import time


def main(path):
    try:
        import torch
        import transformers
    except ImportError as e:
        print(json.dumps({"skipped": f"import failed: {e}"}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch sees no CUDA device"}))
        return 0
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, torch_dtype=torch.bfloat16).to("cuda").eval()
    except Exception as e:  # an architecture this transformers version cannot load
        print(json.dumps({"skipped": f"load failed: {type(e).__name__}: {e}"[:500]}))
        return 0
    out = {"torch": torch.__version__, "transformers": transformers.__version__}
    vocab = model.config.vocab_size
    gen = 32
    with torch.inference_mode():
        for batch in (1, 32):
            ids = torch.randint(0, vocab, (batch, 1), device="cuda")
            model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=gen, min_new_tokens=gen, do_sample=False)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            out[f"decode_batch{batch}"] = {"tokens_per_s": batch * gen / dt, "seconds": dt}
        ids = torch.randint(0, vocab, (1, 2048), device="cuda")
        model(ids)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model(ids)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        out["prefill_2048"] = {"tokens_per_s": 2048 / dt, "seconds": dt}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
