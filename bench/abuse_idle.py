#!/usr/bin/env python3
"""Idle keep-alive and slow-client abuse against a running `deepharness serve` (issue 20).

Opens N keep-alive connections (each does one GET /health and then stays idle, as an SDK's
connection pool does), optionally M "slow" clients that trickle header bytes and S that start a
stream and never read it, then measures GET /health latency on fresh connections and sends a
few completions. Prints p50/p99/max of /health and the completion results.

  python3 bench/abuse_idle.py --port 8000 --idle 2000 --slow 50 --unread-streams 8 --probes 200

Standard library only. The open-file limit must allow N + M + S sockets (ulimit -n).
"""
import argparse
import json
import socket
import statistics
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--slow", type=int, default=0, help="clients trickling header bytes")
    ap.add_argument("--unread-streams", type=int, default=0, help="streams never read")
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--completions", type=int, default=8)
    a = ap.parse_args()

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
    for _ in range(a.slow):
        s = connect(a.host, a.port)
        s.sendall(b"GET /health HTTP/1.1\r\n")
        slow.append(s)

    def trickle():
        while not stop.is_set():
            for s in slow:
                try:
                    s.sendall(b"X")
                except OSError:
                    pass
            stop.wait(1.0)

    threading.Thread(target=trickle, daemon=True).start()

    models = json.loads(request(connect(a.host, a.port), "GET", "/v1/models")[1])
    model = models["data"][0]["id"]
    unread = []
    for _ in range(a.unread_streams):
        s = connect(a.host, a.port)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = json.dumps({"model": model, "prompt": "a", "max_tokens": 100000 // 100,
                           "stream": True, "ignore_eos": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                  b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                  b"\r\n\r\n" + body)
        unread.append(s)

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
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    print(f"/health on new connections: n={len(lat)} failures={failures} "
          f"p50={statistics.median(lat):.2f} ms p99={p99:.2f} ms max={lat[-1]:.2f} ms")

    ok = 0
    t = time.perf_counter()
    for _ in range(a.completions):
        s = connect(a.host, a.port)
        status, body = request(s, "POST", "/v1/completions",
                               {"model": model, "prompt": "ROMEO:", "max_tokens": 16})
        s.close()
        ok += status == 200
    print(f"completions: {ok}/{a.completions} ok in {time.perf_counter() - t:.2f} s")
    # The idle connections are still usable.
    status, _ = request(idle[0], "GET", "/health")
    print(f"first idle connection still answers: {status}")
    stop.set()
    for s in idle + slow + unread:
        s.close()


if __name__ == "__main__":
    main()
