"""Issue 27: the engine's choices as typed tuning fields (pf_tuning; pyprefill.tuning) instead of
environment switches, and the four deployment knobs of the environment read by one parser
(PREFILL_GEMM, PREFILL_GRAPH, PREFILL_GEMM_LT, PREFILL_LOG; a bad value warned about once by
name). CPU: the fields' names and values, the library's range checks before any device work
(model, session and context entries), the knobs' parser in child processes. The GPU tests of
each field's effect live beside the kernels they choose (test_gemm_path, test_kernel_gdn,
test_prewarm, test_gemm_lt, test_engine)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import status_and_error

pytest.importorskip("pyprefill._ffi", reason="libprefill not loadable")

from pyprefill import errors, tuning  # noqa: E402
from pyprefill._ffi import ffi, lib  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_fields_round_trip():
    t = tuning.new({"gemm_lt": "force", "fuse_groups": False, "f16_producers": True,
                    "row_form": "recompute", "gdn_scan": "chunked", "gdn_state": "warp",
                    "gdn_subpass_rows": "one-pass", "gdn_pdl": False, "attn_kernel": "mma",
                    "prewarm_piece_bytes": "one-allocation", "prewarm_fail_piece": 3,
                    "gemm_blocks_slab_rows": "never", "gemm_blocks_gemv_rows": 16,
                    "prewarm_cache_rows": "no-rule", "prewarm_cache_margin": 25, "gemm_blocks_ring": "off"})
    assert t.prewarm_cache_rows == -1 and t.prewarm_cache_margin == 25 and t.gemm_blocks_ring == -1
    assert t.gemm_lt == lib.PF_GEMM_LT_FORCE and t.fuse_groups == lib.PF_SWITCH_OFF
    assert t.f16_producers == lib.PF_SWITCH_ON and t.gdn_subpass_rows == -1
    assert t.prewarm_piece_bytes == -1 and t.prewarm_fail_piece == 3 and t.gemm_blocks_slab_rows == -1
    assert t.gemm_blocks_gemv_rows == 16
    assert tuning.as_dict(t) == {"gemm_lt": "force", "fuse_groups": False, "f16_producers": True,
                                 "row_form": "recompute", "gdn_scan": "chunked",
                                 "gdn_state": "warp", "gdn_subpass_rows": "one-pass",
                                 "gdn_pdl": False, "attn_kernel": "mma",
                                 "prewarm_piece_bytes": "one-allocation", "prewarm_fail_piece": 3,
                                 "gemm_blocks_slab_rows": "never", "gemm_blocks_gemv_rows": 16,
                                 "prewarm_cache_rows": "no-rule", "prewarm_cache_margin": 25,
                                 "gemm_blocks_ring": "off"}
    assert tuning.as_dict(tuning.new()) == {}
    assert tuning.as_dict(tuning.new({"gdn_state": None, "fuse_groups": "default"})) == {}


@pytest.mark.parametrize("fields, match", [
    ({"fuse": True}, "unknown field 'fuse'"),
    ({"fuse_groups": 3}, "fuse_groups: 3 is not a bool"),
    ({"gdn_state": "v2"}, "gdn_state: 'v2' is not one of auto, warp, warpgroup, warpgroup_pair"),
    ({"gemm_lt": True}, "gemm_lt: True is not one of"),
    ({"gdn_subpass_rows": "all"}, "gdn_subpass_rows: 'all' is not an int or one of one-pass"),
    ({"prewarm_fail_piece": 1.5}, "prewarm_fail_piece: 1.5 is not an int")])
def test_python_side_names_the_field(fields, match):
    with pytest.raises(errors.InvalidArgumentError, match=match):
        tuning.new(fields)


# The library's range checks, through entries that check the options before they need a device:
# pf_model_load (before its ctx), pf_session_create (before its model), pf_context_set_tuning.
@pytest.mark.parametrize("field, value, say", [
    ("gemm_lt", 4, "tuning.gemm_lt=4 is not a pf_gemm_lt_mode"),
    ("fuse_qk_rope", 3, "tuning.fuse_qk_rope=3 is not a pf_switch"),
    ("row_form", -1, "tuning.row_form=-1 is not a pf_row_form"),
    ("gdn_scan", 3, "tuning.gdn_scan=3 is not a pf_gdn_scan_path"),
    ("gdn_state", 7, "tuning.gdn_state=7 is not a pf_gdn_state_kernel"),
    ("gdn_subpass_rows", 100, "tuning.gdn_subpass_rows=100"),
    ("gdn_subpass_rows", 8256, "tuning.gdn_subpass_rows=8256"),
    ("attn_kernel", 3, "tuning.attn_kernel=3 is not a pf_attn_kernel"),
    ("prewarm_fail_piece", -2, "tuning.prewarm_fail_piece=-2"),
    ("prewarm_piece_bytes", -5, "tuning.prewarm_piece_bytes=-5"),
    ("gemm_blocks_slab_rows", 1, "tuning.gemm_blocks_slab_rows=1 (0 default, -1 never, else rows >= 2)"),
    ("gemm_blocks_slab_rows", -3, "tuning.gemm_blocks_slab_rows=-3"),
    ("gemm_blocks_gemv_rows", 17, "tuning.gemm_blocks_gemv_rows=17 (0 default, -1 never, else rows 1..16)"),
    ("gemm_blocks_gemv_rows", -2, "tuning.gemm_blocks_gemv_rows=-2"),
    ("prewarm_cache_rows", -2, "tuning.prewarm_cache_rows=-2 (0 default, -1 no rule, else rows 1..65536)"),
    ("prewarm_cache_rows", 65537, "tuning.prewarm_cache_rows=65537"),
    ("prewarm_cache_margin", -1, "tuning.prewarm_cache_margin=-1 (0 default, else percent 1..100000)"),
    ("prewarm_cache_margin", 100001, "tuning.prewarm_cache_margin=100001"),
    ("gemm_blocks_ring", 1, "tuning.gemm_blocks_ring=1 (0 default, -1 off, else buffers 2..8)"),
    ("gemm_blocks_ring", 9, "tuning.gemm_blocks_ring=9")])
def test_library_checks_every_field(field, value, say):
    mo = ffi.new("pf_model_options *")
    assert lib.pf_model_options_init(mo, ffi.sizeof("pf_model_options")) == 0
    setattr(mo.tuning, field, value)
    out = ffi.new("pf_model **")
    st, msg = status_and_error(lib.pf_model_load(out, ffi.NULL, b"unused.gguf", mo))
    assert st == lib.PF_STATUS_INVALID_ARGUMENT and "pf_model_load" in msg and say in msg, msg
    so = ffi.new("pf_session_options *")
    assert lib.pf_session_options_init(so, ffi.sizeof("pf_session_options")) == 0
    setattr(so.tuning, field, value)
    sout = ffi.new("pf_session **")
    st, msg = status_and_error(lib.pf_session_create(sout, ffi.NULL, so))
    assert st == lib.PF_STATUS_INVALID_ARGUMENT and "pf_session_create" in msg and say in msg, msg


def test_valid_tuning_passes_to_the_next_check():
    """A valid tuning gets past its check: the next one (ctx, model NULL) speaks."""
    mo = ffi.new("pf_model_options *")
    lib.pf_model_options_init(mo, ffi.sizeof("pf_model_options"))
    tuning.fill(mo.tuning, {"gdn_subpass_rows": 4096, "prewarm_piece_bytes": 1 << 20, "gdn_pdl": True,
                            "gemm_blocks_slab_rows": 2})
    st, msg = status_and_error(lib.pf_model_load(ffi.new("pf_model **"), ffi.NULL, b"unused.gguf", mo))
    assert st == lib.PF_STATUS_INVALID_ARGUMENT and "ctx is NULL" in msg, msg


def test_context_tuning_entries_check_their_arguments():
    st, msg = status_and_error(lib.pf_context_set_tuning(ffi.NULL, ffi.NULL))
    assert st == lib.PF_STATUS_INVALID_ARGUMENT and "ctx is NULL" in msg
    st, msg = status_and_error(lib.pf_context_get_tuning(ffi.NULL, tuning.new()))
    assert st == lib.PF_STATUS_INVALID_ARGUMENT and "ctx is NULL" in msg


@pytest.mark.gpu
def test_context_tuning_is_kept_and_replaced(ctx):
    old = ctx.tuning()
    try:
        ctx.set_tuning(gdn_state="warp", prewarm_piece_bytes=4096)
        assert ctx.tuning() == {"gdn_state": "warp", "prewarm_piece_bytes": 4096}
        ctx.set_tuning(gemm_lt="off")                  # replaces, does not merge
        assert ctx.tuning() == {"gemm_lt": "off"}
        with pytest.raises(errors.InvalidArgumentError, match="gdn_subpass_rows=65"):
            ctx.set_tuning(gdn_subpass_rows=65)
        assert ctx.tuning() == {"gemm_lt": "off"}      # a refused tuning changes nothing
    finally:
        ctx.set_tuning(old)


# ------------------------------------------------------------------ the environment's knobs

def _knobs_in_child(env_extra: dict) -> tuple[str, list[str]]:
    """The process default leg a child reports with `env_extra` (the knobs are parsed at the
    library's first use), and its libprefill warning lines (it asks twice: one parse)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFILL_")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    code = ("from pyprefill.kernels import gemm\n"
            "print(gemm.gemm_default_leg()); print(gemm.gemm_default_leg())")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=str(ROOT), timeout=120)
    assert r.returncode == 0, r.stderr
    legs = r.stdout.split()
    assert legs[0] == legs[1]
    return legs[0], [ln for ln in r.stderr.splitlines() if ln.startswith("libprefill: warning")]


@pytest.mark.parametrize("env, warned", [
    ({}, []),
    ({"PREFILL_GRAPH": "0", "PREFILL_GEMM_LT": "off", "PREFILL_LOG": "gemm,plan"}, []),
    ({"PREFILL_GRAPH": "TRUE", "PREFILL_GEMM_LT": "Yes", "PREFILL_LOG": "all"}, []),
    ({"PREFILL_GRAPH": "maybe"}, ["PREFILL_GRAPH"]),
    ({"PREFILL_GEMM_LT": "force"}, ["PREFILL_GEMM_LT"]),   # force is a tuning field now
    ({"PREFILL_LOG": "gemm,bogus"}, ["PREFILL_LOG"]),
    ({"PREFILL_GRAPH": "2", "PREFILL_LOG": "x", "PREFILL_GEMM": "fp8"},
     ["PREFILL_GEMM", "PREFILL_GRAPH", "PREFILL_LOG"])])
def test_knobs_parsed_once_bad_values_warned_by_name(env, warned):
    leg, warnings = _knobs_in_child(env)
    assert leg == "auto"
    assert len(warnings) == len(warned), warnings
    for name, line in zip(warned, warnings):
        assert f"{name}=" in line, warnings


def test_removed_switches_are_ignored():
    """The switches the library read before 0.5 (now tuning fields) are not read at all: no
    warning, no effect on the knobs."""
    old = {"PREFILL_FUSE": "0", "PREFILL_GDN_STATE": "v2", "PREFILL_ATTN_BN128": "96",
           "PREFILL_GEMM_LT_LOG": "1", "PREFILL_GRAPH_ATTN": "0", "PREFILL_ROW_REGS": "banana"}
    leg, warnings = _knobs_in_child(old)
    assert leg == "auto" and warnings == []
