#!/usr/bin/env python3
"""The all-reduce's share of a forward step, from rank 0's trace of a tensor-parallel run
(`deepharness bench ... --tp-size N --trace-out FILE.json`, written by rank 0 to FILE.json).
For decode steps (forward spans of 1 token) and prefill steps (more tokens) separately: the
steps, their mean duration, the all-reduce calls per step and their mean/median duration, and
the share of the step spent in them. The logits gather is not a span of its own; bench's
`collectives (rank 0 of N)` line counts it with the rest. Usage: tp_trace_share.py FILE.json"""
import json
import statistics
import sys


def main():
  events = json.load(open(sys.argv[1]))
  if isinstance(events, dict):
    events = events.get("traceEvents", [])
  forwards = [e for e in events if e.get("name") == "forward" and e.get("ph") == "X"]
  reduces = [e for e in events if e.get("name") == "all_reduce" and e.get("ph") == "X"]
  reduces.sort(key=lambda e: e["ts"])
  for label, pick in (("decode (1 token)", lambda n: n == 1), ("prefill", lambda n: n > 1)):
    steps = [f for f in forwards if pick(int(f.get("args", {}).get("tokens", 0)))]
    if not steps:
      continue
    inside = []  # (duration µs, bytes) of the all-reduces inside each step
    for f in steps:
      t0, t1 = f["ts"], f["ts"] + f["dur"]
      inside.append([(r["dur"], int(r.get("args", {}).get("bytes", 0))) for r in reduces
                     if r.get("tid") == f.get("tid") and t0 <= r["ts"] <= t1])
    durs = [d for step in inside for d, _ in step]
    sizes = sorted({b for step in inside for _, b in step})
    if not durs:
      print(f"{label}: {len(steps)} steps, no all-reduce inside them")
      continue
    step_us = statistics.mean(f["dur"] for f in steps)
    share = sum(durs) / sum(f["dur"] for f in steps)
    print(f"{label}: {len(steps)} steps of {step_us:.0f} µs mean; {len(durs) / len(steps):.0f} "
          f"all-reduces per step of {'/'.join(str(b) for b in sizes[:3])}{'...' if len(sizes) > 3 else ''} B, "
          f"{statistics.mean(durs):.1f} µs mean / {statistics.median(durs):.1f} µs median per call; "
          f"all-reduce share of the step {100 * share:.1f} %")

if __name__ == "__main__":
  main()
