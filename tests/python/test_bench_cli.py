"""CPU checks of pyprefill.bench: argument parsing, the no-GPU path, the timer's statistics on a
fake clock, the L2 rotation count, tables, JSON and the plot from synthetic rows. Nothing here
times anything real."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyprefill.bench import cli, report
from pyprefill.bench._common import Recorder
from pyprefill.bench.timer import (EventClock, HostClock, calls_per_batch, measure, rotation,
                                   summarize)

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "pyprefill" / "bench"
TINY = ROOT / "tests" / "data" / "qwen3_tiny.f32.gguf"


def _has_gpu() -> bool:
    from pyprefill.bench._common import detect_gpu
    return detect_gpu()[0]


def _args(*argv):
    return cli.resolve(cli.build_parser().parse_args(list(argv)))


def _bench(*argv):
    return subprocess.run([sys.executable, "-m", "pyprefill.bench", *argv], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


# ------------------------------------------------------------------------------ arguments

def test_help_names_both_forms():
    r = _bench("--help")
    assert r.returncode == 0, r.stderr
    for word in ("FILE", "kernels", "model", "all", "--out", "--quick", "--plot", "--peer", "--json",
                 "--gemm", "--chunk", "--models", "--lengths", "LEG/VARIANT", "nolt"):
        assert word in r.stdout


def test_scripts_bench_is_a_shim():
    shim = ROOT / "scripts" / "bench.py"
    assert len(shim.read_text().splitlines()) <= 10
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(shim), "--help"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and "kernels|model|all" in r.stdout, r.stderr


def test_pyprefill_bench_is_the_package(capsys):
    from pyprefill.cli import main
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    assert "llama-bench" in capsys.readouterr().out


def test_file_defaults_and_lengths_either_way():
    a = _args("m.gguf")
    assert a.suite is None and a.lengths == [512, 2048, 8192] and a.gemm == ["auto"]
    assert a.peer == "hf" and a.chunk == 2048
    assert _args("m.gguf", "-p", "512,2048", "--gemm", "f16,f32").lengths == [512, 2048]
    assert _args("m.gguf", "--lengths", "512", "4096,32768").lengths == [512, 4096, 32768]
    assert _args("m.gguf", "--gemm", "f16", "f32").gemm == ["f16", "f32"]


def test_suite_defaults_and_quick():
    a = _args("model")
    assert a.suite == "model" and a.models == ["qwen35-4b", "qwen3-4b"] and a.gemm == ["f16", "f32"]
    q = _args("all", "--quick", "--out", "x", "--models", "qwen3-0.6b,qwen35-0.8b")
    assert q.lengths == [512] and q.gemm == ["f16"] and q.reps <= 3 and q.model_reps <= 2
    assert q.models == ["qwen3-0.6b", "qwen35-0.8b"] and q.out == "x"
    assert _args("kernels", "--quick").models == ["qwen35-0.8b"]
    assert _args("kernels").families == ["gemm", "rows", "gdn", "attention"]
    assert _args("kernels", "--families", "gdn,attention").families == ["gdn", "attention"]


def test_leg_variants_name_their_tuning():
    """LEG/variant names the session tuning fields (pyprefill.tuning) the bench sets; nograph
    turns the session's CUDA graphs off."""
    from pyprefill.bench.model import split_leg
    assert split_leg("auto") == ("auto", {}, True)
    assert split_leg("auto/noqkrope") == ("auto", {"fuse_qk_rope": False}, True)
    assert split_leg("auto/norowregs") == ("auto", {"row_form": "staged"}, True)
    assert split_leg("auto/nolt") == ("auto", {"gemm_lt": "off"}, True)
    assert split_leg("f16/nolt/nograph") == ("f16", {"gemm_lt": "off"}, False)
    assert split_leg("auto/noconvnorm") == ("auto", {"fuse_conv_norm": False}, True)
    assert split_leg("auto/norowregs/noconvnorm") == ("auto", {"row_form": "staged", "fuse_conv_norm": False},
                                                      True)
    assert split_leg("f16/nofuse/noact16/nograph/noqkrope") == (
        "f16", {"fuse_groups": False, "f16_producers": False, "fuse_qk_rope": False}, False)
    assert split_leg("auto/seqscan/onepass/warpstate") == (
        "auto", {"gdn_scan": "sequential", "gdn_subpass_rows": "one-pass", "gdn_state": "warp"}, True)
    with pytest.raises(ValueError, match="'noqk'.*nograph, noqkrope"):
        split_leg("auto/noqk")
    try:                              # every variant's fields are the library's pf_tuning fields
        from pyprefill import tuning
    except ImportError:
        return                        # libprefill not loadable here: the names were checked above
    from pyprefill.bench.model import VARIANT_TUNING
    for fields in VARIANT_TUNING.values():
        tuning.new(fields)
    assert _args("model", "--gemm", "auto", "auto/noqkrope").gemm == ["auto", "auto/noqkrope"]
    assert _args("model", "--gemm", "auto", "auto/nolt").gemm == ["auto", "auto/nolt"]
    assert _args("model", "--gemm", "auto", "auto/noconvnorm").gemm == ["auto", "auto/noconvnorm"]


@pytest.mark.parametrize("argv, words", [
    (["m.gguf", "--models", "qwen3-4b"], "--models picks the model suite's presets"),
    (["all", "--json"], "the suites write JSON under --out"),
    (["all", "--out", "FILE"], "--out: FILE exists and is not a directory"),
    (["all", "--out", "FILE/sub"], "is not a directory"),
    (["model", "--gguf-dir", "FILE"], "--gguf-dir: FILE exists and is not a directory"),
    (["model", "--plot", "DIR"], "--plot: DIR is a directory"),
    (["kernels", "--decode", "16"], "--decode times a whole model's decode steps"),
])
def test_usage_errors(argv, words, tmp_path, capsys):
    """An option that does not apply to the mode, or an output that cannot be written: exit 2 and
    one line, on any machine, before a GPU is looked for."""
    (tmp_path / "f.txt").write_text("x")
    subst = {"FILE": str(tmp_path / "f.txt"), "FILE/sub": str(tmp_path / "f.txt" / "sub"),
             "DIR": str(tmp_path)}
    argv = [subst.get(a, a) for a in argv]
    words = words.replace("FILE", subst["FILE"]).replace("DIR", subst["DIR"])
    assert cli.run(cli.build_parser().parse_args(argv)) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv, words", [
    (["model", "--models", "qwen9-huge"], "argument --models: unknown preset 'qwen9-huge' (known: qwen3-0.6b"),
    (["m.gguf", "-p", "5x"], "argument -p/--lengths: '5x': [0] = '5x' is not a prompt length"),
    (["m.gguf", "-p", "0"], "argument -p/--lengths: '0': [0] = 0 is not a prompt length >= 1"),
    (["m.gguf", "-p", "512,,2048"], "argument -p/--lengths: '512,,2048': [1] is empty"),
    (["m.gguf", "-p", "512", "16,-1"], "argument -p/--lengths: '16,-1': [1] = -1 is not a prompt length >= 1"),
    (["kernels", "--families", "gdn,mla"], "argument --families: unknown family 'mla' (known: gemm, rows, gdn, attention)"),
    (["model", "--gemm", "f99"], "argument --gemm: unknown leg 'f99' in 'f99'"),
    (["m.gguf", "--gemm", "auto,f16/nofus"], "argument --gemm: unknown variant 'nofus' in 'f16/nofus'"),
    (["model", "--quant", "q3_xl"], "argument --quant: unknown quant mix 'q3_xl'"),
    (["batch", "--quant", "q3_xl"], "argument --quant: unknown quant mix 'q3_xl'"),
    (["kernels", "--shapes", "llama-7b"], "argument --shapes: unknown preset 'llama-7b'"),
    (["kernels", "--reps", "0"], "argument --reps: 0 is less than 1"),
    (["model", "--model-reps", "-2"], "argument --model-reps: -2 is less than 1"),
    (["m.gguf", "--chunk", "-1"], "argument --chunk: -1 is less than 0"),
    (["m.gguf", "--chunk", "2k"], "argument --chunk: '2k' is not an integer"),
    (["batch", "--steps", "2048,0"], "argument --steps: '2048,0': [1] = 0 is not a step size >= 1"),
    (["m.gguf", "--memory-budget", "-1"], "argument --memory-budget: -1 is not a positive number (GiB)"),
    (["m.gguf", "--memory-budget", "0"], "argument --memory-budget: 0 is not a positive number (GiB)"),
    (["m.gguf", "--memory-budget", "24G"], "argument --memory-budget: '24G' is not a number (GiB)"),
    (["m.gguf", "--memory-budget", "nan"], "argument --memory-budget: nan is not a positive number"),
    (["m.gguf", "--out", ""], "argument --out: an empty path"),
    (["", "-p", "16"], "argument FILE|kernels|model|all|batch|cache: an empty path"),
])
def test_values_are_checked_where_they_are_parsed(argv, words, capsys):
    """Each value is refused by argparse with its flag's name (exit 2), before anything runs."""
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"pyprefill bench: error: {words}" in err, err
    assert "Traceback" not in err


def test_plot_without_matplotlib_is_a_usage_error(tmp_path, monkeypatch, capsys):
    """--plot is checked before a benchmark runs, not skipped at its end."""
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert cli.main([str(TINY), "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "pyprefill bench: --plot: matplotlib is not installed (the `plot` extra: pip install matplotlib)"


def test_mix_is_a_deprecated_spelling_of_quant(capsys):
    """The quant mix is --quant, as `pyprefill synth` names it; --mix still works and warns."""
    assert _args("model", "--quant", "q8_0").mix == "q8_0"
    assert capsys.readouterr().err == ""
    assert _args("model", "--mix", "q8_0").mix == "q8_0"
    assert "--mix is deprecated" in capsys.readouterr().err and "--quant" in cli.build_parser().format_help()


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="no sysfs (a place no one may write)")
def test_unwritable_out_dir_is_a_usage_error(capsys):
    assert cli.main(["model", "--out", "/sys/pyprefill-bench"]) == 2
    assert "--out: /sys/pyprefill-bench: cannot write in /sys" in capsys.readouterr().err


def test_a_file_run_would_refuse_is_refused_before_the_gpu(tmp_path, capsys):
    """FILE gets the library's verdict (pf_model_inspect, as `run` gives it), GPU or not."""
    pytest.importorskip("pyprefill.model", reason="libprefill not loadable")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(TINY.read_bytes()[:5000])
    assert cli.main([str(bad), "-p", "16"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("pyprefill bench: GGUFFormatError: PF_STATUS_FORMAT_ERROR: ") and "truncated GGUF" in err


def test_bad_choice_fails():
    assert _bench("all", "--peer", "vllm").returncode != 0


@pytest.mark.parametrize("case, words", [
    ("missing", "MISSING: no such file (a GGUF file, or a suite: kernels, model, all, batch, cache)"),
    ("directory", "DIR: is a directory (a GGUF file, or a suite: kernels, model, all, batch, cache)"),
    ("fifo", "FIFO: not a regular file (a GGUF file, or a suite: kernels, model, all, batch, cache)"),
])
def test_a_file_that_is_not_one_is_named_on_any_machine(case, words, tmp_path, capsys):
    paths = {"MISSING": str(tmp_path / "missing.gguf"), "DIR": str(tmp_path / "adir"),
             "FIFO": str(tmp_path / "fifo.gguf")}
    os.mkdir(paths["DIR"])
    os.mkfifo(paths["FIFO"])
    key = {"missing": "MISSING", "directory": "DIR", "fifo": "FIFO"}[case]
    assert cli.main([paths[key]]) == 1
    assert capsys.readouterr().err.strip() == f"pyprefill bench: {words.replace(key, paths[key])}"


def _run_line(*argv) -> tuple[int, str]:
    """`pyprefill run ...`'s exit status and stderr, in a fresh interpreter."""
    r = subprocess.run([sys.executable, "-m", "pyprefill", "run", *argv], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    return r.returncode, r.stderr


@pytest.mark.skipif(_has_gpu(), reason="a GPU is present: the real run is device-check.sh's")
@pytest.mark.parametrize("argv", [["all", "--quick", "--out", "OUT"], ["FILE", "-p", "16", "--json"],
                                  ["FILE", "-p", "16", "--chunk", "0"],
                                  ["FILE", "--memory-budget", "24"], ["batch", "--quick"]],
                         ids=["suites", "file", "chunk-0", "memory-budget", "batch"])
def test_no_gpu_is_a_failure_with_runs_words(tmp_path, argv):
    """Nothing measured is no pass: exit 1, and on stderr the one line `pyprefill run` prints for
    this machine (the library's NoDeviceError and its reason, or why the library cannot load)."""
    argv = [str(tmp_path) if a == "OUT" else str(TINY) if a == "FILE" else a for a in argv]
    r = _bench(*argv)
    run_rc, run_err = _run_line(str(TINY), "--tokens", "1")
    assert r.returncode == 1 == run_rc, r.stdout + r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].removeprefix("pyprefill bench: ") == run_err.strip().splitlines()[0].removeprefix("pyprefill run: ")
    assert lines[0].startswith("pyprefill bench: ")
    assert not list(tmp_path.iterdir())            # no report written for a run that did not happen


@pytest.mark.skipif(_has_gpu(), reason="a GPU is present: the real run is device-check.sh's")
def test_no_gpu_with_a_plot_is_a_failure_too(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the `plot` extra) is not installed here")
    r = _bench(str(TINY), "-p", "16", "--plot", str(tmp_path / "p.png"))
    assert r.returncode == 1 and r.stderr.startswith("pyprefill bench: ") and not (tmp_path / "p.png").exists()


# ------------------------------------------------------------------------------ timer

class FakeDevice:
    """A clock that advances only when a call 'runs': call i costs costs[i] seconds."""

    def __init__(self, costs):
        self.t, self.costs, self.syncs, self.calls = 0.0, costs, 0, []

    def now(self):
        return self.t

    def synchronize(self):
        self.syncs += 1

    def call(self, i):
        self.calls.append(i)
        self.t += self.costs(i)


def test_measure_on_a_fake_clock():
    # unit u = 1/1024 s keeps the fake times exact. The probe (i = 2) costs u -> batches of 5
    # calls for a 5u target; batch r's calls cost (r + 1) u each: per-call times 1, 2, 3, 4 u
    u = 1 / 1024
    dev = FakeDevice(lambda i: u if i < 3 else u * (1 + (i - 3) // 5))
    setups = []
    t = measure(dev.call, HostClock(dev.synchronize, dev.now), reps=4, warmup=2, target_s=5 * u,
                max_calls=100, setup=setups.append)
    ms = 1e3 * u
    assert t["calls_per_batch"] == 5
    assert t["reps_ms"] == pytest.approx([ms, 2 * ms, 3 * ms, 4 * ms])
    assert t["median_ms"] == pytest.approx(2.5 * ms) and t["mean_ms"] == pytest.approx(2.5 * ms)
    assert t["min_ms"] == pytest.approx(ms) and t["max_ms"] == pytest.approx(4 * ms)
    assert t["std_ms"] == pytest.approx(1.2909944 * ms, rel=1e-6)  # sample std of 1, 2, 3, 4
    assert dev.calls == list(range(2 + 1 + 4 * 5))                 # warm-up, probe, batches
    assert dev.syncs == 2 * (1 + 4)                                 # around the probe and each batch
    assert setups == [0, 1, 2, 3, 8, 13, 18]                        # before each warm-up call and batch


def test_measure_batch_size_is_bounded():
    dev = FakeDevice(lambda i: 1e-9)
    t = measure(dev.call, HostClock(dev.synchronize, dev.now), reps=2, warmup=0, max_calls=7)
    assert t["calls_per_batch"] == 7
    dev = FakeDevice(lambda i: 1.0)
    t = measure(dev.call, HostClock(dev.synchronize, dev.now), reps=1, warmup=0)
    assert t["calls_per_batch"] == 1 and t["std_ms"] == 0.0


def test_event_clock_reads_elapsed_time_between_events():
    class Event:
        stamp = 0.0

        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            Event.stamp += 2.0          # ms
            self.t = Event.stamp

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.t - self.t

    class Torch:
        class cuda:
            pass
    Torch.cuda.Event = Event
    t = measure(lambda i: None, EventClock(Torch), reps=3, warmup=1, target_s=0.0)
    assert t["calls_per_batch"] == 1 and t["reps_ms"] == pytest.approx([2.0, 2.0, 2.0])


def test_summarize_and_calls_per_batch():
    s = summarize([3.0, 1.0, 2.0])
    assert s["median_ms"] == 2.0 and s["min_ms"] == 1.0 and s["max_ms"] == 3.0
    assert s["reps_ms"] == [3.0, 1.0, 2.0] and s["std_ms"] == pytest.approx(1.0)
    assert calls_per_batch(1.0, 0.02, 200) == 1 and calls_per_batch(1e-6, 0.02, 200) == 200
    assert calls_per_batch(0.004, 0.02, 200) == 5


def test_rotation_passes_twice_l2_when_a_set_fits():
    L2 = 50 << 20
    assert rotation(60 << 20, L2) == 1 and rotation(L2, L2) == 1      # one set already spills L2
    for size in (26 << 20, 10 << 20, 3 << 20):
        n = rotation(size, L2)
        assert n * size > 2 * L2 and (n - 1) * size <= 2 * L2
    assert rotation(1 << 10, L2) == 64 and rotation(1 << 10, L2, max_sets=8) == 8
    assert rotation(0, L2, max_sets=4) == 4


# ------------------------------------------------------------------------------ recorder

def test_recorder_skips_once_per_missing_peer_and_guards(capsys):
    from pyprefill.errors import UnsupportedError
    rec = Recorder()
    assert rec.optional("no_such_module_for_bench", "the peer") is None
    assert rec.optional("no_such_module_for_bench", "the peer") is None
    assert rec.guard("chunked scan", _raise, UnsupportedError("no chunked path yet")) is None
    assert rec.guard("attention", _raise, RuntimeError("boom\nmore")) is None
    assert rec.guard("fine", lambda: 7) == 7
    out = capsys.readouterr().out.splitlines()
    assert out == ["skipped: the peer: no_such_module_for_bench not importable "
                   "(No module named 'no_such_module_for_bench')",
                   "skipped: chunked scan: unsupported: no chunked path yet",
                   "skipped: attention: RuntimeError: boom"]
    assert [s["what"] for s in rec.skipped] == ["the peer", "chunked scan", "attention"]


def _raise(exc):
    raise exc


# ------------------------------------------------------------------------------ output

KERNEL_ROWS = [{"op": "proj attn_qkv", "T": 512, "impl": "ours f16 leg", "median_ms": 0.1,
                "std_ms": 0.002, "tflops": 200.0, "ratio_vs_peer": 0.9, "sets": 2, "note": ""}]
MODEL_ROWS = [
    {"model": "qwen35-4b", "impl": "ours f16", "T": 512, "median_ms": 20.0, "tok_s": 25600.0,
     "tok_s_std": 310.0, "ratio_vs_hf": 4.0, "size_bytes": 2.5 * 2**30, "params": 4.2e9,
     "roofline_tok_s": 1e5, "pct_roofline": 25.6, "load_ms": 900.0, "prewarm_ms": 18.0,
     "allocated_bytes": 11 * 2**30, "weight_bytes": 2.25 * 2**30, "f16_bytes": 7.5 * 2**30,
     "reps_ms": [19.8, 20.0, 20.4]},
    {"model": "qwen35-4b", "impl": "ours f16", "T": 2048, "median_ms": 40.0, "tok_s": 51200.0,
     "tok_s_std": 500.0, "ratio_vs_hf": 1.5, "size_bytes": 2.5 * 2**30, "params": 4.2e9},
    {"model": "qwen35-4b", "impl": "ours f32", "T": 2048, "error": "load: boom",
     "size_bytes": 2.5 * 2**30, "params": 4.2e9},
    {"model": "qwen35-4b", "impl": "HF bf16 sdpa+FLA", "T": 512, "median_ms": 80.0,
     "tok_s": 6400.0, "tok_s_std": 40.0},
    {"model": "qwen35-4b", "impl": "HF bf16 sdpa+FLA", "T": 2048, "median_ms": 60.0,
     "tok_s": 34133.3, "tok_s_std": 100.0},
]


def test_kernels_and_model_tables():
    t = report.kernels_table(KERNEL_ROWS)
    assert "| proj attn_qkv | 512 | ours f16 leg | 0.1000 | 0.0020 | 200.0 |  | 0.90 | 2 |" in t
    t = report.model_table(MODEL_ROWS, 700.0)
    assert "700.0 TF/s" in t
    assert "| qwen35-4b | ours f16 | 2048 | 40.00 | 51200 | 500 | 1.50 |" in t
    assert "| 11.00 | 2.25 | 7.50 |" in t and "load: boom" in t   # device, weights, fp16 cache GiB


def test_llama_bench_table():
    t = report.llama_table(MODEL_ROWS).splitlines()
    assert t[0] == ("| model | size | params | backend | test | t/s | HF bf16 sdpa+FLA t/s "
                    "| ours / HF |")
    assert t[2] == ("| qwen35-4b | 2.50 GiB | 4.20 B | CUDA pyprefill f16 | pp512 "
                    "| 25600.00 ± 310.00 | 6400.00 ± 40.00 | 4.00 |")
    assert "pp2048 | error: load: boom |" in t[4]
    assert len(t) == 2 + 3                                   # our rows only; HF as a column
    alone = report.llama_table([r for r in MODEL_ROWS if r["impl"].startswith("ours")])
    assert "HF" not in alone and alone.splitlines()[0].endswith("| test | t/s |")


def test_write_json_and_markdown(tmp_path):
    data = {"rows": MODEL_ROWS, "peak_fp16_tflops": 700.0, "args": {"plot": None}}
    report.write(str(tmp_path / "o"), "model", data, report.model_table(MODEL_ROWS, 700.0))
    back = json.loads((tmp_path / "o" / "bench_model.json").read_text())
    assert back["peak_fp16_tflops"] == 700.0 and back["rows"][0]["reps_ms"] == [19.8, 20.0, 20.4]
    assert (tmp_path / "o" / "bench_model.md").read_text().startswith("Whole-model prefill")
    report.write(None, "model", data, "")                   # no --out: nothing written


def test_plot_from_rows(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (the `plot` extra) is not installed here")
    rec = Recorder()
    path = tmp_path / "p" / "bench_model.png"
    assert report.plot(MODEL_ROWS + [dict(MODEL_ROWS[0], model="qwen3-4b")], str(path), rec)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not rec.skipped


def test_plot_without_matplotlib_or_rows_is_one_skipped_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)       # import matplotlib -> ImportError
    rec = Recorder()
    assert not report.plot(MODEL_ROWS, str(tmp_path / "p.png"), rec)
    assert not report.plot(KERNEL_ROWS, str(tmp_path / "p.png"), rec)
    assert [s["what"] for s in rec.skipped] == ["plot", "plot"]
    assert "matplotlib not importable" in rec.skipped[0]["why"]
    assert not (tmp_path / "p.png").exists()


# ------------------------------------------------------------------------------ structure

FAMILIES = ("gemm", "rows", "gdn", "attention")


@pytest.mark.parametrize("family", FAMILIES)
def test_wrapper_calls_live_in_one_adapter_block(family):
    """`K.` (the family's pyprefill.kernels module) appears only between the adapter markers."""
    lines = (PKG / f"{family}.py").read_text().splitlines()
    start = next(i for i, s in enumerate(lines) if s.startswith("# -- the wrapper calls"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("# ----"))
    outside = [s for i, s in enumerate(lines) if not start <= i <= end and "K." in s
               and not s.startswith("from ..kernels import")]
    assert outside == [] and any("K." in s for s in lines[start:end])


def test_no_raw_library_calls_or_path_edits():
    for path in PKG.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"\blib\.pf_|_ffi|sys\.path", text), path.name


def test_shapes_come_from_the_presets():
    pytest.importorskip("pyprefill.kernels.gemm", reason="libprefill not loadable")
    from pyprefill.bench import attention, gdn, gemm
    from pyprefill.formats.synth import preset_desc
    d = preset_desc("qwen35-4b")
    assert gemm.projections() == [("attn_qkv", 8192, 2560), ("ffn_gate", 9216, 2560),
                                   ("ffn_gate_up", 18432, 2560), ("ffn_down", 2560, 9216)]
    # the issue-31 shapes: qwen35-27b's fused gate|up and its down projection
    big = dict((name, (n, k)) for name, n, k in gemm.projections("qwen35-27b"))
    assert big["ffn_gate_up"] == (34816, 5120) and big["ffn_down"] == (5120, 17408)
    assert gemm.projections()[0] == ("attn_qkv", d.conv_dim, d.n_embd)
    heads = [(preset_desc(m).ssm_hk, preset_desc(m).ssm_hv, preset_desc(m).ssm_dk)
             for m in gdn.SHAPES]
    assert heads == [(16, 32, 128), (16, 48, 128)]
    attn = [(preset_desc(m).n_head, preset_desc(m).n_head_kv, preset_desc(m).head_dim)
            for m in attention.SHAPES]
    assert attn == [(16, 4, 256), (32, 8, 128)]
    assert attention.causal_pairs(4, 0) == 10 and attention.causal_pairs(2, 3) == 4 + 5


def test_param_counts_of_a_tiny_model():
    from pyprefill.bench.model import param_counts
    from pyprefill.formats.gguf_model import load_model_desc
    desc = load_model_desc(str(TINY))
    total, non_embd = param_counts(desc)
    embd = sum(int(__import__("numpy").prod(t.shape)) for n, t in desc.tensors.items()
               if n in ("token_embd.weight", "output.weight"))
    assert total == non_embd + embd and 0 < non_embd < total


@pytest.mark.parametrize("preset", ["qwen3-tiny", "qwen35-tiny"])
def test_build_hf_tiny(tmp_path, preset):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pyprefill.bench.model import build_hf
    from pyprefill.formats.synth import write_synthetic
    path = tmp_path / f"{preset}.gguf"
    write_synthetic(preset, "q4_k_m", path, progress=False)
    # With flash-linear-attention installed, HF's Qwen3.5 runs FLA's Triton kernels, which need
    # CUDA tensors: build the peer where it will run.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_hf(torch, str(path), device=device)
    assert next(model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        ids = torch.randint(0, model.config.vocab_size, (1, 16), device=device)
        out = model(ids, use_cache=False, logits_to_keep=1)
    assert out.logits.shape[-2:] == (1, model.config.vocab_size)
    assert torch.isfinite(out.logits.float()).all()


def test_batch_table_ratios_against_singles_and_hf():
    """The batch suite's report is a pure function of its rows: each batch row over the single
    calls and the HF batch of its case."""
    from pyprefill.bench import batch
    t = {"median_ms": 100.0, "reps_ms": [100.0]}
    rows = [batch._row("m", "16x512", "ours batch step 2048", 8192, t),
            batch._row("m", "16x512", "ours single calls", 8192, {**t, "median_ms": 150.0}),
            batch._row("m", "16x512", "HF bf16 batched (padded)", 8192, {**t, "median_ms": 300.0}),
            batch._row("m", "32 ragged", "ours batch step 2048", 100, error="OutOfMemoryError: x")]
    batch._ratios(rows)
    assert rows[0]["ratio_vs_singles"] == pytest.approx(1.5)
    assert rows[0]["ratio_vs_hf"] == pytest.approx(3.0)
    text = batch.table(rows)
    assert "| m | 16x512 | ours batch step 2048 | 100.000 | 81920 | 1.50 | 3.00 |" in text
    assert "OutOfMemoryError: x" in text
