#!/usr/bin/env python3
"""Soak test for `deepharness serve` (issue 20, docs/reliability.md "Soak and abuse").

C client threads, each on its own keep-alive connection, send mixed traffic for D seconds:
chat and completions, streamed and not, n > 1, logprobs, a stream dropped after its first
chunk, /v1/models and /health, and malformed requests (which must get 400). Meanwhile the
server's resident memory (VmRSS of --pid, or of the server this script starts) is sampled every
5 s. At the end it waits for the KV pool to be back at free == total with nothing running or
waiting (from /metrics). Prints one JSON summary; exit 1 when a check fails:
  errors == 0, RSS after warm-up within +-5 % of its value at the end of warm-up,
  KV pool at rest within 30 s.

  build/deepharness serve --port 18800 --kv-cache-memory 256MiB &
  python3 bench/soak.py --port 18800 --pid $! --clients 64 --duration 600

or let it start the server:  python3 bench/soak.py --binary build/deepharness --duration 600
Standard library only.
"""
import argparse
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time


def rss_kib(pid):
    return proc_status(pid).get("VmRSS", 0)


def proc_status(pid):
    """VmRSS, RssAnon, RssFile (KiB) and Threads of /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                out[key] = int(value.split()[0])
    return out


def mappings(pid):
    """{(start, name): (size KiB, Rss KiB)} of /proc/PID/smaps (name: a path, [heap], [stack] or
    "anon"). Keyed by the start address: the heap and malloc's per-thread arenas grow at the end."""
    out, key, size = {}, None, 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(maxsplit=5)
            if "-" in first[0] and len(first) >= 5 and ":" not in first[0]:
                start, end = first[0].split("-")
                name = first[5].strip() if len(first) > 5 else "anon"
                key, size = (start, name), (int(end, 16) - int(start, 16)) // 1024
            elif line.startswith("Rss:") and key:
                out[key] = (size, int(line.split()[1]))
    return out


def rss_growth(before, after, top=8):
    """Where RSS grew between two mappings() snapshots: the largest deltas, and totals by kind
    (anonymous mappings of at least 1 MiB, smaller anonymous ones (thread stacks, malloc arenas'
    small heaps), [heap], files)."""
    deltas = []
    kinds = {}
    for key, (size_kib, rss) in after.items():
        start, name = key
        delta = rss - before.get(key, (0, 0))[1]
        if name == "anon":
            kind = "anon >= 1 MiB" if size_kib >= 1024 else "anon < 1 MiB"
        elif name.startswith("["):
            kind = name
        else:
            kind = "file"
        kinds[kind] = kinds.get(kind, 0) + delta
        deltas.append((delta, f"{start} {name} size {size_kib} KiB rss {rss} KiB"))
    for key, (_, rss) in before.items():  # unmapped since
        if key not in after:
            kinds["unmapped"] = kinds.get("unmapped", 0) - rss
    deltas.sort(reverse=True)
    return {"by_kind_kib": kinds,
            "largest_kib": [f"{d:+d} {what}" for d, what in deltas[:top]]}


def metrics(host, port):
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^[a-z_]+:([a-z_]+)(\{[^}]*\})? ([-0-9.e+]+)$", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = float(m.group(3))
    return out


class Client(threading.Thread):
    def __init__(self, idx, args, deadline, stats, lock):
        super().__init__(daemon=True)
        self.rng = random.Random(1000 + idx)
        self.args, self.deadline, self.stats, self.lock = args, deadline, stats, lock
        self.conn = None

    def connection(self):
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.args.host, self.args.port, timeout=120)
        return self.conn

    def count(self, kind, ok, detail=""):
        with self.lock:
            self.stats["requests"] += 1
            self.stats["by_kind"][kind] = self.stats["by_kind"].get(kind, 0) + 1
            if not ok:
                self.stats["errors"] += 1
                if len(self.stats["error_samples"]) < 10:
                    self.stats["error_samples"].append(f"{kind}: {detail}")

    def post(self, path, body, stream=False, drop_after_first=False):
        c = self.connection()
        c.request("POST", path, body=json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if not stream:
            data = r.read()
            return r.status, data
        if drop_after_first:
            r.readline()
            c.close()  # hang up mid-stream: the server must cancel and free the sequence
            self.conn = None
            return r.status, b""
        data = r.read()
        return r.status, data

    def one(self):
        rng, model = self.rng, self.args.model
        words = " ".join(rng.choice(["to", "be", "or", "not", "king", "love", "night", "sword"])
                         for _ in range(rng.randint(1, 60)))  # fits a 256-token context
        kind = rng.choices(["chat", "chat_stream", "completion_n2", "completion_stream",
                            "stream_dropped", "models", "bad_request"],
                           weights=[35, 25, 15, 10, 5, 5, 5])[0]
        max_tokens = rng.randint(1, 64)
        d = b""
        try:
            if kind == "chat":
                body = {"model": model, "messages": [{"role": "user", "content": words}],
                        "max_tokens": max_tokens, "temperature": rng.choice([0, 0.8])}
                if rng.random() < 0.3:
                    body.update(logprobs=True, top_logprobs=2)
                s, d = self.post("/v1/chat/completions", body)
                ok = s == 200 and json.loads(d)["choices"][0]["finish_reason"] in ("stop", "length")
            elif kind == "chat_stream":
                s, d = self.post("/v1/chat/completions", {
                    "model": model, "messages": [{"role": "user", "content": words}],
                    "max_tokens": max_tokens, "stream": True,
                    "stream_options": {"include_usage": True}}, stream=True)
                ok = s == 200 and d.rstrip().endswith(b"data: [DONE]")
            elif kind == "completion_n2":
                s, d = self.post("/v1/completions", {
                    "model": model, "prompt": words, "max_tokens": max_tokens, "n": 2,
                    "temperature": 0.9, "seed": rng.randint(0, 1000)})
                ok = s == 200 and len(json.loads(d)["choices"]) == 2
            elif kind == "completion_stream":
                s, d = self.post("/v1/completions", {
                    "model": model, "prompt": words, "max_tokens": max_tokens, "stream": True},
                    stream=True)
                ok = s == 200 and d.rstrip().endswith(b"data: [DONE]")
            elif kind == "stream_dropped":
                s, _ = self.post("/v1/chat/completions", {
                    "model": model, "messages": [{"role": "user", "content": words}],
                    "max_tokens": 64, "stream": True}, stream=True, drop_after_first=True)
                ok = s == 200
            elif kind == "models":
                c = self.connection()
                c.request("GET", rng.choice(["/v1/models", "/health"]))
                r = c.getresponse()
                r.read()
                s, ok = r.status, r.status == 200
            else:
                s, d = self.post("/v1/chat/completions", rng.choice([
                    {"model": model, "messages": "not a list"},
                    {"model": model, "messages": [{"role": "user", "content": "x"}],
                     "max_tokens": -3},
                    {"model": model, "prompt": 5}]))
                ok = s == 400 and "error" in json.loads(d)
            self.count(kind, ok, f"status {s} {d[:200]!r}")
        except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            self.count(kind, False, repr(e))

    def run(self):
        while time.monotonic() < self.deadline:
            self.one()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=18800)
    ap.add_argument("--pid", type=int, help="server pid (for VmRSS); default: the one started")
    ap.add_argument("--binary", help="start `BINARY serve --port PORT` with --server-args")
    ap.add_argument("--server-args", default="")
    ap.add_argument("--model", default="", help="model name (default: the first served)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--warmup", type=float, default=0.2, help="fraction of the run")
    args = ap.parse_args()

    server = None
    if args.binary:
        server = subprocess.Popen([args.binary, "serve", "--port", str(args.port)] +
                                  args.server_args.split(), stderr=subprocess.DEVNULL)
        args.pid = server.pid
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection(args.host, args.port, timeout=5)
                c.request("GET", "/v1/models")
                r = c.getresponse()
                body = r.read()
                if r.status == 200:
                    if not args.model:
                        args.model = json.loads(body)["data"][0]["id"]
                    break
            except OSError:
                pass
            time.sleep(0.5)
        stats = {"requests": 0, "errors": 0, "by_kind": {}, "error_samples": []}
        lock = threading.Lock()
        start = time.monotonic()
        deadline = start + args.duration
        clients = [Client(i, args, deadline, stats, lock) for i in range(args.clients)]
        for c in clients:
            c.start()
        samples = []  # (seconds, rss KiB, requests so far, RssAnon KiB, RssFile KiB, threads)
        warm_maps = None
        while any(c.is_alive() for c in clients):
            if args.pid:
                now = time.monotonic() - start
                st = proc_status(args.pid)
                samples.append((round(now, 1), st.get("VmRSS", 0), stats["requests"],
                                st.get("RssAnon", 0), st.get("RssFile", 0), st.get("Threads", 0)))
                if warm_maps is None and now >= args.warmup * args.duration:
                    warm_maps = mappings(args.pid)
            time.sleep(5)
        end_maps = mappings(args.pid) if args.pid else None
        for c in clients:
            c.join()
        elapsed = time.monotonic() - start
        # The pool must come back: nothing running or waiting, every block free.
        rest, m = False, {}
        for _ in range(60):
            m = metrics(args.host, args.port)
            if (m.get("num_requests_running") == 0 and m.get("num_requests_waiting") == 0 and
                    m.get("kv_cache_blocks_free") == m.get("kv_cache_blocks_total")):
                rest = True
                break
            time.sleep(0.5)
        warm = [s for s in samples if s[0] >= args.warmup * args.duration]
        rss = {}
        flat = True
        if warm:
            base = warm[0][1]
            lo, hi = min(s[1] for s in warm), max(s[1] for s in warm)
            rss = {"at_warmup_end_mib": round(base / 1024, 1), "min_after_mib": round(lo / 1024, 1),
                   "max_after_mib": round(hi / 1024, 1),
                   "max_deviation_pct": round(100 * max(hi - base, base - lo) / base, 2),
                   "first_sample_mib": round(samples[0][1] / 1024, 1)}
            flat = rss["max_deviation_pct"] <= 5.0
        summary = {
            "clients": args.clients, "duration_s": round(elapsed, 1),
            "requests": stats["requests"], "errors": stats["errors"],
            "req_per_s": round(stats["requests"] / elapsed, 2), "by_kind": stats["by_kind"],
            "error_samples": stats["error_samples"], "rss": rss, "rss_flat_5pct": flat,
            "kv_pool_at_rest": rest,
            "kv_blocks": {"free": m.get("kv_cache_blocks_free"),
                          "total": m.get("kv_cache_blocks_total")},
            "rss_growth_after_warmup": (rss_growth(warm_maps, end_maps)
                                        if warm_maps and end_maps else None),
            "rss_samples": samples,
        }
        print(json.dumps(summary, indent=1))
        return 0 if stats["errors"] == 0 and flat and rest else 1
    finally:
        if server:
            server.terminate()
            server.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
