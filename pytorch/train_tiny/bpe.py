"""Byte-level BPE helpers shared by the tiny-model trainer: the GPT-2 byte<->unicode map, the GPT-2
pre-tokenizer (ASCII-exact), and an encoder/decoder that reads a Hugging Face tokenizer.json and applies
merges by rank exactly like the `tokenizers` library's BPE model (no dropout, no ignore_merges).
"""
import json
import re

# Names of the special tokens, spelled as DeepSeek-V3 spells them (U+FF5C fullwidth bar, U+2581).
BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
PAD = "<\uff5c\u2581pad\u2581\uff5c>"
USER = "<\uff5cUser\uff5c>"
ASSISTANT = "<\uff5cAssistant\uff5c>"

# The GPT-2 pre-tokenizer pattern as written in tokenizer.json (PCRE/Oniguruma syntax).
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# The same pattern for Python's `re` (no \p classes): exact on ASCII text, which is all we feed it.
_ASCII_PATTERN = re.compile(
    r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")
_ALLOWED = set(chr(c) for c in range(0x20, 0x7F)) | {"\n", "\t"}


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def pretokenize(text):
    """Splits text into GPT-2 pre-tokens and maps each to its byte-level string."""
    bad = set(text) - _ALLOWED
    if bad:
        raise ValueError("pretokenize: only printable ASCII, tab and newline are supported, got %r"
                         % sorted(bad)[:10])
    return ["".join(BYTE_TO_CHAR[b] for b in piece.encode("utf-8"))
            for piece in _ASCII_PATTERN.findall(text)]


class Tokenizer:
    """Encoder/decoder over a tokenizer.json written by train_tokenizer.py."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        model = tj["model"]
        assert model["type"] == "BPE"
        self.vocab = dict(model["vocab"])
        for tok in tj["added_tokens"]:
            self.vocab[tok["content"]] = tok["id"]
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        self.special = {t["content"]: t["id"] for t in tj["added_tokens"] if t["special"]}
        # pair of ids -> (rank, merged id)
        self.merges = {}
        for rank, m in enumerate(model["merges"]):
            a, b = m.split(" ") if isinstance(m, str) else m
            self.merges[(self.vocab[a], self.vocab[b])] = (rank, self.vocab[a + b])
        self.bos_id = self.vocab[BOS]
        self.eos_id = self.vocab[EOS]
        self._cache = {}

    def _encode_word(self, word):
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        ids = [self.vocab[c] for c in word]
        # Repeatedly merge the adjacent pair of lowest rank (leftmost on ties), as HF's Word::merge_all.
        while len(ids) > 1:
            best = None
            for i in range(len(ids) - 1):
                m = self.merges.get((ids[i], ids[i + 1]))
                if m is not None and (best is None or m[0] < best[0]):
                    best = (m[0], i, m[1])
            if best is None:
                break
            _, i, new_id = best
            ids[i:i + 2] = [new_id]
        self._cache[word] = ids
        return ids

    def encode(self, text, add_bos=True):
        """Encodes plain text (no special-token parsing), with the BOS the post-processor adds."""
        out = [self.bos_id] if add_bos else []
        for word in pretokenize(text):
            out.extend(self._encode_word(word))
        return out

    def decode(self, ids, skip_special=True):
        pieces = []
        for i in ids:
            tok = self.id_to_token[i]
            if tok in self.special:
                if not skip_special:
                    pieces.append(tok.encode("utf-8"))
                continue
            pieces.append(bytes(CHAR_TO_BYTE[c] for c in tok))
        return b"".join(pieces).decode("utf-8", errors="replace")
