"""The buffer-level Python wrappers pass every argument to the right C parameter (CPU: no device).

A wrong argument order in a wrapper would otherwise show only on the GPU. Each wrapper runs here
against a recorder standing in for `lib` of its module: the recorder names every argument with
the parameter names of include/prefill.h and returns PF_STATUS_OK, and the test compares the
call with what the wrapper was given (distinct values everywhere, so that a swap shows)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from pyprefill import errors
from pyprefill._ffi import HEADER, cdef_source, ffi, lib
from pyprefill.core import Buffer, Context, Weight
from pyprefill.kernels import attention as A
from pyprefill.kernels import gdn as G
from pyprefill.kernels import gemm
from pyprefill.kernels import rows as R
from pyprefill.kernels._common import View


def _param_names() -> dict[str, list[str]]:
    """{function: [parameter names]} of every pf_ function of the header."""
    out = {}
    for m in re.finditer(r"\b(pf_\w+)\s*\(([^;{]*?)\)\s*;", cdef_source(HEADER)):
        params = [p.strip() for p in m.group(2).split(",") if p.strip() and p.strip() != "void"]
        out[m.group(1)] = [re.findall(r"\w+", p)[-1] for p in params]
    return out


PARAMS = _param_names()


def _plain(value):
    """A recorded C argument as plain Python: a pf_view * / pf_view -> (buf address, off, ld);
    an argument struct -> {field: value}; a pointer -> its address."""
    if isinstance(value, ffi.CData):
        t = ffi.typeof(value)
        if t.kind == "pointer" and t.item.cname == "pf_view":
            return _plain(value[0])
        if t.kind == "pointer" and t.item.kind == "struct" and t.item.fields:
            return {name: _plain(getattr(value, name)) for name, _ in t.item.fields}
        if t.kind == "struct" and t.cname == "pf_view":
            return (int(ffi.cast("uintptr_t", value.buf)), value.off, value.ld)
        if t.kind == "pointer":
            return int(ffi.cast("uintptr_t", value))
    return value


class Recorder:
    """Stands in for `lib`: pf_* calls are recorded as {parameter: value}; anything else is the
    real library (the _init functions of argument structs, the enum constants)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if name in PARAMS and not name.endswith("_init") and name != "pf_status_name":
            def record(*args):
                assert len(args) == len(PARAMS[name]), (name, args)
                self.calls.append((name, {p: _plain(a) for p, a in zip(PARAMS[name], args)}))
                return lib.PF_STATUS_OK
            return record
        return getattr(lib, name)


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    for module in (A, G, R, gemm):
        monkeypatch.setattr(module, "lib", r)
    return r


def _fake(cls, address, **attrs):
    """A Context / Buffer / Weight object around a fake handle (never dereferenced here)."""
    obj = cls.__new__(cls)
    obj._ptr = ffi.cast({Context: "pf_context *", Buffer: "pf_buffer *", Weight: "pf_weight *"}[cls],
                        address)
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj


CTX = _fake(Context, 0x10)
W = _fake(Weight, 0x20, n=96, k=64, qtype=8)
B = [_fake(Buffer, 0x100 * (i + 1), nbytes=1 << 20) for i in range(8)]


def vt(i, off=0, ld=0):
    """The recorded form of View(B[i], off, ld)."""
    return (0x100 * (i + 1), off, ld)


def _only(rec):
    assert len(rec.calls) == 1, rec.calls
    return rec.calls[0]


def _args(call, **expected):
    name, got = call
    for key, want in expected.items():
        assert got[key] == (pytest.approx(want) if isinstance(want, float) else want), (name, key, got)


# ----------------------------------------------------------------------------- rows


def test_rows_wrappers(rec):
    R.rms_norm(CTX, View(B[0], 3, 70), View(B[1], 5), View(B[2], 7, 71), 11, 13, 1e-5)
    assert _only(rec) == ("pf_rms_norm", {"ctx": 0x10, "x": vt(0, 3, 70), "w": vt(1, 5),
                                          "y": vt(2, 7, 71), "rows": 11, "cols": 13,
                                          "eps": pytest.approx(1e-5)})
    rec.calls.clear()
    R.head_rms_norm(CTX, View(B[0], 1, 900), B[1], 7, 3, 128, 2e-6, head_stride=256)
    assert _only(rec) == ("pf_head_rms_norm", {"ctx": 0x10, "x": vt(0, 1, 900), "w": vt(1),
                                               "rows": 7, "n_heads": 3, "head_dim": 128,
                                               "head_stride": 256, "eps": pytest.approx(2e-6)})
    rec.calls.clear()
    R.rope_neox(CTX, View(B[0], 2, 777), 9, 5, 96, 32, 123456, 1e7, head_stride=200)
    name, got = _only(rec)
    assert name == "pf_rope_neox" and got["ctx"] == 0x10
    a = got["args"]
    assert a["struct_size"] == ffi.sizeof("pf_rope_neox_args")
    assert (a["x"], a["rows"], a["n_heads"], a["head_dim"], a["head_stride"], a["rot_dim"],
            a["pos0"]) == (vt(0, 2, 777), 9, 5, 96, 200, 32, 123456)
    assert a["base"] == pytest.approx(1e7)
    rec.calls.clear()
    R.swiglu(CTX, View(B[0], 1), View(B[1], 2), View(B[2], 3, 50), 4, 40)
    assert _only(rec) == ("pf_swiglu", {"ctx": 0x10, "g": vt(0, 1), "u": vt(1, 2),
                                        "out": vt(2, 3, 50), "rows": 4, "cols": 40})
    rec.calls.clear()
    R.add(CTX, View(B[3], 8, 99), B[4], 6, 17)
    assert _only(rec) == ("pf_add", {"ctx": 0x10, "y": vt(3, 8, 99), "x": vt(4), "rows": 6,
                                     "cols": 17})
    rec.calls.clear()
    R.sigmoid_gate(CTX, B[0], View(B[1], 256, 4096), 7, 8, 256, gate_head_stride=512)
    assert _only(rec) == ("pf_sigmoid_gate", {"ctx": 0x10, "o": vt(0), "gate": vt(1, 256, 4096),
                                              "rows": 7, "n_heads": 8, "head_dim": 256,
                                              "gate_head_stride": 512})


# ----------------------------------------------------------------------------- gdn


def test_gdn_wrappers(rec):
    G.gdn_conv1d(CTX, View(B[0], 1, 300), View(B[1], 2), View(B[2], 3), View(B[3], 4, 301), 5,
                 200, 4)
    assert _only(rec) == ("pf_gdn_conv1d", {"ctx": 0x10, "m": vt(0, 1, 300), "window": vt(1, 2),
                                            "weight": vt(2, 3), "u": vt(3, 4, 301), "rows": 5,
                                            "conv_dim": 200, "kc": 4})
    rec.calls.clear()
    G.gdn_l2norm(CTX, View(B[0], 64, 192), 9, 2, 32, 3e-6, 0.25, head_stride=48)
    assert _only(rec) == ("pf_gdn_l2norm", {"ctx": 0x10, "x": vt(0, 64, 192), "rows": 9,
                                            "n_heads": 2, "head_dim": 32, "head_stride": 48,
                                            "eps": pytest.approx(3e-6), "scale": 0.25})
    rec.calls.clear()
    G.gdn_gates(CTX, View(B[0], 1, 64), View(B[1], 2, 65), View(B[2], 3), View(B[3], 4),
                View(B[4], 5, 66), View(B[5], 6, 67), 7, 32)
    name, got = _only(rec)
    a = got["args"]
    assert name == "pf_gdn_gates" and a["struct_size"] == ffi.sizeof("pf_gdn_gates_args")
    assert (a["b"], a["alpha"], a["ssm_a"], a["dt_bias"], a["beta"], a["g"], a["rows"],
            a["n_v_heads"]) == (vt(0, 1, 64), vt(1, 2, 65), vt(2, 3), vt(3, 4), vt(4, 5, 66),
                                vt(5, 6, 67), 7, 32)
    rec.calls.clear()
    G.gdn_gated_rms_norm(CTX, View(B[0], 1, 600), View(B[1], 2, 601), View(B[2], 3),
                         View(B[3], 4, 602), 5, 4, 128, 4e-6)
    name, got = _only(rec)
    a = got["args"]
    assert name == "pf_gdn_gated_rms_norm"
    assert (a["o"], a["z"], a["w"], a["y"], a["rows"], a["n_v_heads"], a["dv"]) == \
        (vt(0, 1, 600), vt(1, 2, 601), vt(2, 3), vt(3, 4, 602), 5, 4, 128)
    assert a["eps"] == pytest.approx(4e-6)
    rec.calls.clear()
    G.gdn_scan(CTX, View(B[0], 1, 1000), View(B[1], 2, 1001), View(B[2], 3, 1002),
               View(B[3], 4, 50), View(B[4], 5, 51), View(B[5], 6), View(B[6], 7, 1003), 77, 2,
               6, 64, 32, path="sequential")
    name, got = _only(rec)
    a = got["args"]
    assert name == "pf_gdn_scan" and a["struct_size"] == ffi.sizeof("pf_gdn_scan_args")
    assert (a["q"], a["k"], a["v"], a["beta"], a["g"], a["state"], a["o"]) == \
        (vt(0, 1, 1000), vt(1, 2, 1001), vt(2, 3, 1002), vt(3, 4, 50), vt(4, 5, 51), vt(5, 6),
         vt(6, 7, 1003))
    assert (a["rows"], a["n_k_heads"], a["n_v_heads"], a["dk"], a["dv"], a["path"]) == \
        (77, 2, 6, 64, 32, lib.PF_GDN_SCAN_SEQUENTIAL)
    rec.calls.clear()
    G.gdn_scan(CTX, *B[:7], 1, 1, 1, 16, 16)
    assert _only(rec)[1]["args"]["path"] == lib.PF_GDN_SCAN_AUTO


def test_gdn_varlen_wrapper(monkeypatch):
    """gdn_scan_varlen: the views, the scalars and the host arrays (read during the call: the
    wrapper keeps them alive only that long)."""
    seen = []

    class Lib:
        def __getattr__(self, name):
            if name != "pf_gdn_scan_varlen":
                return getattr(lib, name)

            def call(ctx, a):
                n = a.n_seqs
                seen.append({"ctx": _plain(ctx), **_plain(a),
                             "cu": [a.cu_seqlens[i] for i in range(n + 1)],
                             "idx": None if a.state_indices == ffi.NULL else
                             [a.state_indices[i] for i in range(n)]})
                return lib.PF_STATUS_OK
            return call

    monkeypatch.setattr(G, "lib", Lib())
    G.gdn_scan_varlen(CTX, View(B[0], 1, 1000), View(B[1], 2, 1001), View(B[2], 3, 1002),
                      View(B[3], 4, 50), View(B[4], 5, 51), View(B[5], 6), View(B[6], 7, 1003),
                      np.array([0, 3, 10, 12]), 9, 2, 6, 64, 32, state_indices=[8, 0, 4],
                      path="chunked", workspace=View(B[7], 512))
    G.gdn_scan_varlen(CTX, *B[:7], [0, 5], 1, 1, 1, 16, 16)
    a, b = seen
    assert a["ctx"] == 0x10 and a["struct_size"] == ffi.sizeof("pf_gdn_scan_varlen_args")
    assert (a["q"], a["k"], a["v"], a["beta"], a["g"], a["state"], a["o"], a["workspace"]) == \
        (vt(0, 1, 1000), vt(1, 2, 1001), vt(2, 3, 1002), vt(3, 4, 50), vt(4, 5, 51), vt(5, 6),
         vt(6, 7, 1003), vt(7, 512))
    assert (a["n_seqs"], a["n_states"], a["n_k_heads"], a["n_v_heads"], a["dk"], a["dv"], a["path"]) == \
        (3, 9, 2, 6, 64, 32, lib.PF_GDN_SCAN_CHUNKED)
    assert a["cu"] == [0, 3, 10, 12] and a["idx"] == [8, 0, 4]
    assert (b["n_seqs"], b["n_states"], b["cu"], b["idx"], b["path"], b["workspace"]) == \
        (1, 1, [0, 5], None, lib.PF_GDN_SCAN_AUTO, (0, 0, 0))


# ----------------------------------------------------------------------------- gemm


def test_gemm_wrappers(rec):
    gemm.project(CTX, W, View(B[0], 3, 70), View(B[1], 5, 100), 9, accumulate=True, leg="f16")
    assert _only(rec) == ("pf_project", {"ctx": 0x10, "w": 0x20, "x": vt(0, 3, 70),
                                         "y": vt(1, 5, 100), "rows": 9, "accumulate": 1,
                                         "leg": lib.PF_GEMM_F16})
    rec.calls.clear()
    gemm.project_f16x(CTX, W, View(B[0], 2), View(B[3], 1), View(B[1], 5, 100), 9, accumulate=True)
    assert _only(rec) == ("pf_project_f16x", {"ctx": 0x10, "w": 0x20, "x16": vt(0, 2),
                                              "inv": vt(3, 1), "y": vt(1, 5, 100), "rows": 9,
                                              "accumulate": 1})
    rec.calls.clear()
    gemm.project_f16x(CTX, W, View(B[0]), None, View(B[1]), 4)
    assert _only(rec)[1]["inv"] == 0          # NULL: every row unscaled
    rec.calls.clear()
    gemm.qgemm(CTX, W, View(B[0], 1, 65), View(B[1], 2, 97), 8)
    assert _only(rec) == ("pf_qgemm", {"ctx": 0x10, "w": 0x20, "x": vt(0, 1, 65),
                                       "y": vt(1, 2, 97), "rows": 8, "accumulate": 0})
    rec.calls.clear()
    gemm.qgemm_swiglu(CTX, W, B[0], View(B[1], 4, 50), 3)
    assert _only(rec) == ("pf_qgemm_swiglu", {"ctx": 0x10, "w": 0x20, "x": vt(0),
                                              "out": vt(1, 4, 50), "rows": 3})
    rec.calls.clear()
    gemm.qgemv(CTX, W, View(B[0], 6), View(B[1], 7), accumulate=True)
    assert _only(rec) == ("pf_qgemv", {"ctx": 0x10, "w": 0x20, "x": vt(0, 6), "y": vt(1, 7),
                                       "accumulate": 1})
    rec.calls.clear()
    gemm.dequantize(CTX, W, View(B[2], 9), f16=True)
    assert _only(rec) == ("pf_dequantize", {"ctx": 0x10, "w": 0x20, "out": vt(2, 9), "out_f16": 1})
    rec.calls.clear()
    gemm.embed(CTX, W, np.array([5, 1, 2], np.int64), View(B[3], 2, 80))
    name, got = _only(rec)
    assert name == "pf_embed" and (got["ctx"], got["table"], got["rows"], got["out"]) == \
        (0x10, 0x20, 3, vt(3, 2, 80))
    assert got["ids"] != 0
    rec.calls.clear()
    gemm.embed(CTX, W, [], B[3])
    assert _only(rec)[1]["ids"] == 0 and rec.calls[0][1]["rows"] == 0


# ----------------------------------------------------------------------------- attention


def test_attention_wrappers(rec):
    A.kv_write(CTX, View(B[0], 3, 1000), View(B[1], 4, 1001), B[2], B[3], rows=5, kv_dim=512,
               pos0=17, kv_dtype="f32")
    name, got = _only(rec)
    a = got["args"]
    assert name == "pf_kv_write" and a["struct_size"] == ffi.sizeof("pf_kv_write_args")
    assert (a["k"], a["v"], a["k_cache"], a["v_cache"], a["rows"], a["kv_dim"], a["pos0"],
            a["kv_dtype"]) == (vt(0, 3, 1000), vt(1, 4, 1001), 0x300, 0x400, 5, 512, 17,
                               lib.PF_KV_F32)
    rec.calls.clear()
    A.argmax(CTX, View(B[0], 2, 1003), View(B[1], 3), rows=5, n=1000)
    assert _only(rec) == ("pf_argmax", {"ctx": 0x10, "x": vt(0, 2, 1003), "out_ids": vt(1, 3),
                                        "rows": 5, "n": 1000})
    rec.calls.clear()
    A.attention(CTX, B[0], B[1], B[2], B[3], n_heads=8, n_kv_heads=2, head_dim=128, rows=7,
                pos0=3, path="cublas", q_head_stride=256, out_row_stride=1100)
    name, got = _only(rec)
    assert name == "pf_attention"
    assert (got["q"], got["k_cache"], got["v_cache"], got["out"]) == (0x100, 0x200, 0x300, 0x400)
    o = got["opts"]
    assert (o["n_heads"], o["n_kv_heads"], o["head_dim"], o["rows"], o["pos0"], o["path"],
            o["q_head_stride"], o["out_row_stride"]) == (8, 2, 128, 7, 3, lib.PF_ATTN_CUBLAS,
                                                         256, 1100)


def test_wrappers_check_their_arguments_before_the_library(rec):
    with pytest.raises(errors.InvalidArgumentError, match="x: expected a pyprefill Buffer or View"):
        R.rms_norm(CTX, np.zeros(4, np.float32), B[0], B[1], 1, 4, 1e-6)
    with pytest.raises(errors.InvalidArgumentError, match="View.buf must be a Buffer"):
        R.add(CTX, View(None), B[0], 1, 4)
    with pytest.raises(errors.InvalidArgumentError, match="ctx: expected a pyprefill Context"):
        G.gdn_scan(None, *B[:7], 1, 1, 1, 16, 16)
    with pytest.raises(errors.InvalidArgumentError, match="weight: expected a pyprefill Weight"):
        gemm.project(CTX, B[0], B[1], B[2], 1)
    with pytest.raises(errors.InvalidArgumentError, match="leg: unknown name"):
        gemm.project(CTX, W, B[1], B[2], 1, leg="bf16")
    with pytest.raises(errors.InvalidArgumentError, match="kv_dtype"):
        A.kv_write(CTX, B[0], B[1], B[2], B[3], rows=1, kv_dim=8, pos0=0, kv_dtype="q8")
    assert rec.calls == []
