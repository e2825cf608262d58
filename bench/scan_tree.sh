#!/bin/sh
# Scan throughput: generates a tree of N files (default 10,000; Python, C++/CUDA, CMake,
# requirements, Dockerfiles, YAML, shell, in the proportions of a typical service repository,
# about 1 in 10 with CUDA lock-in) and times `deepharness scan` over it (files/s and MB/s; the
# first, cold-cache run is discarded).
# Usage: bench/scan_tree.sh [BINARY] [N] [JOBS]
set -eu
BIN=${1:-build/deepharness}
N=${2:-10000}
JOBS=${3:-0}
DIR=$(mktemp -d /tmp/dh_scan_tree.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
python3 - "$DIR" "$N" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(1234)
py_clean = '''import os
import numpy as np

def step_{i}(x, y):
    """Adds two arrays; a docstring that mentions torch.cuda.synchronize() is not code."""
    # model.cuda() in a comment is not code either
    z = np.add(x, y)
    for k in range({k}):
        z = z * 0.5 + k
    return {{"value": z, "name": "step_{i}"}}
'''
py_cuda = '''import torch as T
from torch.cuda import amp

def run_{i}(model, x):
    model = model.cuda()
    with amp.autocast():
        y = model(x.to("cuda:0"))
    T.cuda.synchronize()
    return y
'''
cc = '''#include <vector>
// cudaMalloc in a comment
namespace app {{
int Sum_{i}(const std::vector<int>& v) {{
  int s = 0;
  for (int x : v) s += x * {k};
  return s;
}}
}}  // namespace app
'''
cu = '''#include <cuda_runtime.h>
__global__ void k_{i}(float* x) {{ x[threadIdx.x] *= {k}; }}
void launch_{i}(float* x) {{ k_{i}<<<1, 32>>>(x); cudaDeviceSynchronize(); }}
'''
kinds = ([("py", 50)] + [("cc", 20)] + [("h", 8)] + [("cu", 3)] + [("yaml", 7)] + [("sh", 5)] +
         [("cmake", 3)] + [("req", 2)] + [("docker", 2)])
pool = [k for k, w in kinds for _ in range(w)]
for i in range(n):
    kind = pool[i % len(pool)]
    d = os.path.join(root, "pkg%03d" % (i // 100), "sub%d" % (i % 5))
    os.makedirs(d, exist_ok=True)
    k = rng.randint(1, 9)
    cuda = rng.random() < 0.1
    reps = rng.randint(2, 12)
    if kind == "py":
        body = (py_cuda if cuda else py_clean).format(i=i, k=k)
        name, text = "m%d.py" % i, body * reps
    elif kind in ("cc", "h"):
        name, text = "f%d.%s" % (i, kind), cc.format(i=i, k=k) * reps
    elif kind == "cu":
        name, text = "k%d.cu" % i, cu.format(i=i, k=k) * reps
    elif kind == "yaml":
        name = "d%d.yaml" % i
        text = "kind: Deployment\nspec:\n  replicas: %d\n" % k + ("  # comment\n  x: y\n" * reps)
        if cuda: text += "  limits:\n    nvidia.com/gpu: 1\n"
    elif kind == "sh":
        name = "r%d.sh" % i
        text = "#!/bin/sh\nset -e\necho start %d\n" % i + ("ls -l /tmp # nvidia-smi\n" * reps)
        if cuda: text += "export CUDA_VISIBLE_DEVICES=0\n"
    elif kind == "cmake":
        d = os.path.join(d, "c%d" % i); os.makedirs(d, exist_ok=True)
        name = "CMakeLists.txt"
        text = "add_library(l%d a.cc)\n" % i + ("target_compile_options(l%d PRIVATE -O2)\n" % i) * reps
        if cuda: text += "find_package(CUDAToolkit REQUIRED)\n"
    elif kind == "req":
        name = "requirements-%d.txt" % i
        text = "numpy>=1.26\nrequests\n" + ("torch==2.3.1+cu121\n" if cuda else "torch==2.3.1\n")
    else:
        name = "Dockerfile.%d" % i
        text = ("FROM nvidia/cuda:12.1.1-runtime-ubuntu22.04\n" if cuda else "FROM debian:12\n") + "RUN true\n"
    with open(os.path.join(d, name), "w") as f:
        f.write(text)
PY
FILES=$(find "$DIR" -type f | wc -l)
BYTES=$(find "$DIR" -type f -printf "%s\n" | awk '{s+=$1} END {print s}')
"$BIN" scan "$DIR" --jobs "$JOBS" --format json --output /dev/null  # warm the page cache
python3 - "$BIN" "$DIR" "$JOBS" "$FILES" "$BYTES" <<'PY'
# Wall time and CPU time (user + sys of the scan process): on a shared machine the CPU time is
# the steadier figure.
import json, resource, subprocess, sys, time
binary, tree, jobs, files, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
for run in range(3):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run([binary, "scan", tree, "--jobs", jobs, "--format", "json", "--output", tree + ".json"],
                   check=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    found = json.load(open(tree + ".json"))["summary"]["findings"]
    print("scan: %d files, %.1f MB, %d findings: wall %.2f s = %.0f files/s, %.1f MB/s; "
          "CPU %.2f s = %.0f files per CPU-second, %.1f MB per CPU-second"
          % (files, size / 1e6, found, wall, files / wall, size / 1e6 / wall, cpu, files / cpu,
             size / 1e6 / cpu))
PY
rm -f "$DIR.json"
