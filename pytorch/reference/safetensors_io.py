"""Minimal safetensors writer/reader for the reference tools (torch 1.13 + numpy, no extra packages).

API
  save(path, tensors, metadata=None, dtypes=None)
      tensors: dict name -> torch.Tensor (f64/f32/f16/bf16/i64/i32/i16/i8/u8/bool).
      dtypes: optional dict name -> safetensors dtype string overriding the one implied by the
      tensor; used for FP8: pass the raw bytes as a uint8 tensor and dtypes[name] = "F8_E4M3"
      (torch 1.13 has no float8 type). Tensors may also be wrapped in Raw(u8_tensor, "F8_E4M3").
  load(path, with_dtypes=False) -> dict name -> torch.Tensor   (F8_* come back as uint8 bytes)
      with_dtypes=True returns (tensors, dtypes, metadata).
  save_sharded(model_dir, tensors, n_shards, metadata=None, dtypes=None)
      writes model-0000i-of-0000n.safetensors + model.safetensors.index.json.
  load_dir(model_dir, with_dtypes=False): model.safetensors or the index's shards, merged.
  f32_to_e4m3(t) -> uint8 tensor (round to nearest, ties to even, saturating at +-448)
  e4m3_to_f32(u8) -> float32 tensor (exact decode; 0x7F/0xFF are NaN)
"""
import json
import os
import struct

import numpy as np
import torch

_TORCH_TO_ST = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}
_ST_NP = {  # numpy dtype used for the raw bytes of each safetensors dtype
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.int16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8,
}


class Raw:
    """A uint8 tensor carrying the bytes of a dtype torch lacks (F8_E4M3, F8_E5M2)."""

    def __init__(self, data, dtype):
        assert data.dtype == torch.uint8
        self.data, self.dtype = data, dtype


def _to_bytes(t, st_dtype):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    if st_dtype in ("F8_E4M3", "F8_E5M2"):
        assert t.dtype == torch.uint8, "FP8 tensors are passed as uint8 bytes"
    return t.numpy().tobytes()


def save(path, tensors, metadata=None, dtypes=None):
    dtypes = dict(dtypes or {})
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if isinstance(t, Raw):
            dtypes.setdefault(name, t.dtype)
            t = t.data
        st = dtypes.get(name, _TORCH_TO_ST[t.dtype])
        b = _to_bytes(t, st)
        header[name] = {"dtype": st, "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return offset


def load(path, with_dtypes=False):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    out, dts = {}, {}
    for name, info in header.items():
        st = info["dtype"]
        b0, b1 = info["data_offsets"]
        arr = np.frombuffer(data[b0:b1], dtype=_ST_NP[st]).copy().reshape(info["shape"])
        t = torch.from_numpy(arr)
        if st == "BF16":
            t = t.view(torch.bfloat16)
        out[name] = t
        dts[name] = st
    if with_dtypes:
        return out, dts, meta
    return out


def save_sharded(model_dir, tensors, n_shards, metadata=None, dtypes=None):
    names = sorted(tensors)
    per = (len(names) + n_shards - 1) // n_shards
    weight_map, total = {}, 0
    for i in range(n_shards):
        part = names[i * per:(i + 1) * per]
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, n_shards)
        sub = {k: tensors[k] for k in part}
        subd = {k: v for k, v in (dtypes or {}).items() if k in sub}
        total += save(os.path.join(model_dir, fname), sub, metadata, subd)
        for k in part:
            weight_map[k] = fname
    with open(os.path.join(model_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
        f.write("\n")


def load_dir(model_dir, with_dtypes=False):
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out, dts, meta = {}, {}, {}
    for fn in files:
        t, d, m = load(os.path.join(model_dir, fn), with_dtypes=True)
        out.update(t)
        dts.update(d)
        meta.update(m)
    return (out, dts, meta) if with_dtypes else out


# ---- float8 e4m3fn (bias 7, max 448, no inf, NaN = S.1111.111) ----
def _e4m3_table():
    vals = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            vals[b] = np.nan
        elif e == 0:
            vals[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            vals[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return vals


_E4M3 = _e4m3_table()


def e4m3_to_f32(u8):
    return torch.from_numpy(_E4M3[u8.numpy().astype(np.int64)])


def f32_to_e4m3(t):
    """Nearest e4m3fn value (ties to the even mantissa), saturating to +-448."""
    x = t.detach().float().numpy()
    pos = _E4M3[:0x7F]  # 0x00..0x7E: non-negative finite values, increasing
    a = np.minimum(np.abs(x), 448.0)
    hi = np.searchsorted(pos, a, side="left").clip(0, len(pos) - 1)
    lo = (hi - 1).clip(0, None)
    dlo, dhi = a - pos[lo], pos[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(hi % 2 == 0, hi, lo)))
    pick = np.where(a == pos[hi], hi, pick)
    code = pick.astype(np.uint8) | np.where(x < 0, 0x80, 0).astype(np.uint8)
    code = np.where(pick == 0, 0, code).astype(np.uint8)  # keep zero positive
    return torch.from_numpy(code)
