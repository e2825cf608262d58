#!/usr/bin/env python3
"""Idle keep-alive and slow-client abuse against a running `deepharness serve` (issue 20).

Opens N keep-alive connections (each does one GET /health and then stays idle, as an SDK's
connection pool does; opened in batches of 100 so opening takes seconds, not minutes), M "slow"
clients that trickle header bytes (one a second) and S streams that are never read (a 4 KiB
receive buffer and ~370 KB of events each, more than the server's 256 KiB send buffer: the
server's writes block), then measures GET /health latency on fresh connections and sends
completions while all of those are open. Then it checks:

* idle connections still answer — only those idle for less than the server's keep-alive timeout
  (--server-keep-alive, what `serve --keep-alive-timeout` was given); older ones are closed by
  design. When none is young enough the check fails as "not meaningful" (run the server with a
  longer --keep-alive-timeout);
* every slow client was answered 408 and closed within --slow-wait seconds of its first byte
  (default: --server-read-timeout + 10), seen by reading the socket, not by a failing send;
* every unread stream was cut by the server (EOF without `data: [DONE]`) once
  --server-write-timeout has passed.

Prints p50/p99/max of /health, each completion's latency with the engine queue (running/waiting
from /metrics) when the first was sent, the server's threads and RSS (--pid), and exits 1 when
a check fails: /health p99 >= --p99-limit-ms, a failed probe or completion, an idle connection
that no longer answers, a slow client not closed, an unread stream not accepted or not cut.

  deepharness serve --port 8000 --max-num-seqs 16 --keep-alive-timeout 300 --write-timeout 10 &
  python3 bench/abuse_idle.py --port 8000 --idle 2000 --slow 50 --unread-streams 8 --probes 200 \
      --server-keep-alive 300 --server-write-timeout 10

Standard library only. Raises its own open-file limit to the hard limit; that must allow
N + M + S sockets (ulimit -Hn), and the server's likewise.
"""
import argparse
import json
import resource
import select
import socket
import statistics
import sys
import threading
import time


def connect(host, port, timeout=30):
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def engine_queue(host, port):
    """(running, waiting) from /metrics, or None."""
    try:
        s = connect(host, port, timeout=10)
        status, body = request(s, "GET", "/metrics")
        s.close()
    except OSError:
        return None
    running = waiting = None
    for line in body.decode("utf-8", "replace").splitlines():
        if ":num_requests_running{" in line:
            running = float(line.split()[-1])
        elif ":num_requests_waiting{" in line:
            waiting = float(line.split()[-1])
    return running, waiting


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
    ap.add_argument("--slow-wait", type=float, default=None,
                    help="seconds after its first byte by which every slow client must have been "
                         "answered 408 and closed (default: --server-read-timeout + 10)")
    ap.add_argument("--server-keep-alive", type=float, default=30,
                    help="the server's --keep-alive-timeout (default 30)")
    ap.add_argument("--server-read-timeout", type=float, default=30,
                    help="the server's --read-timeout (default 30)")
    ap.add_argument("--server-write-timeout", type=float, default=60,
                    help="the server's --write-timeout (default 60)")
    ap.add_argument("--completion-timeout", type=float, default=120,
                    help="client timeout of each completion (default 120 s)")
    a = ap.parse_args()
    if a.slow_wait is None:
        a.slow_wait = a.server_read_timeout + 10
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    failed = []

    # Idle connections, in batches: connect, send every request, then read every answer (one
    # connection at a time took 30 ms each on a loaded machine: 2,000 needed 60 s, longer than
    # the keep-alive timeout, and the idle check said nothing).
    t0 = time.time()
    idle = []      # sockets
    last_use = []  # time of each one's last answer
    for start in range(0, a.idle, 100):
        batch = [connect(a.host, a.port) for _ in range(min(100, a.idle - start))]
        req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        for s in batch:
            s.sendall(req)
        for i, s in enumerate(batch):
            status, _ = read_response(s)
            if status != 200:
                raise SystemExit(f"idle connection {start + i}: /health {status}")
            idle.append(s)
            last_use.append(time.time())
    open_s = time.time() - t0
    print(f"opened {len(idle)} idle keep-alive connections in {open_s:.1f} s "
          f"(server keep-alive {a.server_keep_alive:.0f} s)")

    stop = threading.Event()
    slow = []
    slow_first = []     # time of each one's first byte
    slow_closed = {}    # index -> seconds from its first byte to the server's close
    slow_status = {}    # index -> status line the server sent before closing
    for _ in range(a.slow):
        s = connect(a.host, a.port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow.append(s)
        slow_first.append(time.time())

    def trickle():
        got = {}
        while not stop.is_set():
            # poll, not select: these descriptors are above select's 1024 limit.
            poller = select.poll()
            for i, s in enumerate(slow):
                if i not in slow_closed:
                    poller.register(s, select.POLLIN)
            readable = {fd for fd, _ in poller.poll(0)}
            for i, s in enumerate(slow):
                if i in slow_closed:
                    continue
                if s.fileno() in readable:
                    try:
                        data = s.recv(65536)
                    except OSError:
                        data = b""
                    if data:
                        got[i] = got.get(i, b"") + data
                        continue
                    slow_closed[i] = time.time() - slow_first[i]
                    slow_status[i] = got.get(i, b"").split(b"\r\n", 1)[0].decode("latin-1")
                    continue
                try:
                    s.sendall(b"X")
                except OSError:
                    pass  # the close shows up as EOF or a reset on the next recv
            stop.wait(1.0)

    threading.Thread(target=trickle, daemon=True).start()

    models = json.loads(request(connect(a.host, a.port), "GET", "/v1/models")[1])
    model = models["data"][0]["id"]
    unread = []
    unread_ok = 0
    unread_t0 = time.time()
    for _ in range(a.unread_streams):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: small window
        s.settimeout(30)
        s.connect((a.host, a.port))
        # n=4 with 5 logprobs per token: ~370 KB of events, more than both socket buffers
        # hold (the server's is 256 KiB), so the server's writes block.
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
    queue = engine_queue(a.host, a.port)
    for _ in range(a.completions):
        t = time.perf_counter()
        try:
            s = connect(a.host, a.port, timeout=a.completion_timeout)
            status, body = request(s, "POST", "/v1/completions",
                                   {"model": model, "prompt": "ROMEO:", "max_tokens": 16})
            s.close()
            ok += status == 200
        except OSError:
            pass
        clat.append((time.perf_counter() - t) * 1000)
    print(f"completions (16 tokens) while the above are open: {ok}/{a.completions} ok, "
          f"in order: {', '.join(f'{x:.0f}' for x in clat)} ms; engine when the first was sent: "
          + (f"{queue[0]:.0f} running, {queue[1]:.0f} waiting" if queue else "unknown"))
    if ok != a.completions:
        failed.append("completion failures")
    # The idle connections are still usable: a sample spread over the whole set, of those idle
    # for less than the keep-alive timeout (minus 2 s of margin).
    now = time.time()
    young = [i for i in range(len(idle)) if now - last_use[i] < a.server_keep_alive - 2]
    sample = young[:: max(1, len(young) // 20)]
    alive = 0
    for i in sample:
        try:
            alive += request(idle[i], "GET", "/health")[0] == 200
        except OSError:
            pass
    print(f"idle connections still answering: {alive}/{len(sample)} sampled of {len(young)} "
          f"idle for less than the keep-alive timeout ({now - last_use[-1]:.0f}-"
          f"{now - last_use[0]:.0f} s idle)" if idle else "no idle connections")
    if idle and not sample:
        failed.append("idle check not meaningful: every idle connection is older than the "
                      "keep-alive timeout (run the server with a longer --keep-alive-timeout)")
    elif alive != len(sample):
        failed.append("idle connections dropped")
    if a.slow:
        end = min(slow_first) + a.slow_wait
        while time.time() < end and len(slow_closed) < len(slow):
            time.sleep(0.5)
        times = sorted(slow_closed.values())
        statuses = {}
        for v in slow_status.values():
            statuses[v or "(nothing)"] = statuses.get(v or "(nothing)", 0) + 1
        print(f"slow clients closed by the server: {len(times)}/{len(slow)} within "
              f"{a.slow_wait:.0f} s of their first byte" +
              (f" (first {times[0]:.1f} s, last {times[-1]:.1f} s; answers: {statuses})"
               if times else ""))
        if len(times) != len(slow) or times[-1] > a.slow_wait:
            failed.append("slow clients not closed")
    if unread:
        # Past the write timeout, each unread stream must have been cut: what the buffers hold,
        # then EOF, and no [DONE].
        wait = unread_t0 + a.server_write_timeout + 5 - time.time()
        if wait > 0:
            time.sleep(wait)
        cut = 0
        for s in unread:
            got = b""
            eof = False
            s.settimeout(10)
            try:
                while True:
                    data = s.recv(65536)
                    if not data:
                        eof = True
                        break
                    got += data
            except OSError:
                pass
            cut += eof and b"[DONE]" not in got
        print(f"unread streams cut by the server after its write timeout: {cut}/{len(unread)}")
        if cut != len(unread):
            failed.append("unread streams not cut")
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
