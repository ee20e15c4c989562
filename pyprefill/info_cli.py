"""`pyprefill info FILE`: a GGUF's summary with libprefill's verdict (pf_model_inspect, the checks
of `run` and Model.load), or, where the library does not load, the Python reader's
(pyprefill.formats.info, which never imports the binding)."""
from __future__ import annotations

import argparse
import os
import struct
import sys
from typing import Any

from ._cli_args import nonempty_path
from .errors import PrefillError
from .formats.info import _fmt_bytes, _schedule_summary, _type_lines, describe_python, skim_header


def describe_library(path: str | os.PathLike[str]) -> str:
    """The summary with libprefill's verdict (pf_model_inspect); GGUFError / UnsupportedError
    with the library's message for a file `run` would refuse. ImportError: no library."""
    from .model import inspect           # loads libprefill (ImportError where it cannot)
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
