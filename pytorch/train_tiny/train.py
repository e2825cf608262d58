#!/usr/bin/python3
"""Trains the embedded default model: a tiny DeepSeek-V3-architecture LM (MLA with q_lora, sigmoid
noaux_tc MoE, dense first layer) on tinyshakespeare, using the float32 reference model in
pytorch/reference/deepseek_ref.py, and writes models/shakespeare-v3 (bf16 safetensors + HF files).

Usage: /usr/bin/python3 pytorch/train_tiny/train.py [--steps N] [--seed S] [--out DIR] ...
Run train_tokenizer.py first (it writes tokenizer.json into the same --out directory).
"""
import argparse
import json
import math
import os
import sys
import time

# Under heavy CPU contention OpenMP's spinning barriers waste most of the time slice.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "pytorch", "reference"))
import bpe  # noqa: E402
import deepseek_ref  # noqa: E402
from train_tokenizer import split_corpus  # noqa: E402

SAMPLE_PROMPTS = ["ROMEO:\n", "First Citizen:\n", "KING RICHARD III:\nNow is the"]


def model_config(vocab_size, context, bos_id, eos_id, mtp_layers=1):
    """HF config.json for DeepseekV3ForCausalLM, all DeepSeek fields present."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        "hidden_size": 128,
        "intermediate_size": 384,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_nextn_predict_layers": mtp_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 8,
        "ep_size": 1,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 32,
        "q_lora_rank": 64,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "qk_nope_head_dim": 32,
        "topk_method": "noaux_tc",
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 2,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 1,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "aux_loss_alpha": 0.0,
        "seq_aux": True,
        "hidden_act": "silu",
        "max_position_embeddings": context,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
        "transformers_version": "4.33.1",
    }


def init_param(name, p, g, std, n_layers):
    """GPT-2 style init of one tensor: N(0, std) matrices, residual outputs scaled by 1/sqrt(2L),
    norms 1, router bias 0 (draws from g only for the random ones)."""
    if name.endswith("e_score_correction_bias"):
        p.zero_()
    elif "norm" in name.split(".")[-2]:
        p.fill_(1.0)
    elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
        p.copy_(torch.randn(p.shape, generator=g) * std / math.sqrt(2 * n_layers))
    else:
        p.copy_(torch.randn(p.shape, generator=g) * std)


def init_weights(model, seed, std=0.02):
    """init_param over every tensor of the model, in name order."""
    g = torch.Generator().manual_seed(seed)
    n_layers = model.config["num_hidden_layers"]
    with torch.no_grad():
        for name, p in sorted(model.state_dict(keep_vars=True).items()):
            init_param(name, p, g, std, n_layers)


def make_mtp(model):
    """DeepSeek-V3's MTP module (depth 1) for training: deepseek_ref.MtpLayer with its embedding and
    output head shared with the main model (the report's sharing, section 2.2); mtp_tensors writes them
    as the copies the released checkpoints carry."""
    mtp = deepseek_ref.MtpLayer(model.config, model.arch, model)
    mtp.embed_tokens = model.model.embed_tokens
    mtp.shared_head.head = model.lm_head
    return mtp


def init_mtp(mtp, seed, n_layers, std=0.02):
    """init_param over the MTP module's own tensors (the shared embedding/head are the main
    model's); a generator of its own so the main model's init is the same as without MTP."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in sorted(mtp.state_dict(keep_vars=True).items()):
            if not name.startswith(("embed_tokens.", "shared_head.head.")):
                init_param(name, p, g, std, n_layers)


def mtp_tensors(mtp, n_layers):
    """The MTP layer's checkpoint tensors under model.layers.<n_layers>. (the names
    deepseek_ref.load_mtp and the engine's loader read; docs/mtp.md): bf16, except the router's
    e_score_correction_bias (f32, like the main layers'). The MTP's own values are rounded to bf16 in
    place so the in-memory module matches the file."""
    prefix = "model.layers.%d." % n_layers
    own = deepseek_ref._MTP_OWN
    out = {}
    with torch.no_grad():
        for k, v in mtp.state_dict(keep_vars=True).items():
            name = prefix + (k if k.startswith(own) else k[len("block."):])
            if k.endswith("e_score_correction_bias"):
                out[name] = v.detach().float().clone()
            else:
                v.copy_(v.to(torch.bfloat16).float())
                out[name] = v.detach().to(torch.bfloat16).clone()
    return out


def mtp_param_count(mtp):
    """Parameters of the MTP module not shared with the main model."""
    return sum(p.numel() for n, p in mtp.named_parameters()
               if not n.startswith(("embed_tokens.", "shared_head.head.")))


def mtp_window_stats(model, mtp, ids, context, batch=16):
    """Over the same windows as window_loss: at every position i of a window with i + 2 inside it,
    MTP(h_i, t_{i+1}) predicts t_{i+2}. Returns a dict: mtp_loss (mean NLL of t_{i+2}), mtp_top1
    (MTP argmax == t_{i+2}), main_top1 (main argmax at i+1 == t_{i+2}) and acceptance (MTP argmax ==
    the main model's argmax at i+1: the greedy draft acceptance rate with the text as the accepted
    prefix), and n (positions)."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    n = ids.numel()
    wins = [ids[s:s + context] for s in range(0, n, context) if n - s >= 3]
    nll, hit_mtp, hit_main, agree, count = 0.0, 0, 0, 0, 0
    model.eval()
    mtp.eval()
    with torch.no_grad():
        groups = {}
        for w in wins:
            groups.setdefault(w.numel(), []).append(w)
        for length, ws in sorted(groups.items()):
            for b in range(0, len(ws), batch):
                x = torch.stack(ws[b:b + batch])
                t = x.shape[1]
                h = model.final_hidden(x)
                main_logits = F.linear(h, model.lm_head.weight.float())
                ml = mtp(h[:, :t - 2], x[:, 1:t - 1], torch.arange(t - 2))
                target = x[:, 2:]
                nll += float(F.cross_entropy(ml.reshape(-1, ml.shape[-1]), target.reshape(-1),
                                             reduction="sum").double())
                draft = ml.argmax(-1)
                main_next = main_logits[:, 1:t - 1].argmax(-1)
                hit_mtp += int((draft == target).sum())
                hit_main += int((main_next == target).sum())
                agree += int((draft == main_next).sum())
                count += target.numel()
    model.train()
    mtp.train()
    return {"mtp_loss": nll / count, "mtp_top1": hit_mtp / count, "main_top1": hit_main / count,
            "acceptance": agree / count, "n": count}


def greedy_acceptance(model, mtp, prompt_ids, new_ids):
    """On a greedy continuation (prompt + new ids, each new id the main model's argmax): how often
    MTP(h_i, t_{i+1}) at the positions i whose t_{i+2} is a generated id drafts exactly t_{i+2}.
    This is the greedy speculative-decoding acceptance (K = 1) of that sample. Returns (hits, n)."""
    ids = torch.tensor(list(prompt_ids) + list(new_ids))[None]
    t = ids.shape[1]
    model.eval()
    mtp.eval()
    with torch.no_grad():
        h = model.final_hidden(ids)
        draft = mtp(h[:, :t - 2], ids[:, 1:t - 1], torch.arange(t - 2))[0].argmax(-1)
    model.train()
    mtp.train()
    first = len(prompt_ids) - 2      # row i predicts t_{i+2}; the first generated id is t_{len(prompt)}
    hits = int((draft[first:] == ids[0, first + 2:]).sum())
    return hits, t - 2 - first


def count_params(model):
    total = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() for b in model.buffers())
    cfg = model.config
    e = cfg["n_routed_experts"]
    per_expert = 3 * cfg["hidden_size"] * cfg["moe_intermediate_size"]
    n_moe = sum(1 for i in range(cfg["num_hidden_layers"]) if deepseek_ref.is_moe_layer(cfg, i))
    active = total - n_moe * (e - cfg["num_experts_per_tok"]) * per_expert
    return total, buffers, active


class ExpertLoad:
    """Counts tokens routed to each expert per MoE layer (forward hooks on the gates) and applies
    DeepSeek-V3's auxiliary-loss-free balancing: bias_i += gamma * sign(mean_load - load_i)."""

    def __init__(self, model, gamma):
        self.gamma = gamma
        self.gates = [m for m in model.modules() if isinstance(m, deepseek_ref.Gate)]
        self.counts = [torch.zeros(g.n_experts) for g in self.gates]
        self.enabled = True
        for i, g in enumerate(self.gates):
            g.register_forward_hook(self._hook(i))

    def _hook(self, i):
        def fn(module, inputs, output):
            if self.enabled:
                idx = output[0]
                self.counts[i] += torch.bincount(idx.reshape(-1), minlength=module.n_experts).float()
        return fn

    def update(self):
        """Applies the bias rule; returns the max/mean load ratio over layers (1 = balanced)."""
        worst = 1.0
        with torch.no_grad():
            for g, c in zip(self.gates, self.counts):
                if c.sum() == 0:
                    continue
                mean = c.mean()
                worst = max(worst, float(c.max() / mean))
                if self.gamma > 0:
                    g.e_score_correction_bias += self.gamma * torch.sign(mean - c)
                c.zero_()
        return worst


def window_loss(model, ids, context, batch=16):
    """Mean NLL (nats/token) over windows ids[i*context:(i+1)*context]: inside each window every
    token but the first is predicted from the tokens before it in that window. A last partial
    window with >= 2 tokens counts too. Returns (mean, n_predicted)."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    n = ids.numel()
    starts = list(range(0, n, context))
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        full = [s for s in starts if s + context <= n]
        for b in range(0, len(full), batch):
            x = torch.stack([ids[s:s + context] for s in full[b:b + batch]])
            logits = model(x)
            nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                                  reduction="sum")
            total += float(nll.double())
            count += x.shape[0] * (context - 1)
        tail = [s for s in starts if s + context > n and n - s >= 2]
        for s in tail:
            x = ids[s:][None]
            logits = model(x)
            total += float(F.cross_entropy(logits[0, :-1], x[0, 1:], reduction="sum").double())
            count += x.shape[1] - 1
    model.train()
    return total / count, count


def greedy(model, prompt_ids, n_new, context):
    """Greedy decoding by full recomputation; returns (new ids, per-step top1-top2 logit margins)."""
    ids = list(prompt_ids)
    margins = []
    model.eval()
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor(ids[-context:])[None])[0, -1]
            top = logits.topk(2)
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(int(top.indices[0]))
    model.train()
    return ids[len(prompt_ids):], margins


def lr_at(step, steps, lr, warmup, min_ratio):
    if step < warmup:
        return lr * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=os.path.join(REPO, "..", "shared", "data", "corpus",
                                                     "tinyshakespeare.txt"))
    ap.add_argument("--out", default=os.path.join(REPO, "models", "shakespeare-v3"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--bias-gamma", type=float, default=1e-3,
                    help="aux-loss-free balancing step for e_score_correction_bias (0 keeps it zero)")
    ap.add_argument("--bos-fraction", type=float, default=0.25,
                    help="fraction of training rows that start with BOS instead of mid-text")
    ap.add_argument("--mtp-lambda", type=float, default=0.3,
                    help="weight of DeepSeek-V3's MTP loss (depth 1); 0 trains no MTP layer")
    ap.add_argument("--save-f32", help="also torch.save the f32 state (main + MTP) to this file")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--time-steps", type=int, default=0,
                    help="only time this many training steps, print s/step, write nothing")
    ap.add_argument("--sample-tokens", type=int, default=64)
    ap.add_argument("--val-tokens", type=int, default=0, help="smoke tests: cut validation ids")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.RandomState(args.seed)
    t_start = time.time()

    with open(args.corpus, encoding="utf-8") as f:
        text = f.read()
    split = split_corpus(text)
    tok_path = os.path.join(args.out, "tokenizer.json")
    tok = bpe.Tokenizer(tok_path)
    train_ids = torch.tensor(tok.encode(text[:split]), dtype=torch.long)
    val_ids = tok.encode(text[split:])
    if args.val_tokens:
        val_ids = val_ids[:args.val_tokens]
    vocab = len(tok.id_to_token)

    use_mtp = args.mtp_lambda > 0
    cfg = model_config(vocab, args.context, tok.bos_id, tok.eos_id, 1 if use_mtp else 0)
    model = deepseek_ref.DeepseekRef(cfg)
    init_weights(model, args.seed)
    total, buffers, active = count_params(model)
    mtp = make_mtp(model) if use_mtp else None
    if use_mtp:
        init_mtp(mtp, args.seed, cfg["num_hidden_layers"])
    n_mtp = mtp_param_count(mtp) if use_mtp else 0
    # One module holding both, so parameters (shared ones once), the router gates of the MTP block
    # and gradient clipping cover the MTP layer too.
    trained = torch.nn.ModuleDict({"main": model, "mtp": mtp} if use_mtp else {"main": model})
    log_lines = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)

    log("params %d (+%d router-bias buffer values), active per token %d; MTP layer %d more (lambda "
        "%g); train %d tokens, val %d tokens" % (total, buffers, active, n_mtp, args.mtp_lambda,
                                                  train_ids.numel(), len(val_ids)))

    balancer = ExpertLoad(trained, args.bias_gamma)
    decay = [p for n, p in trained.named_parameters() if p.dim() >= 2 and "embed" not in n]
    no_decay = [p for n, p in trained.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    ctx = args.context
    n_train = train_ids.numel()
    steps = args.time_steps or args.steps
    run_loss, run_n, run_mtp = 0.0, 0, 0.0
    train_losses, mtp_losses = [], []
    t_loop = time.time()
    for step in range(steps):
        offs = rng.randint(0, n_train - ctx - 1, size=args.batch)
        bos_rows = rng.rand(args.batch) < args.bos_fraction
        rows = []
        for o, b in zip(offs, bos_rows):
            if b:
                rows.append(torch.cat([torch.tensor([tok.bos_id]), train_ids[o:o + ctx]]))
            else:
                rows.append(train_ids[o:o + ctx + 1])
        xy = torch.stack(rows)
        x, y = xy[:, :-1], xy[:, 1:]
        lr = lr_at(step, steps, args.lr, args.warmup, args.min_lr_ratio)
        for gr in opt.param_groups:
            gr["lr"] = lr
        h = model.final_hidden(x)
        logits = F.linear(h, model.lm_head.weight)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        total_loss = loss
        if use_mtp:
            # DeepSeek-V3 MTP (report section 2.2, D = 1): at position i the module reads h_i and
            # emb(t_{i+1}) and predicts t_{i+2}; L = L_main + lambda * L_MTP.
            t = x.shape[1]
            mtp_logits = mtp(h[:, :t - 1], y[:, :t - 1], torch.arange(t - 1))
            mtp_loss = F.cross_entropy(mtp_logits.reshape(-1, vocab), y[:, 1:].reshape(-1))
            total_loss = loss + args.mtp_lambda * mtp_loss
            run_mtp += float(mtp_loss)
            mtp_losses.append(float(mtp_loss))
        opt.zero_grad(set_to_none=True)
        total_loss.backward()
        torch.nn.utils.clip_grad_norm_(trained.parameters(), 1.0)
        opt.step()
        imbalance = balancer.update()
        run_loss += float(loss)
        run_n += 1
        train_losses.append(float(loss))
        if args.time_steps:
            print("step %d %.2fs" % (step, time.time() - t_loop), flush=True)
            continue
        if (step + 1) % args.log_every == 0 or step == 0:
            log("step %5d  lr %.2e  train %.4f  mtp %.4f  max/mean expert load %.2f  %.0fs" % (
                step + 1, lr, run_loss / run_n, run_mtp / run_n, imbalance, time.time() - t_start))
            run_loss, run_n, run_mtp = 0.0, 0, 0.0
        if (step + 1) % args.eval_every == 0 and step + 1 < steps:
            balancer.enabled = False
            v, _ = window_loss(model, val_ids[:4 * ctx], ctx)
            msg = "step %5d  val(first %d tokens, f32) %.4f" % (step + 1, 4 * ctx, v)
            if use_mtp:
                ms = mtp_window_stats(model, mtp, val_ids[:4 * ctx], ctx)
                msg += "  mtp %.4f  acceptance %.3f" % (ms["mtp_loss"], ms["acceptance"])
            balancer.enabled = True
            log(msg)
    train_time = time.time() - t_loop
    if args.time_steps:
        print("%.3f s/step" % (train_time / steps))
        return
    balancer.enabled = False

    # Final figures. Train loss: mean of the last 50 steps' batch losses (f32 weights).
    final_train_f32 = float(np.mean(train_losses[-50:]))
    final_mtp_f32 = float(np.mean(mtp_losses[-50:])) if use_mtp else None
    log("training done in %.0fs; evaluating" % train_time)
    if args.save_f32:
        torch.save(trained.state_dict(), args.save_f32)
    val_f32, _ = window_loss(model, val_ids, ctx)
    mtp_f32 = mtp_window_stats(model, mtp, val_ids, ctx) if use_mtp else None
    # mtp_tensors rounds the MTP's own tensors to bf16; the shared embedding/head are rounded by
    # save_checkpoint (copies are taken after it).
    extra = None
    if use_mtp:
        deepseek_ref.round_bf16_(model)
        extra = mtp_tensors(mtp, cfg["num_hidden_layers"])
    deepseek_ref.save_checkpoint(model, args.out, dtype="bf16", extra=extra)
    # Evaluate exactly what the engine runs: reload the bf16 file into a float32 model.
    model = deepseek_ref.load_checkpoint(args.out)
    val_bf16, n_pred = window_loss(model, val_ids, ctx)
    log("final: train(last 50 batches, f32) %.4f  val f32 %.4f  val bf16 %.4f (%d predictions)  "
        "train time %.0fs" % (final_train_f32, val_f32, val_bf16, n_pred, train_time))
    mtp_bf16 = None
    if use_mtp:
        mtp = deepseek_ref.load_mtp(args.out, model)
        mtp_bf16 = mtp_window_stats(model, mtp, val_ids, ctx)
        log("MTP: train(last 50 batches, f32) %.4f  val f32 %.4f  val bf16 %.4f  top-1 %.4f  "
            "main top-1 of t_{i+2} %.4f  acceptance (MTP argmax == main argmax at i+1) bf16 %.4f "
            "f32 %.4f over %d positions" % (
                final_mtp_f32, mtp_f32["mtp_loss"], mtp_bf16["mtp_loss"], mtp_bf16["mtp_top1"],
                mtp_bf16["main_top1"], mtp_bf16["acceptance"], mtp_f32["acceptance"], mtp_bf16["n"]))

    samples = []
    for p in SAMPLE_PROMPTS:
        pids = tok.encode(p)
        new, margins = greedy(model, pids, args.sample_tokens, ctx)
        sample = {"prompt": p, "prompt_ids": pids, "new_ids": new, "text": tok.decode(new),
                  "min_top2_logit_margin": round(min(margins), 4),
                  "top2_logit_margins": [round(m, 4) for m in margins]}
        if use_mtp:
            hits, n = greedy_acceptance(model, mtp, pids, new)
            sample["mtp_greedy_accepted"] = hits
            sample["mtp_greedy_drafted"] = n
        samples.append(sample)

    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "do_sample": True,
                   "temperature": 0.8, "top_p": 0.95, "max_new_tokens": 200,
                   "transformers_version": "4.33.1"}, f, indent=2)
        f.write("\n")
    wall = time.time() - t_start
    cmd = ("/usr/bin/python3 pytorch/train_tiny/train_tokenizer.py && /usr/bin/python3 "
           "pytorch/train_tiny/train.py " + " ".join(sys.argv[1:])).strip()
    evaluation = {
        "corpus": "tinyshakespeare.txt (%d bytes)" % len(text.encode("utf-8")),
        "validation_char_offset": split,
        "validation_bytes": len(text[split:].encode("utf-8")),
        "tokenization": "one BOS id %d, then the BPE ids of the validation text (no EOS)" % tok.bos_id,
        "num_tokens_with_bos": len(val_ids),
        "context": ctx, "stride": ctx,
        "predicted_tokens": n_pred,
        "val_loss_bf16_nats_per_token": round(val_bf16, 6),
        "val_perplexity_bf16": round(math.exp(val_bf16), 4),
        "val_loss_f32_nats_per_token": round(val_f32, 6),
        "train_loss_last50_f32": round(final_train_f32, 6),
        "greedy_samples": samples,
    }
    if use_mtp:
        evaluation["mtp"] = {
            "num_nextn_predict_layers": 1, "loss_weight_lambda": args.mtp_lambda,
            "parameters": n_mtp,
            "semantics": "position i of each validation window (i + 2 inside it): MTP(h_i, t_{i+1}) "
                         "-> t_{i+2}; acceptance = MTP argmax equals the main model's argmax at "
                         "i + 1",
            "positions": mtp_bf16["n"],
            "train_loss_last50_f32": round(final_mtp_f32, 6),
            "val_loss_bf16_nats_per_token": round(mtp_bf16["mtp_loss"], 6),
            "val_loss_f32_nats_per_token": round(mtp_f32["mtp_loss"], 6),
            "val_top1_bf16": round(mtp_bf16["mtp_top1"], 6),
            "val_main_top1_of_next_next_bf16": round(mtp_bf16["main_top1"], 6),
            "val_acceptance_bf16": round(mtp_bf16["acceptance"], 6),
            "val_acceptance_f32": round(mtp_f32["acceptance"], 6),
        }
    with open(os.path.join(args.out, "eval.json"), "w", encoding="utf-8") as f:
        json.dump(evaluation, f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(args.out, "train_log.txt"), "w") as f:
        f.write("\n".join(log_lines) + "\n")
    write_model_md(args, cfg, cmd, total, buffers, active, steps, train_time, wall, final_train_f32,
                   val_f32, val_bf16, n_pred, split, len(val_ids), n_train, tok, samples,
                   evaluation.get("mtp"))
    print("wrote %s in %.0fs" % (args.out, wall))


def write_model_md(args, cfg, cmd, total, buffers, active, steps, train_time, wall, train_loss,
                   val_f32, val_bf16, n_pred, split, n_val, n_train, tok, samples, mtp=None):
    ctx = args.context
    tokens_seen = steps * args.batch * ctx
    lines = [
        "# shakespeare-v3: a tiny DeepSeek-V3-architecture model trained on tinyshakespeare",
        "",
        "The default model of deepharness. Architecture `DeepseekV3ForCausalLM` (MLA with q_lora,",
        "sigmoid `noaux_tc` MoE with `e_score_correction_bias`, first layer dense), trained from scratch",
        "with the float32 reference model in pytorch/reference/deepseek_ref.py and stored in bf16.",
        "",
        "## Figures",
        "",
        "| | |",
        "|---|---|",
        "| parameters | %d (%.2f M) + %d router-bias values; %d active per token |" % (
            total, total / 1e6, buffers, active),
        "| layers / hidden / heads | %d / %d / %d; q_lora %d, kv_lora %d, nope %d, rope %d, v %d |" % (
            cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["q_lora_rank"], cfg["kv_lora_rank"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
            cfg["v_head_dim"]),
        "| MoE | %d routed experts (width %d), top-%d, %d shared, n_group %d / topk_group %d, "
        "routed_scaling_factor %s; layer 0 dense (width %d) |" % (
            cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["num_experts_per_tok"],
            cfg["n_shared_experts"], cfg["n_group"], cfg["topk_group"], cfg["routed_scaling_factor"],
            cfg["intermediate_size"]),
        "| vocabulary | %d (byte-level BPE trained on the training split) |" % cfg["vocab_size"],
        "| context | %d (max_position_embeddings), rope_theta %s, no rope scaling |" % (
            ctx, cfg["rope_theta"]),
        "| seed | %d |" % args.seed,
        "| steps | %d x batch %d x %d tokens = %d tokens (%.1f epochs of the training split) |" % (
            steps, args.batch, ctx, tokens_seen, tokens_seen / n_train),
        "| optimizer | AdamW lr %g, betas (0.9, 0.95), weight decay %g on matrices, warmup %d, "
        "cosine to %g x lr, grad clip 1.0, float32 |" % (
            args.lr, args.weight_decay, args.warmup, args.min_lr_ratio),
        "| router bias | auxiliary-loss-free balancing: after every step bias_i += %g * sign(mean load -"
        " load_i) per MoE layer; no auxiliary loss |" % args.bias_gamma,
        "| wall time | training %.0f s (%.1f min), whole run %.0f s, torch.set_num_threads(%d) on a "
        "2-core machine shared with ~16 compiler processes |" % (train_time, train_time / 60, wall, args.threads),
        "| final train loss | %.4f nats/token (mean of the last 50 batches, f32 weights) |" % train_loss,
        "| **validation loss** | **%.4f nats/token** (perplexity %.3f) with the bf16 weights; "
        "f32 weights before conversion: %.4f |" % (val_bf16, math.exp(val_bf16), val_f32),
    ]
    if mtp:
        lines[11:11] = [
            "| MTP layer | 1 (`num_nextn_predict_layers: 1`, layer index %d): enorm, hnorm, eh_proj, "
            "one MoE decoder layer, shared_head.norm; %d parameters of its own; embedding and output "
            "head shared with the main model in training, stored as copies |" % (
                cfg["num_hidden_layers"], mtp["parameters"])]
        lines += [
            "| MTP loss | DeepSeek-V3's (report section 2.2), depth 1: L = L_main + %g * L_MTP, L_MTP "
            "the cross-entropy of t_{i+2} from MTP(h_i, emb(t_{i+1})); last 50 batches %.4f |" % (
                mtp["loss_weight_lambda"], mtp["train_loss_last50_f32"]),
            "| MTP validation | loss %.4f nats/token (bf16; f32 %.4f), top-1 %.4f; the main model's "
            "top-1 for the same t_{i+2} (from position i+1) %.4f |" % (
                mtp["val_loss_bf16_nats_per_token"], mtp["val_loss_f32_nats_per_token"],
                mtp["val_top1_bf16"], mtp["val_main_top1_of_next_next_bf16"]),
            "| **MTP greedy acceptance** | **%.4f** on the validation text (bf16; f32 %.4f): at %d "
            "positions, MTP's argmax for t_{i+2} equals the main model's argmax at i+1 |" % (
                mtp["val_acceptance_bf16"], mtp["val_acceptance_f32"], mtp["positions"]),
        ]
    lines += [
        "",
        "## Command",
        "",
        "```",
        cmd,
        "```",
        "",
        "Deterministic for a given seed on the same torch build and thread count (data order comes from",
        "numpy RandomState(seed), weights from torch.Generator(seed)).",
        "",
        "## How the validation loss is measured (to reproduce in the engine)",
        "",
        "- Text: ../shared/data/corpus/tinyshakespeare.txt; the first %d characters (bytes; the file is"
        % split,
        "  ASCII) are the training split, the rest (%d bytes, starting at the beginning of a line) is"
        % (len(open(args.corpus, "rb").read()) - split),
        "  the validation text. The tokenizer was trained on the training split only.",
        "- Tokenization: the validation text is encoded as a whole with this tokenizer.json, with the",
        "  post-processor's single BOS (`%s`, id %d) in front and no EOS: %d ids in all." % (
            bpe.BOS, tok.bos_id, n_val),
        "- Windows: ids[0:%d], ids[%d:%d], ... (context %d, stride %d, no overlap); the last, shorter"
        % (ctx, ctx, 2 * ctx, ctx, ctx),
        "  window counts when it has at least 2 ids. Each window is an independent sequence starting",
        "  at position 0 (only the first window starts with BOS). Inside a window every id except the",
        "  first is predicted from the ids before it in that window: %d predictions." % n_pred,
        "- Loss = sum of -log softmax(logits)[target] over all predictions / number of predictions",
        "  (natural log). Weights: the bf16 model.safetensors, computed in float32.",
        "- Engine: `deepharness perplexity --model-path models/shakespeare-v3 --file VAL --context %d "
        "--stride %d`" % (ctx, ctx),
        "  where VAL is the validation text, e.g. `tail -c +%d tinyshakespeare.txt > VAL`." % (split + 1),
        "- eval.json holds the same numbers in machine-readable form, plus the greedy samples below.",
        "",
        "## Greedy samples (bf16 weights, %d new tokens, prompt encoded with BOS)" % args.sample_tokens,
        "",
        "The smallest gap between the best and second-best logit over each sample's steps is given, so",
        "a test knows how much numerical slack the sample has. eval.json lists the gap at every step",
        "(`top2_logit_margins`); a test should compare greedy ids only up to the first step whose gap",
        "is below its numerical tolerance, or compare against the engine's own committed output.",
        "",
    ]
    for s in samples:
        accepted = ""
        if "mtp_greedy_drafted" in s:
            accepted = "; MTP drafts accepted %d of %d" % (s["mtp_greedy_accepted"],
                                                          s["mtp_greedy_drafted"])
        lines += ["Prompt %s (ids %s), min top-2 margin %.3f%s:" % (json.dumps(s["prompt"]),
                                                                    s["prompt_ids"],
                                                                    s["min_top2_logit_margin"],
                                                                    accepted),
                  "", "```", s["prompt"] + s["text"], "```", ""]
    lines += ["## Files", "",
              "config.json, model.safetensors (bf16; e_score_correction_bias f32), tokenizer.json,",
              "tokenizer_config.json (chat template in DeepSeek's style), generation_config.json,",
              "eval.json, train_log.txt. The tokenizer and this model are produced by",
              "pytorch/train_tiny/train_tokenizer.py and pytorch/train_tiny/train.py.", ""]
    with open(os.path.join(args.out, "MODEL.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
