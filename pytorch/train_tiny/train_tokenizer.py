#!/usr/bin/python3
"""Trains a byte-level BPE tokenizer on the first 90 % of tinyshakespeare and writes it as a Hugging
Face tokenizer.json + tokenizer_config.json in DeepSeek-V3's style (special tokens, chat template).

Usage: /usr/bin/python3 pytorch/train_tiny/train_tokenizer.py [--corpus F] [--out DIR] [--vocab-size N]
"""
import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

# Ids 0..2 are BOS/EOS/PAD (as in DeepSeek-V3), then the 256 byte symbols, then merges, then the
# chat role tokens at the end of the vocabulary.
LEADING_SPECIALS = [bpe.BOS, bpe.EOS, bpe.PAD]
TRAILING_SPECIALS = [bpe.USER, bpe.ASSISTANT]

CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<\uff5cUser\uff5c>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<\uff5cAssistant\uff5c>' + message['content'] + '<\uff5cend\u2581of\u2581sentence\uff5c>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<\uff5cAssistant\uff5c>' }}{% endif %}")


def split_corpus(text):
    """Returns the character offset where validation starts: the line start nearest 90 %."""
    cut = int(len(text) * 0.9)
    nl = text.rfind("\n", 0, cut)
    return nl + 1


def train_bpe(words, num_merges):
    """words: {byte-level string: count}. Returns the list of merges (pairs of strings) in rank order."""
    seqs = [list(w) for w in words]
    freqs = list(words.values())
    pair_counts = collections.Counter()
    where = collections.defaultdict(set)
    for wi, s in enumerate(seqs):
        for p in zip(s, s[1:]):
            pair_counts[p] += freqs[wi]
            where[p].add(wi)
    merges = []
    while len(merges) < num_merges and pair_counts:
        # Most frequent pair; ties broken by the smallest pair so results are deterministic.
        best = min(pair_counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]
        if pair_counts[best] < 2:
            break
        merges.append(best)
        a, b = best
        merged = a + b
        for wi in sorted(where[best]):
            s = seqs[wi]
            f = freqs[wi]
            for p in zip(s, s[1:]):
                pair_counts[p] -= f
                if pair_counts[p] == 0:
                    del pair_counts[p]
            out = []
            i = 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[wi] = out
            for p in zip(out, out[1:]):
                pair_counts[p] += f
                where[p].add(wi)
        del where[best]
        pair_counts.pop(best, None)
    return merges


def added_token(content, tid):
    return {"id": tid, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def build_tokenizer_json(merges):
    vocab = {}
    for t in LEADING_SPECIALS:
        vocab[t] = len(vocab)
    for b in range(256):
        vocab[bpe.BYTE_TO_CHAR[b]] = len(vocab)
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    for t in TRAILING_SPECIALS:
        vocab[t] = len(vocab)
    specials = LEADING_SPECIALS + TRAILING_SPECIALS
    bos_id = vocab[bpe.BOS]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added_token(t, vocab[t]) for t in specials],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": bpe.GPT2_PATTERN}, "behavior": "Isolated",
                 "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                 "use_regex": False},
            ],
        },
        "post_processor": {
            "type": "Sequence",
            "processors": [
                {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                 "use_regex": True},
                {"type": "TemplateProcessing",
                 "single": [{"SpecialToken": {"id": bpe.BOS, "type_id": 0}},
                            {"Sequence": {"id": "A", "type_id": 0}}],
                 "pair": [{"SpecialToken": {"id": bpe.BOS, "type_id": 0}},
                          {"Sequence": {"id": "A", "type_id": 0}},
                          {"SpecialToken": {"id": bpe.BOS, "type_id": 1}},
                          {"Sequence": {"id": "B", "type_id": 1}}],
                 "special_tokens": {bpe.BOS: {"id": bpe.BOS, "ids": [bos_id], "tokens": [bpe.BOS]}}},
            ],
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": ["%s %s" % (a, b) for a, b in merges],
        },
    }


def special_token_entry(content):
    return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True,
            "rstrip": False, "single_word": False}


def build_tokenizer_config(context):
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": special_token_entry(bpe.BOS),
        "eos_token": special_token_entry(bpe.EOS),
        "pad_token": special_token_entry(bpe.EOS),
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": context,
        "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=os.path.join(repo, "..", "shared", "data", "corpus",
                                                     "tinyshakespeare.txt"))
    ap.add_argument("--out", default=os.path.join(repo, "models", "shakespeare-v3"))
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--context", type=int, default=256, help="model_max_length to record")
    args = ap.parse_args()

    with open(args.corpus, encoding="utf-8") as f:
        text = f.read()
    split = split_corpus(text)
    t0 = time.time()
    words = collections.Counter(bpe.pretokenize(text[:split]))
    num_merges = args.vocab_size - len(LEADING_SPECIALS) - 256 - len(TRAILING_SPECIALS)
    merges = train_bpe(dict(sorted(words.items())), num_merges)
    tj = build_tokenizer_json(merges)
    n = len(tj["model"]["vocab"])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(build_tokenizer_config(args.context), f, ensure_ascii=False, indent=2)
        f.write("\n")
    tok = bpe.Tokenizer(os.path.join(args.out, "tokenizer.json"))
    train_ids = tok.encode(text[:split])
    val_ids = tok.encode(text[split:])
    assert tok.decode(train_ids) == text[:split] and tok.decode(val_ids) == text[split:]
    print("vocab %d (%d merges) in %.1fs; split at char %d; train %d tokens (%.2f chars/token), "
          "val %d tokens" % (n, len(merges), time.time() - t0, split, len(train_ids),
                             split / len(train_ids), len(val_ids)))


if __name__ == "__main__":
    main()
