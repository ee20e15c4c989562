"""GGUF summaries from the Python reader (pyprefill.formats.gguf_model, the NumPy reference's
reader, through the `gguf` package): arch, hyper-parameters, layer schedule, tensors by type, and
a small skim of a header's metadata. Pure Python: never imports the binding; `pyprefill info`
(pyprefill/info_cli.py) adds libprefill's verdict on top.
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from typing import Any

from .gguf_model import load_model_desc, qtype_name
from .model_desc import QTYPE_BLOCK, ModelDesc

_QWEN35_ONLY = ("full_attention_interval", "conv_kernel", "ssm_dk", "ssm_hk", "ssm_hv",
                "ssm_inner", "nextn_predict_layers")


def _schedule_summary(arch: str, n_layer: int, attn_layers: list[int] | tuple[int, ...],
                      interval: int) -> str:
    """'24 layers: 18 GDN + 6 full attention (interval 4; attention at 3, 7, ...)' style line."""
    if arch == "qwen3":
        return f"{n_layer} layers, all full attention"
    idx = ", ".join(str(i) for i in attn_layers[:8])
    if len(attn_layers) > 8:
        idx += ", ..."
    return (f"{n_layer} layers: {n_layer - len(attn_layers)} GDN + {len(attn_layers)} full "
            f"attention (interval {interval}; attention at {idx or 'none'})")


def _fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def _type_lines(tensors: list[tuple[str, tuple[int, ...], int, int]], path: str,
                total_note: str = "") -> list[str]:
    """Tensor count and parameters, then count, bytes and bits/weight per GGML type."""
    by_type: dict[int, list[int]] = {}
    n_params = 0
    for _, shape, qtype, nbytes in tensors:
        entry = by_type.setdefault(qtype, [0, 0, 0])
        n_elem = 1
        for s in shape:
            n_elem *= s
        entry[0] += 1
        entry[1] += nbytes
        entry[2] += n_elem
        n_params += n_elem
    total = sum(e[1] for e in by_type.values())
    lines = [f"  tensors: {len(tensors)}, {n_params / 1e9:.3f} B parameters"]
    for q in sorted(by_type, key=lambda q: -by_type[q][1]):
        cnt, nbytes, nel = by_type[q]
        lines.append(f"    {qtype_name(q):7s} {cnt:5d} tensors  {_fmt_bytes(nbytes):>11s}  "
                     f"{8 * nbytes / max(nel, 1):5.2f} bits/weight")
    lines.append(f"  total tensor bytes: {_fmt_bytes(total)} ({total} B){total_note}; file "
                 f"{_fmt_bytes(os.path.getsize(path))}")
    return lines


# ------------------------------------------------------------------------------ header skim

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}          # GGUF value types; 8 = string, 9 = array
_STRING, _ARRAY = 8, 9


def _tensor_bytes(qtype: int, shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    if qtype in QTYPE_BLOCK:
        elems, nbytes = QTYPE_BLOCK[qtype]
    else:                                 # a type pyprefill does not read (an MTP block's, say)
        try:
            import gguf
            elems, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
        except (ImportError, ValueError, KeyError):
            return 0
    return n // elems * nbytes


def skim_header(path: str) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]]]:
    """Scalar and string metadata ({key: value}; arrays are skipped) and the tensor table
    [(name, NumPy-order shape, GGML type, bytes)] of a GGUF, read straight from its header.
    For display only, and only after libprefill has validated the file: it trusts the layout."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        pos = 0

        def take(fmt: str):
            nonlocal pos
            v = struct.unpack_from(fmt, m, pos)
            pos += struct.calcsize(fmt)
            return v[0]

        def string() -> str:
            nonlocal pos
            n = take("<Q")
            pos += n
            return m[pos - n:pos].decode("utf-8", "replace")

        def skip_value(vtype: int) -> None:
            nonlocal pos
            if vtype == _STRING:
                n = take("<Q")                     # (pos += take() would add to the old pos)
                pos += n
            elif vtype == _ARRAY:
                etype, count = take("<I"), take("<Q")
                if etype in _SCALAR:              # fixed-size elements: one jump
                    pos = pos + count * struct.calcsize(_SCALAR[etype])
                else:                             # strings (a vocabulary) or nested arrays
                    for _ in range(count):
                        skip_value(etype)
            else:
                pos = pos + struct.calcsize(_SCALAR[vtype])

        if m[:4] != b"GGUF":
            raise ValueError("not a GGUF file")
        pos = 4
        take("<I")                                 # version
        n_tensors, n_kv = take("<Q"), take("<Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key, vtype = string(), take("<I")
            if vtype == _STRING:
                meta[key] = string()
            elif vtype in _SCALAR:
                meta[key] = take(_SCALAR[vtype])
            else:
                skip_value(vtype)
        tensors = []
        for _ in range(n_tensors):
            name = string()
            ne = [take("<Q") for _ in range(take("<I"))]
            qtype = take("<I")
            take("<Q")                             # offset
            shape = tuple(reversed(ne))
            tensors.append((name, shape, qtype, _tensor_bytes(qtype, shape)))
    return meta, tensors


# ------------------------------------------------------------------------------ the two readers

def describe_python(path: str | os.PathLike[str]) -> str:
    """The summary with the Python reader's verdict (pyprefill.formats.gguf_model): arch, every
    ModelDesc field, layer schedule, tensor count and bytes per qtype, total."""
    desc: ModelDesc = load_model_desc(path)
    lines = [f"{desc.path}", "  verdict: valid for the Python reader (pyprefill.formats; the engine's own "
                             "reader did not judge it)", f"  arch: {desc.arch}"]
    for f in dataclasses.fields(desc):
        if f.name in ("path", "arch", "tensors", "layer_kinds"):
            continue
        if desc.arch == "qwen3" and f.name in _QWEN35_ONLY:
            continue
        lines.append(f"  {f.name}: {getattr(desc, f.name)}")
    if desc.arch == "qwen35":
        lines.append(f"  derived: key_dim {desc.key_dim}, value_dim {desc.value_dim}, "
                     f"conv_dim {desc.conv_dim}, ssm_dv {desc.ssm_dv}")
    lines.append(f"  schedule: "
                 f"{_schedule_summary(desc.arch, desc.n_layer, desc.attn_layers, desc.full_attention_interval)}")
    tensors = [(t.name, t.shape, t.qtype, t.nbytes) for t in desc.tensors.values()]
    lines += _type_lines(tensors, desc.path)
    return "\n".join(lines)
