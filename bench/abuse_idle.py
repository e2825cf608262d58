#!/usr/bin/env python3
"""Idle keep-alive and slow-client abuse against a running `deepharness serve` (issue 20).

Opens N keep-alive connections (each does one GET /health and then stays idle, as an SDK's
connection pool does), optionally M "slow" clients that trickle header bytes (one a second) and
S that start a stream and never read it (small receive buffer, large events: the server's
writes block), then measures GET /health latency on fresh connections and sends completions
while all of those are open. Afterwards it checks that idle connections still answer, and
waits --slow-wait seconds for the server to drop the slow clients (its read timeout). Prints
p50/p99/max of /health, completion latencies, the server's threads and RSS (--pid), and exits
1 when a check fails: /health p99 >= --p99-limit-ms, a failed probe or completion, an idle
connection that no longer answers, or an unread stream that was not accepted with 200.

  python3 bench/abuse_idle.py --port 8000 --idle 2000 --slow 50 --unread-streams 8 --probes 200

Standard library only. Raises its own open-file limit to the hard limit; that must allow
N + M + S sockets (ulimit -Hn), and the server's likewise.
"""
import argparse
import json
import resource
import socket
import statistics
import sys
import threading
import time


def connect(host, port):
    s = socket.create_connection((host, port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(s):
    """Reads one HTTP/1.1 response with Content-Length; returns (status, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, rest[:length]


def request(s, method, path, body=None):
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    payload = b""
    if body is not None:
        payload = json.dumps(body).encode()
        head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
    s.sendall(head.encode() + b"\r\n" + payload)
    return read_response(s)


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "Threads"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def pct(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--pid", type=int, help="server pid: report its threads and RSS")
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--slow", type=int, default=0, help="clients trickling header bytes")
    ap.add_argument("--unread-streams", type=int, default=0, help="streams never read")
    ap.add_argument("--unread-max-tokens", type=int, default=200,
                    help="max_tokens of each unread stream (must fit the model's context)")
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--completions", type=int, default=8)
    ap.add_argument("--p99-limit-ms", type=float, default=100.0)
    ap.add_argument("--slow-wait", type=float, default=0,
                    help="seconds to wait at the end for the server to close the slow clients")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    failed = []

    t0 = time.time()
    idle = []
    for i in range(a.idle):
        s = connect(a.host, a.port)
        status, _ = request(s, "GET", "/health")
        if status != 200:
            raise SystemExit(f"idle connection {i}: /health {status}")
        idle.append(s)
    print(f"opened {len(idle)} idle keep-alive connections in {time.time() - t0:.1f} s")

    stop = threading.Event()
    slow = []
    slow_closed = {}  # index -> seconds after the first header byte
    slow_t0 = time.time()
    for _ in range(a.slow):
        s = connect(a.host, a.port)
        s.sendall(b"GET /health HTTP/1.1\r\n")
        slow.append(s)

    def trickle():
        while not stop.is_set():
            for i, s in enumerate(slow):
                if i in slow_closed:
                    continue
                try:
                    s.sendall(b"X")
                except OSError:
                    slow_closed[i] = time.time() - slow_t0
            stop.wait(1.0)

    threading.Thread(target=trickle, daemon=True).start()

    models = json.loads(request(connect(a.host, a.port), "GET", "/v1/models")[1])
    model = models["data"][0]["id"]
    unread = []
    unread_ok = 0
    for _ in range(a.unread_streams):
        s = connect(a.host, a.port)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # n=4 with 5 logprobs per token: hundreds of KB of events, more than both socket
        # buffers hold, so the server's writes block.
        body = json.dumps({"model": model, "prompt": "a", "max_tokens": a.unread_max_tokens,
                           "n": 4, "stream": True, "ignore_eos": True,
                           "logprobs": 5}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                  b"\r\n\r\n" + body)
        # Read the status line only, then never again.
        head = s.recv(12)
        unread_ok += head.startswith(b"HTTP/1.1 200")
        unread.append(s)
    if a.unread_streams:
        print(f"unread streams: {unread_ok}/{a.unread_streams} accepted with 200")
        if unread_ok != a.unread_streams:
            failed.append("unread streams not accepted")
        time.sleep(1.0)  # let their writes fill the buffers and block
    st = proc_status(a.pid) if a.pid else {}
    if st:
        print(f"server: {st.get('Threads')} threads, RSS {st.get('VmRSS', 0) / 1024:.1f} MiB")

    lat = []
    failures = 0
    for _ in range(a.probes):
        t = time.perf_counter()
        try:
            s = connect(a.host, a.port)
            status, _ = request(s, "GET", "/health")
            s.close()
            if status != 200:
                failures += 1
        except OSError:
            failures += 1
        lat.append((time.perf_counter() - t) * 1000)
    lat.sort()
    p99 = pct(lat, 0.99)
    print(f"/health on new connections: n={len(lat)} failures={failures} "
          f"p50={statistics.median(lat):.2f} ms p99={p99:.2f} ms max={lat[-1]:.2f} ms")
    if failures:
        failed.append("/health failures")
    if p99 >= a.p99_limit_ms:
        failed.append(f"/health p99 {p99:.1f} ms >= {a.p99_limit_ms} ms")

    ok = 0
    clat = []
    for _ in range(a.completions):
        t = time.perf_counter()
        try:
            s = connect(a.host, a.port)
            status, body = request(s, "POST", "/v1/completions",
                                   {"model": model, "prompt": "ROMEO:", "max_tokens": 16})
            s.close()
            ok += status == 200
        except OSError:
            pass
        clat.append((time.perf_counter() - t) * 1000)
    clat.sort()
    print(f"completions (16 tokens) while the above are open: {ok}/{a.completions} ok, "
          f"p50 {statistics.median(clat):.1f} ms, max {clat[-1]:.1f} ms")
    if ok != a.completions:
        failed.append("completion failures")
    # The idle connections are still usable (a sample of them spread over the whole set).
    sample = idle[:: max(1, len(idle) // 20)]
    alive = 0
    for s in sample:
        try:
            alive += request(s, "GET", "/health")[0] == 200
        except OSError:
            pass
    print(f"idle connections still answering: {alive}/{len(sample)} sampled")
    if alive != len(sample):
        failed.append("idle connections dropped")
    if a.slow and a.slow_wait > 0:
        end = slow_t0 + a.slow_wait
        while time.time() < end and len(slow_closed) < len(slow):
            time.sleep(0.5)
        times = sorted(slow_closed.values())
        print(f"slow clients closed by the server: {len(times)}/{len(slow)} within "
              f"{a.slow_wait:.0f} s of their first byte" +
              (f" (first {times[0]:.1f} s, last {times[-1]:.1f} s)" if times else ""))
    st = proc_status(a.pid) if a.pid else {}
    if st:
        print(f"server at the end: {st.get('Threads')} threads, "
              f"RSS {st.get('VmRSS', 0) / 1024:.1f} MiB")
    stop.set()
    for s in idle + slow + unread:
        s.close()
    if failed:
        print("FAILED: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
