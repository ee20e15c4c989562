"""`pyprefill info FILE`: a human-readable summary of a validated qwen3/qwen35 GGUF."""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from ..errors import PrefillError
from .gguf_model import load_model_desc, qtype_name
from .model_desc import ModelDesc


_QWEN35_ONLY = ("full_attention_interval", "conv_kernel", "ssm_dk", "ssm_hk", "ssm_hv",
                "ssm_inner", "nextn_predict_layers")


def _schedule_summary(desc: ModelDesc) -> str:
    """'24 layers: 18 gdn + 6 attn (attn at 3, 7, ...)' style line."""
    n_attn = len(desc.attn_layers)
    n_gdn = desc.n_layer - n_attn
    if desc.arch == "qwen3":
        return f"{desc.n_layer} layers, all full attention"
    idx = ", ".join(str(i) for i in desc.attn_layers[:8])
    if n_attn > 8:
        idx += ", ..."
    return (f"{desc.n_layer} layers: {n_gdn} GDN + {n_attn} full attention "
            f"(interval {desc.full_attention_interval}; attention at {idx or 'none'})")


def _fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def describe(path: str | os.PathLike[str]) -> str:
    """Arch, every ModelDesc field, layer schedule, tensor count and bytes per qtype, total."""
    desc = load_model_desc(path)
    lines = [f"{desc.path}", f"  arch: {desc.arch}"]
    for f in dataclasses.fields(desc):
        if f.name in ("path", "arch", "tensors", "layer_kinds"):
            continue
        if desc.arch == "qwen3" and f.name in _QWEN35_ONLY:
            continue
        lines.append(f"  {f.name}: {getattr(desc, f.name)}")
    if desc.arch == "qwen35":
        lines.append(f"  derived: key_dim {desc.key_dim}, value_dim {desc.value_dim}, "
                     f"conv_dim {desc.conv_dim}, ssm_dv {desc.ssm_dv}")
    lines.append(f"  schedule: {_schedule_summary(desc)}")
    by_type: dict[int, list[int]] = {}
    n_params = 0
    for t in desc.tensors.values():
        entry = by_type.setdefault(t.qtype, [0, 0, 0])
        entry[0] += 1
        entry[1] += t.nbytes
        n_elem = 1
        for s in t.shape:
            n_elem *= s
        entry[2] += n_elem
        n_params += n_elem
    total = sum(e[1] for e in by_type.values())
    lines.append(f"  tensors: {len(desc.tensors)}, {n_params / 1e9:.3f} B parameters")
    for q in sorted(by_type, key=lambda q: -by_type[q][1]):
        cnt, nbytes, nel = by_type[q]
        bpw = 8 * nbytes / max(nel, 1)
        lines.append(f"    {qtype_name(q):7s} {cnt:5d} tensors  {_fmt_bytes(nbytes):>11s}  "
                     f"{bpw:5.2f} bits/weight")
    lines.append(f"  total tensor bytes: {_fmt_bytes(total)} ({total} B); file "
                 f"{_fmt_bytes(os.path.getsize(desc.path))}")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    try:
        print(describe(args.file))
    except PrefillError as e:
        print(f"pyprefill info: {e}", file=sys.stderr)
        return 1
    return 0


def add_info_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `pyprefill info FILE`; func(args) -> int (1 on an invalid file)."""
    p = subparsers.add_parser("info", help="validate a GGUF and summarise its model",
                              description=describe.__doc__)
    p.add_argument("file", help="path to a .gguf file")
    p.set_defaults(func=_run)
    return p
