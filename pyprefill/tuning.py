"""The engine's tuning fields (the C struct pf_tuning): its internal choices as typed arguments,
for measurement and tests. Every field left unset (None) is the library's choice; a session's
tuning goes over its model's, the model's over its context's (Context.set_tuning).

    ctx.set_tuning(gdn_state="warp")                 # kernel-level calls on ctx
    model = Model.load(path, tuning={"fuse_groups": False})
    s = model.session(tuning={"gemm_lt": "off", "row_form": "staged"})

Fields (docs/tuning.md has what each measures and which results stay bitwise):
    gemm_lt            "on" | "off" | "force"       the f16 leg's per-shape GEMM choice
    fuse_groups        bool                         one GEMM per group of projections
    f16_producers      bool                         producers write the f16 leg's input
    row_form           "auto" | "staged" | "recompute"
    fuse_qk_rope       bool                         q/k norms + RoPE + KV write in one kernel
    fuse_conv_norm     bool                         GDN conv1d + L2 norms in one kernel
    gdn_scan           "auto" | "sequential" | "chunked"
    gdn_state          "auto" | "warp" | "warpgroup" | "warpgroup_pair"
    gdn_subpass_rows   int (a multiple of 64 up to 8192) or "one-pass"
    gdn_pdl            bool                         programmatic dependent launch
    attn_kernel        "auto" | "mma" | "wgmma"
    prewarm_piece_bytes int, or "one-allocation"
    prewarm_fail_piece int (testing: piece N, 1-based, fails to allocate)
    varlen             bool                         a batch step's GDN layers as one launch each
    gemm_blocks        bool                         the f16 leg reads an uncached matrix's GGUF blocks
    gemm_blocks_slab_rows int (>= 2) or "never"     ... as per-call fp16 slabs from this many rows on
    gemm_blocks_gemv_rows int (1..16) or "never"    ... up to this many rows on Q4_K / Q5_K / Q6_K: the GEMV form
    prewarm_cache_rows int (1..65536) or "no-rule"  a model's prewarm caches a matrix the f16 leg reads from
                                                    its blocks only where the cache measured faster at these rows
    prewarm_cache_margin int (percent, 1..100000)   ... by more than this (default 3)
    gemm_blocks_ring   int (2..8) or "off"          the blocks' slabs dequantized ahead in this many buffers
"""
from __future__ import annotations

import numbers

from ._ffi import enum_map, ffi
from .errors import InvalidArgumentError

_SWITCH = {"default": 0, "on": 1, "off": 2}
_ENUMS = {
    "gemm_lt": enum_map("pf_gemm_lt_mode", "PF_GEMM_LT_"),
    "row_form": enum_map("pf_row_form", "PF_ROW_FORM_"),
    "gdn_scan": enum_map("pf_gdn_scan_path", "PF_GDN_SCAN_"),
    "gdn_state": enum_map("pf_gdn_state_kernel", "PF_GDN_STATE_"),
    "attn_kernel": enum_map("pf_attn_kernel", "PF_ATTN_KERNEL_"),
}
_SWITCHES = ("fuse_groups", "f16_producers", "fuse_qk_rope", "fuse_conv_norm", "gdn_pdl", "varlen",
             "gemm_blocks")
_INTS = {"gdn_subpass_rows": {"one-pass": -1}, "prewarm_piece_bytes": {"one-allocation": -1},
         "prewarm_fail_piece": {}, "gemm_blocks_slab_rows": {"never": -1},
         "gemm_blocks_gemv_rows": {"never": -1}, "prewarm_cache_rows": {"no-rule": -1},
         "prewarm_cache_margin": {}, "gemm_blocks_ring": {"off": -1}}
FIELDS = (*_ENUMS, *_SWITCHES, *_INTS)


def _value(name: str, value) -> int:
    if value is None:
        return 0
    if name in _SWITCHES:
        if isinstance(value, bool):
            return 1 if value else 2
        if isinstance(value, str) and value.lower() in _SWITCH:
            return _SWITCH[value.lower()]
        raise InvalidArgumentError(f"tuning.{name}: {value!r} is not a bool (or on/off/default)")
    if name in _ENUMS:
        names = _ENUMS[name]
        if isinstance(value, str) and value.lower() in names:
            return names[value.lower()]
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) in names.values():
            return int(value)
        raise InvalidArgumentError(f"tuning.{name}: {value!r} is not one of {', '.join(names)}")
    special = _INTS[name]
    if isinstance(value, str) and value in special:
        return special[value]
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise InvalidArgumentError(f"tuning.{name}: {value!r} is not an int"
                               + (f" or one of {', '.join(special)}" if special else ""))


def fill(struct, tuning: dict | None) -> None:
    """Sets the fields of a pf_tuning (cffi struct or pointer) from `tuning` (None = defaults).
    The library checks the ranges; an unknown field name is an InvalidArgumentError here."""
    if tuning is not None and not isinstance(tuning, dict):
        raise InvalidArgumentError(f"tuning: expected a dict of pyprefill.tuning fields, got "
                                   f"{type(tuning).__name__}")
    for name, value in (tuning or {}).items():
        if name not in FIELDS:
            raise InvalidArgumentError(f"tuning: unknown field {name!r} (known: {', '.join(FIELDS)})")
        setattr(struct, name, _value(name, value))


def new(tuning: dict | None = None):
    """A pf_tuning * filled from `tuning`."""
    t = ffi.new("pf_tuning *")
    fill(t, tuning)
    return t


def as_dict(struct) -> dict:
    """The non-default fields of a pf_tuning, by name (enum fields as their names)."""
    out = {}
    for name in FIELDS:
        v = int(getattr(struct, name))
        if v == 0:
            continue
        if name in _SWITCHES:
            out[name] = v == 1
        elif name in _ENUMS:
            out[name] = next((k for k, x in _ENUMS[name].items() if x == v), v)
        else:
            out[name] = next((k for k, x in _INTS[name].items() if x == v), v)
    return out
