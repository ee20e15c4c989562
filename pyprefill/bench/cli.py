"""Benchmarks on a GPU: one GGUF's prefill tokens/s, or the kernel and whole-model suites.

    pyprefill bench FILE [-p 512,2048,8192] [--gemm auto] [--chunk N] [--peer hf|none]
                         [--json] [--plot FILE.png] [--memory-budget GIB ...] [--decode N]
    pyprefill bench kernels|model|all [--out DIR] [--quick] [--lengths 512,2048,8192]
                         [--models qwen35-4b,qwen3-4b] [--gemm f16,f32] [--plot FILE.png]
    pyprefill bench batch [--models ...] [--steps 2048] [--peer hf|none] [--quick]
    pyprefill bench cache [--models ...] [--quick]

FILE: prefill tokens/s of one GGUF as a llama-bench style table (test "pp512", t/s ± std),
with the HF transformers peer alongside when torch and transformers are importable; --decode N
adds N greedy decode steps after each prompt (test "tg<N> @ d<prompt>"). Suites:
kernels (the gemm, rows, gdn and attention families, each next to its peer) and whole-model
prefill on synthetic GGUFs of real shapes; batch (many prompts in one batch against the same
prompts one call each and HF transformers batched with padding; decode steps of 64 sessions
against one; fork and snapshot rollback at 8192 tokens); cache (the prefix-reuse traces of
issue 39, chat and branching: time to first token p50 / p99 and the tokens prefilled against the
minimum, with model.prefix_cache against cold prefills); bench_<suite>.json (every repeat) and
bench_<suite>.md under --out. --plot draws tok/s against prompt length, ours against each
peer. `python3 -m pyprefill.bench` takes the same arguments.

Missing peers (torch, FLA, transformers) each print one "skipped: <what>: <why>" line and the run
goes on. Every value is checked where it is parsed, and a FILE by the library, before a GPU is
looked for (exit status 2 for a usage error, 1 for a file the library refuses); --plot without
matplotlib is a usage error. Without a usable GPU the reason goes to stderr in the words of
`pyprefill run` and the exit status is 1: no benchmark ran.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .._cli_args import (DeprecatedOption, flatten, int_in, int_list, name_list, nonempty_path,
                         positive_float, user_error_line)
from .._defaults import DEFAULT_STEP_TOKENS
from ..errors import PrefillError
from ..formats.synth import MIXES, PRESETS
from . import report
from ._common import Bench, Recorder, detect_gpu, meta
from .model import VARIANT_TUNING

LEG_NAMES = ("auto", "f16", "f32", "int8", "default")   # pf_gemm_leg (include/prefill.h)

SUITES = ("kernels", "model", "all", "batch", "cache")
FAMILIES = ("gemm", "rows", "gdn", "attention")
LENGTHS = [512, 2048, 8192]
MODELS = ["qwen35-4b", "qwen3-4b"]
QUICK_MODELS = ["qwen35-0.8b"]
BATCH_MODELS = ["qwen35-4b", "qwen3-4b", "qwen35-0.8b"]
CACHE_MODELS = ["qwen35-4b"]


class UsageError(Exception):
    pass


def _leg_problem(leg: str) -> str | None:
    """Why --gemm's LEG[/VARIANT...] is wrong, or None."""
    base, *variants = leg.split("/")
    if base == "blocks" and not variants:   # the kernel suite's f16 leg on the GGUF blocks (resolve)
        return None
    if base not in LEG_NAMES:
        return f"unknown leg {base!r} in {leg!r} (known: {', '.join(LEG_NAMES)})"
    unknown = [v for v in variants if v not in VARIANT_TUNING]
    if unknown:
        return f"unknown variant {unknown[0]!r} in {leg!r} (known: {', '.join(VARIANT_TUNING)})"
    return None


def _preset(text: str) -> str:
    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown preset {text!r} (known: {', '.join(PRESETS)})")
    return text


def _mix(text: str) -> str:
    if text.lower() not in MIXES:
        raise argparse.ArgumentTypeError(f"unknown quant mix {text!r} (known: {', '.join(MIXES)})")
    return text.lower()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every value is checked here, where argparse parses it: a bad one is a usage error naming
    its flag (exit 2) before anything runs."""
    p.add_argument("target", metavar="FILE|" + "|".join(SUITES), type=nonempty_path,
                   help="a GGUF file, or the suite to run")
    p.add_argument("-p", "--lengths", nargs="+", metavar="N",
                   type=int_list(1, noun="lengths", what="a prompt length"),
                   help="prompt lengths, comma or space separated "
                        f"(default {','.join(map(str, LENGTHS))}; --quick: 512)")
    p.add_argument("--gemm", nargs="+", metavar="LEG",
                   type=name_list(LEG_NAMES, noun="leg", check=_leg_problem),
                   help="projection legs: auto, f16, f32, int8; LEG/VARIANT runs LEG with one "
                        "tuning field changed (combinable: LEG/nofuse/noact16/nograph): nofuse, "
                        "noact16, nograph, noqkrope, norowregs, nolt, noconvnorm, seqscan, "
                        "onepass, warpstate, blocks, noblocks, nogemv (pyprefill.bench.model.VARIANT_TUNING; "
                        "before/after in one run); the kernel suite also takes blocks (the f16 leg "
                        "on the GGUF blocks against cuBLAS on the cache) "
                        "(default: FILE auto, suites f16,f32)")
    p.add_argument("--chunk", type=int_in(0), default=DEFAULT_STEP_TOKENS,
                   help=f"session chunk: rows per internal step (default {DEFAULT_STEP_TOKENS}; "
                        "0 = the session's own, as `run --chunk 0`)")
    p.add_argument("--peer", choices=["hf", "none"], default="hf",
                   help="whole-model peer: HF transformers bf16 sdpa (+FLA), or none")
    p.add_argument("--json", action="store_true", help="FILE: print the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", type=nonempty_path,
                   help="tok/s against prompt length (needs matplotlib: the `plot` extra)")
    p.add_argument("--out", metavar="DIR", type=nonempty_path,
                   help="write bench_<name>.json and bench_<name>.md here")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: T=512, one shape per family, qwen35-0.8b, the f16 leg, "
                        "few repeats")
    p.add_argument("--families", nargs="+", metavar="NAME",
                   type=name_list(FAMILIES, noun="family", nouns="families"),
                   help=f"kernel suite: the families to run (default {','.join(FAMILIES)})")
    p.add_argument("--shapes", default="qwen35-4b", metavar="PRESET", type=_preset,
                   help="kernel suite: the synth preset whose projection shapes gemm runs "
                        "(default qwen35-4b)")
    p.add_argument("--models", nargs="+", metavar="PRESET", type=name_list(PRESETS, noun="preset"),
                   help=f"model suite: formats.synth presets (default {','.join(MODELS)})")
    p.add_argument("--quant", dest="mix", default="q4_k_m", type=_mix,
                   help="model and batch suites: quant mix of the synthetic GGUFs, as `pyprefill "
                        "synth --quant` takes it (default q4_k_m)")
    p.add_argument("--mix", dest="mix", action=DeprecatedOption, new="--quant", type=_mix,
                   why="`pyprefill synth` calls it --quant")
    p.add_argument("--gguf-dir", type=nonempty_path,
                   help="model suite: where synthetic GGUFs are written and reused "
                        "(default: the temp dir)")
    p.add_argument("--reps", type=int_in(1), default=7, help="timed batches per kernel (median)")
    p.add_argument("--model-reps", type=int_in(1), default=5,
                   help="timed prefills per model and length")
    p.add_argument("--decode", type=int_in(0), default=0, metavar="N",
                   help="model suite and FILE: after each prompt, N greedy decode steps timed as "
                        "well (a row per leg and length, llama-bench's tg<N>; default 0: none)")
    p.add_argument("--steps", nargs="+", metavar="N",
                   type=int_list(1, noun="step sizes", what="a step size"),
                   help=f"batch suite: the batch's step sizes in tokens (default {DEFAULT_STEP_TOKENS})")
    p.add_argument("--snapshot-every", type=int_in(64), nargs="+", default=None, metavar="N",
                   help="cache suite: the caches' snapshot_every (multiples of 64; default 1024, 256 "
                        "with --quick); several: each cache side once per N, the sweep of N against "
                        "re-run tokens, bytes and TTFT")
    p.add_argument("--cache-sides", nargs="+", default=None, metavar="SIDE",
                   choices=["cold", "sessions", "pages", "tree"],
                   help="cache suite: the sides to run (default all: cold sessions pages tree)")
    p.add_argument("--no-variants", action="store_true",
                   help="batch suite: skip the tuning variants (varlen off); kernel suite: the gdn "
                        "family's delta rule on its default path only, one call of T (no sequential, "
                        "tuning or carried rows; FLA under CUDA graphs its peer): an A/B of two "
                        "builds in one device call")
    p.add_argument("--memory-budget", nargs="+", metavar="GIB", type=positive_float("GiB"), default=[],
                   help="model suite and FILE: also run ours on a context with each memory budget "
                        "(GiB > 0: a smaller card; the prewarm caches what fits, the rest runs uncached: "
                        "its GGUF blocks on sm_90a, else streamed fp16 slabs), "
                        "with the ratio to the unbudgeted run")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks of skipped parts")


def build_parser(prog: str = "pyprefill bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def add_parser(subparsers) -> None:
    """Register `bench` on the `pyprefill` command line."""
    p = subparsers.add_parser("bench", help="benchmarks: a GGUF's prefill tokens/s, or the suites",
                              description=__doc__.split("\n\n")[0],
                              epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def resolve(a: argparse.Namespace) -> argparse.Namespace:
    """Defaults that depend on the mode, and UsageError for an option that does not apply to it
    or an output path that cannot be written: all before any GPU is looked for (each value was
    checked where it was parsed)."""
    a.suite = a.target if a.target in SUITES else None
    a.lengths = flatten(a.lengths) or ([512] if a.quick else list(LENGTHS))
    a.gemm = flatten(a.gemm) or (["auto"] if a.suite is None else
                                 ["f16"] if a.quick else ["f16", "f32"])
    if a.suite is None:
        if a.models:
            raise UsageError("--models picks the model suite's presets; a FILE is benchmarked "
                             "as it is")
    elif a.json:
        raise UsageError("--json applies to a FILE; the suites write JSON under --out")
    a.families = flatten(a.families) or list(FAMILIES)
    a.models = flatten(a.models) or (QUICK_MODELS if a.quick else
                                     list(BATCH_MODELS) if a.suite == "batch" else
                                     list(CACHE_MODELS) if a.suite == "cache" else list(MODELS))
    a.steps = flatten(a.steps) or [DEFAULT_STEP_TOKENS]
    if a.decode and a.suite in ("kernels", "batch", "cache"):
        raise UsageError(f"--decode times a whole model's decode steps: the model suite and FILE, "
                         f"not the {a.suite} suite")
    if a.suite != "kernels" and any(g.split("/")[0] == "blocks" for g in a.gemm):
        raise UsageError("--gemm blocks: the kernel suite's f16 leg on the GGUF blocks; whole models take "
                         "LEG/blocks (e.g. auto/blocks)")
    for opt, path in (("--out", a.out), ("--gguf-dir", a.gguf_dir)):
        if path is not None:
            _check_writable_dir(opt, path)
    if a.plot is not None:
        if os.path.isdir(a.plot):
            raise UsageError(f"--plot: {a.plot} is a directory (expected FILE.png)")
        _check_writable_dir("--plot", os.path.dirname(os.path.abspath(a.plot)))
        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError("--plot: matplotlib is not installed (the `plot` extra: "
                             "pip install matplotlib)")
    if a.quick:
        a.reps, a.model_reps = min(a.reps, 3), min(a.model_reps, 2)
    return a


def _check_writable_dir(opt: str, path: str) -> None:
    """UsageError unless `path` is a directory that can be written, or one that can be made (the
    nearest existing ancestor is a writable directory; a temporary file there, removed at once,
    is the test). No directory is made here."""
    p = os.path.abspath(path)
    if os.path.exists(p) and not os.path.isdir(p):
        raise UsageError(f"{opt}: {path} exists and is not a directory")
    probe = p
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(f"{opt}: {path}: {probe} is not a directory")
    try:                            # root passes os.access everywhere; a real file tells
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise UsageError(f"{opt}: {path}: cannot write in {probe} ({exc.strerror or exc})") from None


def _check_gguf(path: str) -> str | None:
    """The library's verdict on a FILE (pf_model_inspect, as `run` gives it) before any GPU is
    looked for: the message of a file it refuses, or None (also where the library cannot load:
    then the GPU check says why)."""
    try:
        from ..model import inspect
    except ImportError:
        return None
    try:
        inspect(path)
    except PrefillError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _settings(a) -> dict:
    return {k: v for k, v in vars(a).items() if not callable(v)}


def run_kernels(a, rec: Recorder, torch) -> dict:
    """The kernel families on one context (None when libprefill cannot open one: peers only)."""
    def open_context():
        from ..core import Context
        return Context(0)
    ctx = rec.guard("libprefill kernels", open_context)
    b = Bench(rec, ctx, torch, reps=a.reps, quick=a.quick,
              legs=[g for g in a.gemm if "/" not in g],  # LEG/variant: whole-model only
              shapes=a.shapes, variants=not a.no_variants)
    try:
        for fam in a.families:
            mod = rec.guard(f"{fam} benchmarks", importlib.import_module, f".{fam}", __package__)
            if mod is not None:
                rec.say(f"-- {fam}")
                rec.guard(f"{fam} benchmarks", mod.run, b, a.lengths)
    finally:
        if ctx is not None:
            ctx.close()
    return {"peak_fp16_tflops": b.peak_tflops}


def run_suites(a) -> int:
    from . import model
    rec = Recorder(a.verbose)
    torch = rec.optional("torch", "torch peers")
    m = meta(torch)
    rec.say(f"-- {m.get('device')}, torch {m.get('torch')}, commit {m.get('commit')}")
    tables, peak, model_rows = [], None, []
    for part in ("kernels", "model") if a.suite == "all" else (a.suite,):
        r0, s0, t0 = len(rec.rows), len(rec.skipped), time.perf_counter()
        if part == "kernels":
            extra = rec.guard("kernels", run_kernels, a, rec, torch) or {}
            peak = extra.get("peak_fp16_tflops")
        elif part == "batch":
            from . import batch
            variants = [("", None)] + ([] if a.no_variants or a.quick else [("novarlen", {"varlen": False})])
            extra = rec.guard("batch", batch.run, rec, torch, models=a.models, steps=a.steps,
                              reps=a.model_reps, peer=a.peer, quick=a.quick, mix=a.mix,
                              gguf_dir=a.gguf_dir, variants=variants) or {}
        elif part == "cache":
            from . import cache
            extra = rec.guard("cache", cache.run, rec, torch, models=a.models, quick=a.quick, mix=a.mix,
                              gguf_dir=a.gguf_dir, snapshot_every=a.snapshot_every,
                              sides=a.cache_sides) or {}
        else:
            extra = rec.guard("model", model.run, rec, torch, models=a.models, lengths=a.lengths,
                              legs=a.gemm, chunk=a.chunk, reps=a.model_reps, peer=a.peer,
                              mix=a.mix, gguf_dir=a.gguf_dir, peak_tflops=peak,
                              budgets=a.memory_budget, decode=a.decode) or {}
        res = {**extra, "rows": rec.rows[r0:], "skipped": rec.skipped[s0:], "meta": m,
               "wall_s": time.perf_counter() - t0, "args": _settings(a)}
        if part == "kernels":
            table = report.kernels_table(res["rows"])
        elif part == "batch":
            from . import batch
            table = batch.table(res["rows"])
        elif part == "cache":
            from . import cache
            table = cache.table(res["rows"])
        else:
            table = report.model_table(res["rows"], res.get("peak_fp16_tflops"))
            model_rows = res["rows"]
        report.write(a.out, part, res, table)
        tables.append(table)
        rec.say(f"-- {part}: {res['wall_s']:.1f} s, {len(res['skipped'])} skipped")
    if a.plot:
        report.plot(model_rows, a.plot, rec)
    for table in tables:
        print(f"\n{table}")
    return 0


def run_file(a) -> int:
    from . import gemm, model
    rec = Recorder(a.verbose, stream=sys.stderr if a.json else None)
    torch = rec.optional("torch", "HF peer and roofline") if a.peer == "hf" else None
    peak = rec.guard("roofline (torch fp16 peak)", gemm.fp16_peak_tflops, torch) if torch else None
    rows = model.bench_gguf(rec, a.target, Path(a.target).stem, a.lengths, a.gemm, chunk=a.chunk,
                            reps=a.model_reps, peer=a.peer, torch=torch, peak_tflops=peak,
                            budgets=a.memory_budget, decode=a.decode)
    res = {"rows": rows, "skipped": rec.skipped, "peak_fp16_tflops": peak, "meta": meta(torch),
           "args": _settings(a)}
    table = report.llama_table(rows)
    report.write(a.out, Path(a.target).stem, res, table)
    if a.json:
        print(json.dumps(res, indent=1, default=str))
    else:
        print(f"\n{table}")
    if a.plot:
        report.plot(rows, a.plot, rec)
    return 0 if any(r.get("tok_s") for r in rows if r["impl"].startswith("ours")) else 1


def _file_problem(path: str) -> str | None:
    """Why FILE cannot be a GGUF to benchmark before the library reads it, or None."""
    also = f" (a GGUF file, or a suite: {', '.join(SUITES)})"
    if not os.path.exists(path):
        return f"{path}: no such file" + also
    if os.path.isdir(path):
        return f"{path}: is a directory" + also
    if not os.path.isfile(path):
        return f"{path}: not a regular file" + also
    return None


def _no_device_line(suite: bool) -> str | None:
    """None when a benchmark can run; else the one line `pyprefill run` prints for the same
    machine: the library's own error from opening device 0 (NoDeviceError and its reason), or
    why libprefill cannot load. A suite whose library cannot load still runs its peers where
    torch sees a GPU."""
    try:
        from ..core import Context, device_count
    except ImportError as exc:
        if suite and detect_gpu()[0]:
            return None
        return user_error_line(exc)
    if device_count() > 0:
        return None
    try:
        Context(0).close()             # the library says why (driver, stub, no GPU) as for run
    except PrefillError as exc:
        return user_error_line(exc)
    return None


def run(a: argparse.Namespace) -> int:
    try:
        resolve(a)
    except UsageError as exc:
        print(f"pyprefill bench: {exc}", file=sys.stderr)
        return 2
    if a.suite is None and (why := _file_problem(a.target) or _check_gguf(a.target)):
        print(f"pyprefill bench: {why}", file=sys.stderr)
        return 1
    why = _no_device_line(a.suite is not None)
    if why is not None:                # nothing was measured: a script must not count a pass
        print(f"pyprefill bench: {why}", file=sys.stderr)
        return 1
    try:
        return run_suites(a) if a.suite else run_file(a)
    except PrefillError as exc:       # a clear one-line error, not a traceback
        print(f"pyprefill bench: {user_error_line(exc)}", file=sys.stderr)
        return 1


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))
