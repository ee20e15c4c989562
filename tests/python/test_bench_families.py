"""The kernel families of pyprefill.bench on a fake device (CPU): every adapter's call binds to
the wrapper signature the benchmarks assume, every View stays inside its buffer, and a path the
build lacks (UnsupportedError) is one skipped line. Nothing is timed for real."""
import inspect
import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("pyprefill.kernels.gemm", reason="libprefill not loadable")

from pyprefill.bench import _common, attention, gdn, gemm, rows  # noqa: E402
from pyprefill.errors import UnsupportedError  # noqa: E402


class FakeBuf:
    def __init__(self, nbytes):
        self.nbytes = int(nbytes)

    def poison(self):
        pass

    def fill(self, value):
        pass

    def copy_from(self, src):
        assert src.nbytes == self.nbytes

    def close(self):
        pass


class FakeWeight(FakeBuf):
    def __init__(self, n, k):
        super().__init__(n * k)
        self.n, self.k = n, k


class FakeCtx:
    def upload(self, arr):
        if arr.dtype == np.int32:   # a page table: a permutation of the pool's pages
            assert sorted(arr.tolist()) == list(range(arr.size))
            return FakeBuf(arr.nbytes)
        assert arr.dtype in (np.float32, np.float16) and np.isfinite(arr).all() and np.any(arr != 0)
        return FakeBuf(arr.nbytes)

    def buffer(self, nbytes):
        return FakeBuf(nbytes)

    def weight(self, qtype, n, k, data):
        return FakeWeight(n, k)

    def synchronize(self):
        pass

    def set_tuning(self, tuning=None, **fields):
        from pyprefill import tuning as T
        T.new({**(tuning or {}), **fields})      # the field names and values must be valid
        self.tuning_now = {**(tuning or {}), **fields}


@dataclass(frozen=True)
class View:
    buf: FakeBuf
    off: int = 0
    ld: int = 0


# The benchmarks call the real wrappers' signatures (bound with inspect: a wrong call is a
# TypeError here instead of a skipped line on the GPU).
from pyprefill.kernels import attention as KA, gdn as KD, gemm as KG, rows as KR  # noqa: E402

API = {"gemm": [KG.project, KG.project_f16x, KG.weight_cache_f16, KG.dequantize],
       "rows": [KR.rms_norm, KR.rope_neox, KR.swiglu],
       "gdn": [KD.gdn_conv1d, KD.gdn_l2norm, KD.gdn_gates, KD.gdn_scan, KD.gdn_scan_varlen],
       "attention": [KA.kv_write, KA.attention]}


def fake_module(family, calls):
    mod = types.SimpleNamespace(View=View, tile_page_rows=KA.tile_page_rows)   # pure: no device
    for fn in API[family]:
        name = fn.__name__.rstrip("_")

        def wrapper(*args, _fn=fn, _name=name, **kw):
            bound = inspect.signature(_fn).bind(*args, **kw)     # TypeError on a wrong call
            bound.apply_defaults()
            a = bound.arguments
            for arg, v in a.items():
                if isinstance(v, View):
                    elems = v.buf.nbytes // (2 if arg == "x16" else 4)   # x16: fp16 elements
                    # rows: the call's, or a varlen call's total (cu_seqlens[-1])
                    rows = a["cu_seqlens"][-1] if "cu_seqlens" in a else a.get("rows")
                    need = rows * v.ld if v.ld else 1
                    assert 0 <= v.off and v.off + need <= elems, (_name, arg, v, rows)
            calls.append((_name, a))
        setattr(mod, name, wrapper)
    return mod


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.setattr(sys.modules["pyprefill.formats.quant"], "random_blocks",
                        lambda n, k, q, rng: np.ones((n, 1), np.uint8))
    rec = _common.Recorder()
    return _common.Bench(rec, FakeCtx(), None, reps=1, quick=True, legs=("f16", "f32"))


@pytest.mark.parametrize("family", [gemm, rows, gdn, attention],
                         ids=lambda m: m.__name__.split(".")[-1])
def test_family_on_a_fake_device(family, bench, monkeypatch):
    calls = []
    name = family.__name__.split(".")[-1]
    monkeypatch.setattr(family, "K", fake_module(name, calls))
    family.run(bench, [64])
    called = {c[0] for c in calls}
    assert called == {f.__name__.rstrip("_") for f in API[name]}
    ours = [r for r in bench.rec.rows if r["impl"].startswith("ours")]
    varlen = [r for r in ours if r["op"].startswith("delta-rule varlen")]
    assert ours and all(r["median_ms"] > 0 and r["T"] in (0, 64) for r in ours if r not in varlen)
    assert bench.rec.skipped == []
    if name == "gdn":          # both paths, one call of T and four of T/4 on a carried state
        assert {r["op"] for r in ours} >= {"delta-rule Hk16/Hv32",
                                           "delta-rule Hk16/Hv32 4x16 carried"}
        scans = [a for n, a in calls if n == "gdn_scan"]
        assert {a["rows"] for a in scans} == {64, 16}
        assert {a["path"] for a in scans} == {"sequential", "chunked"}
        # --quick: the smallest of the issue's varlen cases, 8 sequences of 1024 tokens, on the
        # default path (with the target) and the warpgroup state kernel's two forms by name
        assert [(r["op"], r["T"], r["impl"], r.get("target_ms")) for r in varlen] == \
            [("delta-rule varlen 8x1024 Hk16/Hv32", 8192, "ours fp32", 0.11),
             ("delta-rule varlen 8x1024 Hk16/Hv32", 8192, "ours wg-single fp32", None),
             ("delta-rule varlen 8x1024 Hk16/Hv32", 8192, "ours wg-pair fp32", None)]
        v = [a for n, a in calls if n == "gdn_scan_varlen"]
        assert v and all(list(a["cu_seqlens"]) == [1024 * i for i in range(9)] and
                         a["n_states"] == 8 and a["path"] == "auto" for a in v)
    if name == "attention":    # both flash kernels by name and the cuBLAS path, paged too
        assert {r["impl"] for r in ours} == {"ours flash wgmma", "ours flash mma", "ours cublas",
                                            "ours flash wgmma paged 256", "ours flash wgmma paged tile",
                                            "ours flash mma paged 256"}
        att = [a for n, a in calls if n == "attention"]
        assert {(a["kw"]["path"], a["kw"]["kernel"], a["kw"]["page_rows"]) for a in att} == {
            ("flash", "wgmma", 0), ("flash", "mma", 0), ("cublas", "auto", 0), ("flash", "wgmma", 256),
            ("flash", "wgmma", 320), ("flash", "mma", 256)}   # qwen35-4b (--quick): head_dim 256
        assert all((a["page_table"] is None) == (a["kw"]["page_rows"] == 0) for a in att)
    if name == "gemm":
        assert {r["impl"] for r in ours} == {"ours f16 leg", "ours f16 leg, fp16 x", "ours f32 leg",
                                            "ours -> fp16"}
        assert {a["leg"] for n, a in calls if n == "project"} == {"f16", "f32"}


def test_gdn_bench_knows_where_the_default_chains():
    """The onepass row is timed only where the default chains sub-passes: calls of 2048 rows (two
    of 1024, kGdnShortSubpassRows) and longer ones (2048 each), not shorter ones."""
    assert [gdn.default_chains(r) for r in (64, 1024, 2047, 2048, 4096, 8192)] == \
        [False, False, False, True, True, True]


def test_attention_shapes_include_issue_40s_64_head_case():
    """The attention family's shapes: qwen35-4b alone with --quick; else both presets and the
    64-query-head / 8-KV-head hd128 case issue 40 names (no preset has it)."""
    quick = attention.shapes(True)
    assert [label for label, _ in quick] == ["qwen35-4b"]
    full = {label: (d.n_head, d.n_head_kv, d.head_dim) for label, d in attention.shapes(False)}
    assert full == {"qwen35-4b": (16, 4, 256), "qwen3-4b": (32, 8, 128), "64q/8kv": (64, 8, 128)}


def test_gdn_without_variants_runs_the_default_path_once(monkeypatch):
    """--no-variants: the delta rule's rows are the default (chunked, no tuning) call of T and
    the varlen cases; no sequential path, no carried parts, no tuning variants."""
    monkeypatch.setattr(sys.modules["pyprefill.formats.quant"], "random_blocks",
                        lambda n, k, q, rng: np.ones((n, 1), np.uint8))
    b = _common.Bench(_common.Recorder(), FakeCtx(), None, reps=1, quick=True, variants=False)
    calls = []
    monkeypatch.setattr(gdn, "K", fake_module("gdn", calls))
    gdn.run(b, [64])
    scans = [a for n, a in calls if n == "gdn_scan"]
    assert scans and {(a["rows"], a["path"]) for a in scans} == {(64, "chunked")}
    ours = {(r["op"], r["impl"]) for r in b.rec.rows if r["op"].startswith("delta-rule")}
    assert ours == {("delta-rule Hk16/Hv32", "ours chunked fp32"),
                    ("delta-rule varlen 8x1024 Hk16/Hv32", "ours fp32")}
    assert b.rec.skipped == []


class FakeSession:
    def __init__(self, n_vocab, max_tokens=None):
        self.n_vocab, self.resets, self.max_tokens, self.pos = n_vocab, 0, max_tokens, 0
        self.generated = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def reset(self):
        self.resets += 1
        self.pos = 0

    def prefill(self, ids, logits="last"):
        assert ids.dtype == np.int32 and 0 <= ids.min() and ids.max() < self.n_vocab
        self.pos += len(ids)
        assert self.max_tokens is None or self.pos <= self.max_tokens
        return np.ones(self.n_vocab, np.float32) if logits == "last" else None

    def generate(self, n):
        assert self.pos > 0, "generate needs a prior prefill"
        self.pos += n
        assert self.max_tokens is None or self.pos <= self.max_tokens, (self.pos, self.max_tokens)
        self.generated.append(n)
        return np.zeros(n, np.int32)


class FakeModel:
    n_vocab = 1024

    def __init__(self, path, **kw):
        self.info = {"load_ms": 5.0, "prewarm_ms": 1.0, "f16_armed": 1, "weight_bytes": 10,
                     "f16_bytes": 20}

    def prewarm_report(self):
        return {"armed": True, "bytes_read": 10, "bytes_added": 20, "device_ms": 0.5}

    load = classmethod(lambda cls, path, **kw: cls(path, **kw))

    def session(self, *, max_tokens, chunk, gemm, graphs=True, tuning=None):
        if gemm == "int8":
            raise UnsupportedError("the int8 leg is reserved")
        from pyprefill import tuning as T
        T.new(tuning)                             # the field names and values must be valid
        self.last_session = FakeSession(self.n_vocab, max_tokens)
        return self.last_session

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class FakeContext(FakeCtx):
    def __init__(self, device):
        pass

    def memory(self):
        return 100, 200

    def allocated(self):
        return 50

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_prewarm_figures_against_the_copy():
    from pyprefill.bench import model
    rep = {"armed": True, "bytes_read": 2 * 10**9, "bytes_added": 8 * 10**9, "device_ms": 2.5}
    f = model.prewarm_figures(rep, 4.0, 4000.0)                      # 10 GB in 4 ms: 2500 GB/s
    assert f["prewarm_bytes"] == 10**10
    assert f["prewarm_gbs"] == pytest.approx(2500.0) and f["prewarm_pct_copy"] == pytest.approx(62.5)
    assert f["prewarm_device_gbs"] == pytest.approx(4000.0)
    assert f["prewarm_device_pct_copy"] == pytest.approx(100.0) and f["copy_gbs"] == 4000.0
    assert model.prewarm_figures(None, 4.0, None, 10**10) == {"prewarm_bytes": 10**10,
                                                               "prewarm_gbs": 2500.0}
    assert model.copy_bytes_for(10 << 30, 100 << 30) == 2 << 30     # capped at 2 GiB
    assert model.copy_bytes_for(1 << 20, 100 << 30) == 256 << 20    # at least 256 MiB
    assert model.copy_bytes_for(10 << 30, 1 << 30) == 256 << 20     # a quarter of free memory


def test_whole_model_rows_on_a_fake_device(monkeypatch):
    import os

    import pyprefill.core
    import pyprefill.model
    from pyprefill.bench import model, report
    from pyprefill.formats.gguf_model import load_model_desc
    monkeypatch.setattr(pyprefill.core, "Context", FakeContext)
    monkeypatch.setattr(pyprefill.model, "Model", FakeModel)
    path = os.path.join(os.path.dirname(__file__), "..", "data", "qwen3_tiny.f32.gguf")
    rec = _common.Recorder()
    rows = model.bench_gguf(rec, path, "tiny", [16, 32], ["f16", "int8"], reps=2, peer="none",
                            peak_tflops=1.0)
    _, non_embd = model.param_counts(load_model_desc(path))
    good = [r for r in rows if r["impl"] == "ours f16"]
    assert [r["T"] for r in good] == [16, 32] and all(len(r["reps_ms"]) == 2 for r in good)
    for r in good:
        assert r["tok_s"] > 0 and r["size_bytes"] == os.path.getsize(path)
        assert r["roofline_tok_s"] == pytest.approx(1e12 / (2 * non_embd))
        assert r["pct_roofline"] == pytest.approx(100 * r["tok_s"] / r["roofline_tok_s"])
        assert r["load_ms"] == 5.0 and r["device_used_bytes"] == 0 and "ratio_vs_hf" not in r
        assert r["prewarm_bytes"] == 30 and r["prewarm_gbs"] == pytest.approx(30 / 1e6)
        assert r["prewarm_device_gbs"] == pytest.approx(60 / 1e6)
        assert r["copy_gbs"] > 0
        assert r["prewarm_pct_copy"] == pytest.approx(100 * r["prewarm_gbs"] / r["copy_gbs"])
    bad = [r for r in rows if r["impl"] == "ours int8"]
    assert [r["error"] for r in bad] == ["UnsupportedError: the int8 leg is reserved"] * 2
    assert [s["what"] for s in rec.skipped] == ["ours tiny int8 T=16", "ours tiny int8 T=32"]
    table = report.llama_table(rows)
    assert "| tiny |" in table and "| pp32 |" in table and "error: UnsupportedError" in table


def test_decode_rows_on_a_fake_device(monkeypatch):
    """--decode N: after each length's prefill row, a row of N greedy steps after a prompt of that
    length (the session sized for both, the prompt prefilled untimed before each call), tok_s the
    decoded tokens a second, no prefill roofline or HF ratio; llama-bench's "tg<N> @ d<T>"."""
    import os

    import pyprefill.core
    import pyprefill.model
    from pyprefill.bench import model, report
    monkeypatch.setattr(pyprefill.core, "Context", FakeContext)
    monkeypatch.setattr(pyprefill.model, "Model", FakeModel)
    path = os.path.join(os.path.dirname(__file__), "..", "data", "qwen3_tiny.f32.gguf")
    rows = model.bench_gguf(_common.Recorder(), path, "tiny", [16, 32], ["f16"], reps=2, peer="none",
                            peak_tflops=1.0, decode=8)
    assert [(r["impl"], r["T"]) for r in rows] == [("ours f16", 16), ("ours f16 tg8", 16),
                                                  ("ours f16", 32), ("ours f16 tg8", 32)]
    for r in rows[1::2]:
        assert r["decode_tokens"] == 8 and len(r["reps_ms"]) == 2
        assert r["tok_s"] == pytest.approx(8 / (r["median_ms"] * 1e-3))
        assert r["ms_per_token"] == pytest.approx(r["median_ms"] / 8)
        assert "pct_roofline" not in r and "ratio_vs_hf" not in r and "error" not in r
    assert "pct_roofline" in rows[0]
    table = report.llama_table(rows)
    assert "| tg8 @ d32 |" in table and "| pp32 |" in table


def test_leg_variant_tuning_reaches_the_session(monkeypatch):
    """"auto/noqkrope" creates its sessions with the tuning field fuse_qk_rope off and
    "auto/nograph" without CUDA graphs; the plain leg with neither; the process environment is
    never touched."""
    import os

    import pyprefill.core
    import pyprefill.model
    from pyprefill.bench import model
    seen = []

    class TuningModel(FakeModel):
        def session(self, *, max_tokens, chunk, gemm, graphs=True, tuning=None):
            seen.append((gemm, graphs, tuning))
            return super().session(max_tokens=max_tokens, chunk=chunk, gemm=gemm, graphs=graphs,
                                   tuning=tuning)

    monkeypatch.setattr(pyprefill.core, "Context", FakeContext)
    monkeypatch.setattr(pyprefill.model, "Model", TuningModel)
    env = dict(os.environ)
    rows = model.bench_ours(_common.Recorder(), "unused.gguf", "tiny", [16],
                            ["auto", "auto/noqkrope", "auto/nograph"],
                            chunk=16, reps=2, rng=np.random.default_rng(0))
    assert seen == [("auto", True, {}), ("auto", True, {"fuse_qk_rope": False}), ("auto", False, {})]
    assert dict(os.environ) == env
    assert [(r["impl"], "error" in r) for r in rows] == [
        ("ours auto", False), ("ours auto/noqkrope", False), ("ours auto/nograph", False)]


def test_cli_file_and_model_suite_on_a_fake_device(monkeypatch, tmp_path, capsys):
    import json
    import os

    import pyprefill.core
    import pyprefill.model
    from pyprefill.bench import cli
    monkeypatch.setattr(pyprefill.core, "Context", FakeContext)
    monkeypatch.setattr(pyprefill.model, "Model", FakeModel)
    monkeypatch.setattr(cli, "_no_device_line", lambda suite: None)   # a device is there
    path = os.path.join(os.path.dirname(__file__), "..", "data", "qwen3_tiny.f32.gguf")
    assert cli.main([path, "-p", "16,32", "--peer", "none", "--json", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    res = json.loads(out.out)                       # progress went to stderr: stdout is JSON
    assert [r["T"] for r in res["rows"]] == [16, 32] and res["args"]["gemm"] == ["auto"]
    assert (tmp_path / "bench_qwen3_tiny.f32.json").exists()
    assert "| pp16 |" in (tmp_path / "bench_qwen3_tiny.f32.md").read_text()

    argv = ["model", "--models", "qwen3-tiny", "-p", "16", "--gemm", "f16", "--peer", "none",
            "--gguf-dir", str(tmp_path), "--out", str(tmp_path), "--model-reps", "2"]
    assert cli.main(argv) == 0
    data = json.loads((tmp_path / "bench_model.json").read_text())
    assert [(r["model"], r["impl"], r["T"]) for r in data["rows"]] == [("qwen3-tiny", "ours f16", 16)]
    assert (tmp_path / "bench-qwen3-tiny-q4_k_m.gguf").exists()
    assert "| qwen3-tiny | ours f16 | 16 |" in capsys.readouterr().out
