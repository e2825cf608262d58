#!/usr/bin/env python3
"""Decode tokens/s with and without a structured-output constraint, against a running server.

Usage: bench/structured_decode.py [URL] [ROUNDS]   (default http://127.0.0.1:18555, 2 rounds)

Per case, 5 sequential /v1/chat/completions requests ("Speak", max_tokens 120, temperature 0.8,
seeds 0-4); prints completion tokens / summed request wall time. Cases: no constraint,
response_format json_object, and a strict json_schema (an object with two bounded strings).
Standard-library Python only.
"""
import json
import sys
import time
import urllib.request

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18555"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 2

SCHEMA = {
    "type": "object",
    "properties": {
        "speaker": {"type": "string", "maxLength": 20},
        "line": {"type": "string", "maxLength": 200},
    },
    "required": ["speaker", "line"],
    "additionalProperties": False,
}
CASES = [
    ("no constraint", {}),
    ("response_format: json_object", {"response_format": {"type": "json_object"}}),
    ("json_schema (object, 2 bounded strings, strict)",
     {"response_format": {"type": "json_schema",
                          "json_schema": {"name": "line", "strict": True, "schema": SCHEMA}}}),
]


def post(body):
    req = urllib.request.Request(URL + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


rows = {name: [] for name, _ in CASES}
tokens = {}
for _ in range(ROUNDS):
    for name, extra in CASES:
        n, wall = 0, 0.0
        for seed in range(5):
            body = {"messages": [{"role": "user", "content": "Speak"}], "max_tokens": 120,
                    "temperature": 0.8, "seed": seed, **extra}
            t0 = time.perf_counter()
            reply = post(body)
            wall += time.perf_counter() - t0
            n += reply["usage"]["completion_tokens"]
        tokens[name] = n
        rows[name].append(n / wall)
print("| case | tokens | " + " | ".join(f"round {i + 1} tok/s" for i in range(ROUNDS)) + " |")
print("| --- | ---: | " + " | ".join("---:" for _ in range(ROUNDS)) + " |")
for name, _ in CASES:
    print(f"| {name} | {tokens[name]} | " + " | ".join(f"{v:.0f}" for v in rows[name]) + " |")
