"""`pyprefill info FILE`: a human-readable summary of a validated qwen3/qwen35 GGUF.

The verdict on the file is libprefill's (pf_model_inspect: the reader and the checks `run` and
Model.load use, so a damaged file gets the same message from `info` and `run`, and a real model
is read in milliseconds). Once the library has accepted the file, a small skim of its header adds
what pf_model_info does not carry (rope base, eps, the attention interval, tensors by type).
Where the library cannot be loaded, the Python reader (pyprefill.formats.gguf_model, the NumPy
reference's reader, through the `gguf` package) judges the file instead, and the output says so.
"""
from __future__ import annotations

import argparse
import dataclasses
import mmap
import os
import struct
import sys
from typing import Any

from .._cli_args import nonempty_path
from ..errors import PrefillError
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

def describe_library(path: str | os.PathLike[str]) -> str:
    """The summary with libprefill's verdict (pf_model_inspect); GGUFError / UnsupportedError
    with the library's message for a file `run` would refuse. ImportError: no library."""
    from ..model import inspect          # loads libprefill (ImportError where it cannot)
    path = os.fspath(path)
    i = inspect(path)
    try:
        meta, tensors = skim_header(path)
    except (OSError, ValueError, struct.error, IndexError, OverflowError, KeyError):
        meta, tensors = {}, []          # validated by the library; the extras are a nicety
    arch = i["arch"]
    key = lambda k: meta.get(f"{arch}.{k}")   # noqa: E731
    lines = [f"{path}", "  verdict: valid: libprefill's reader and model checks accept it (those of "
                        "`run` and Model.load)", f"  arch: {arch}"]
    if meta.get("general.name"):
        lines.append(f"  name: {meta['general.name']}")
    n_block = key("block_count")
    layers = str(i["n_layer"])
    if n_block is not None and n_block != i["n_layer"]:
        layers += f" (block_count {n_block}: {n_block - i['n_layer']} MTP block(s) not run)"
    lines.append(f"  n_layer: {layers}")
    for f in ("n_embd", "n_ff", "n_vocab", "n_head", "n_head_kv", "head_dim", "rope_dim"):
        lines.append(f"  {f}: {i[f]}")
    for label, k in (("rope_base", "rope.freq_base"), ("eps", "attention.layer_norm_rms_epsilon")):
        if key(k) is not None:
            lines.append(f"  {label}: {key(k):g}")
    lines.append(f"  context_length: {i['context_length']}")
    lines.append(f"  tied_output: {bool(i['tied_output'])}")
    interval = 0
    attn_layers: list[int] = []
    if arch == "qwen35":
        interval = key("full_attention_interval") or 4     # the converter's default
        attn_layers = [il for il in range(i["n_layer"]) if (il + 1) % interval == 0]
        for f in ("ssm_hk", "ssm_hv", "ssm_dk", "ssm_dv", "conv_kernel"):
            lines.append(f"  {f}: {i[f]}")
        lines.append(f"  full_attention_interval: {interval}")
        key_dim, value_dim = i["ssm_hk"] * i["ssm_dk"], i["ssm_hv"] * i["ssm_dv"]
        lines.append(f"  derived: key_dim {key_dim}, value_dim {value_dim}, "
                     f"conv_dim {2 * key_dim + value_dim}")
    else:
        attn_layers = list(range(i["n_layer"]))
    lines.append(f"  schedule: {_schedule_summary(arch, i['n_layer'], attn_layers, interval)}")
    if tensors:
        lines += _type_lines(tensors, path, f", {_fmt_bytes(i['weight_bytes'])} read by the engine")
    else:
        lines.append(f"  tensor bytes read by the engine: {_fmt_bytes(i['weight_bytes'])}; file "
                     f"{_fmt_bytes(os.path.getsize(path))}")
    return "\n".join(lines)


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


def _fallback_note(exc: ImportError) -> str:
    why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"note: libprefill is not loadable ({why}); the Python reader checked this file "
            "instead, and may word a fault differently from `pyprefill run`")


def describe(path: str | os.PathLike[str], reader: str = "auto") -> str:
    """Arch, hyper-parameters, layer schedule, tensors by type. reader: "library" (libprefill's
    verdict, as `run` gives it), "python" (the gguf-package reader), or "auto": the library where
    it loads, else the Python reader, after a first line saying so."""
    if reader == "python":
        return describe_python(path)
    if reader == "library":
        return describe_library(path)
    try:
        return describe_library(path)
    except ImportError as exc:
        return _fallback_note(exc) + "\n" + describe_python(path)


def _run(args: argparse.Namespace) -> int:
    """The summary on stdout; a file `run` would refuse: one line on stderr (the same words as
    `run`'s), exit 1. Without the library, a note on stderr, then the Python reader's verdict."""
    try:
        try:
            text = describe_library(args.file)
        except ImportError as exc:
            print(_fallback_note(exc), file=sys.stderr)
            text = describe_python(args.file)
    except PrefillError as e:
        print(f"pyprefill info: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(text)
    return 0


def add_info_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `pyprefill info FILE`; func(args) -> int (1 on an invalid file)."""
    p = subparsers.add_parser("info", help="validate a GGUF and summarise its model",
                              description=describe.__doc__.split("\n")[0] + " The verdict is "
                              "libprefill's, the one `pyprefill run` gives; without the library, "
                              "the Python reader's.")
    p.add_argument("file", type=nonempty_path, help="path to a .gguf file")
    p.set_defaults(func=_run)
    return p
