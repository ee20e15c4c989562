"""Helpers that write small (possibly deliberately broken) GGUF files for the format tests."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from pyprefill.formats.synth import preset_desc, tensor_plan
from pyprefill.formats.model_desc import ModelDesc, add_metadata, hparam_metadata, row_bytes


def write_gguf(path: Path, desc: ModelDesc, mix: str = "q8_0",
               edit: Callable[[list[tuple[str, tuple[int, ...], int]]],
                              list[tuple[str, tuple[int, ...], int]]] | None = None,
               arch: str | None = None, skip_keys: tuple[str, ...] = (),
               extra_kv: dict[str, int] | None = None) -> Path:
    """Write desc's tensors (plan edited by `edit`) with zero-filled data via gguf.GGUFWriter.

    Each plan entry is (name, NumPy shape, qtype); a qtype pyprefill does not support (e.g.
    Q2_K 10) is written with the right byte size from gguf's own block table.
    """
    plan = tensor_plan(desc, mix)
    if edit is not None:
        plan = edit(plan)
    a = arch or desc.arch
    w = gguf.GGUFWriter(str(path), a)
    kv = hparam_metadata(desc, a)
    kv.update(extra_kv or {})
    add_metadata(w, {k: v for k, v in kv.items() if k not in skip_keys})
    for name, shape, qtype in plan:
        block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
        rb = shape[-1] // block * nbytes
        data = np.zeros((*shape[:-1], rb), np.uint8)
        w.add_tensor(name, data, raw_shape=None, raw_dtype=gguf.GGMLQuantizationType(qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_desc(model: str = "qwen35-tiny", **kw) -> ModelDesc:
    """The ModelDesc of a tiny preset (see pyprefill.formats.synth.PRESETS)."""
    return preset_desc(model, **kw)


def replace_entry(plan, name, shape=None, qtype=None):
    """Plan with entry `name` given a new shape and/or qtype."""
    out = []
    for n, s, q in plan:
        if n == name:
            s = shape if shape is not None else s
            q = qtype if qtype is not None else q
        out.append((n, s, q))
    return out


__all__ = ["write_gguf", "tiny_desc", "replace_entry", "row_bytes"]
