"""What every suite shares: the record of rows and skipped parts, optional peers, the device
check, run metadata, and `Bench`, the toolbox of the kernel families."""
from __future__ import annotations

import importlib
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from .timer import l2_bytes, rotation, time_ours, time_torch


class Skip(Exception):
    """A part that cannot run here; the message says why."""


def first_line(why) -> str:
    text = str(why).strip()
    return text.splitlines()[0] if text else type(why).__name__


class Recorder:
    """Result rows and skipped parts of one run, printed as they come."""

    def __init__(self, verbose: bool = False, stream=None):
        self.rows: list[dict] = []
        self.skipped: list[dict] = []
        self.verbose, self.stream = verbose, stream     # None: sys.stdout at the time of printing
        self._modules: dict[str, object] = {}

    def say(self, line: str) -> None:
        print(line, file=self.stream or sys.stdout, flush=True)

    def skip(self, what: str, why) -> None:
        why = first_line(why)
        self.skipped.append({"what": what, "why": why})
        self.say(f"skipped: {what}: {why}")

    def guard(self, what: str, fn, *args, **kw):
        """fn(*args, **kw), or one skipped line (and None) if it raises."""
        try:
            return fn(*args, **kw)
        except Skip as exc:
            self.skip(what, exc)
        except NotImplementedError as exc:     # UnsupportedError: this build cannot serve it
            self.skip(what, f"unsupported: {first_line(exc)}")
        except Exception as exc:   # noqa: BLE001  one broken part must not lose the others
            self.skip(what, f"{type(exc).__name__}: {first_line(exc)}")
            if self.verbose:
                traceback.print_exc()
        return None

    def optional(self, module: str, what: str):
        """The module, or None after one skipped line naming `what` (once per module)."""
        if module not in self._modules:
            try:
                self._modules[module] = importlib.import_module(module)
            except Exception as exc:   # noqa: BLE001  ImportError or a broken install
                self._modules[module] = None
                self.skip(what, f"{module} not importable ({first_line(exc)})")
        return self._modules[module]


def detect_gpu() -> tuple[bool, str]:
    """(True, "") when libprefill or torch sees a CUDA device, else (False, why). Prints nothing
    and imports torch only when libprefill cannot answer."""
    why = []
    try:
        from .. import core
        if core.device_count() > 0:
            return True, ""
        why.append("libprefill sees no CUDA device")
    except Exception as exc:   # noqa: BLE001  library not built or not loadable
        why.append(f"libprefill not loadable ({first_line(exc)})")
        try:
            import torch
            if torch.cuda.is_available() and torch.cuda.device_count() > 0:
                return True, ""
            why.append("torch sees no CUDA device")
        except Exception:   # noqa: BLE001
            pass
    return False, "; ".join(why)


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except Exception:   # noqa: BLE001  no git, not a checkout
        return None


def meta(torch=None) -> dict:
    """Where and with what the numbers were taken."""
    from .. import __version__
    m = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(),
         "python": platform.python_version(), "pyprefill": __version__, "commit": _git_commit(),
         "library": os.environ.get("PYPREFILL_LIBRARY")}
    try:
        from .. import core
        m["libprefill"] = core.version()
    except Exception:   # noqa: BLE001
        m["libprefill"] = None
    if torch is not None:
        m["torch"] = torch.__version__
        try:
            m["device"], m["cuda"] = torch.cuda.get_device_name(0), torch.version.cuda
        except Exception:   # noqa: BLE001
            pass
    for mod in ("transformers", "fla", "triton"):
        try:
            m[mod] = importlib.import_module(mod).__version__
        except Exception:   # noqa: BLE001
            m[mod] = None
    return m


class Slab:
    """`n` random float32 [rows][cols] matrices back to back in one device buffer: set i starts
    at float element off(i). One allocation however many sets the L2 rotation asks for."""

    def __init__(self, buf, rows: int, cols: int, n: int):
        self.buf, self.rows, self.cols, self.n = buf, rows, cols, n

    def off(self, i: int) -> int:
        return (i % self.n) * self.rows * self.cols


class Bench:
    """The kernel families' toolbox: the pyprefill context (None when libprefill cannot run),
    torch (None without it), a seeded RNG, the recorder, repeats. Device memory taken through
    it is freed after each op (`op`)."""

    def __init__(self, rec: Recorder, ctx, torch, *, reps: int = 7, quick: bool = False,
                 legs=("f16", "f32"), seed: int = 1234, shapes: str = "qwen35-4b",
                 variants: bool = True):
        self.rec, self.ctx, self.torch, self.reps, self.quick = rec, ctx, torch, reps, quick
        self.variants = variants                   # False (--no-variants): a family's default rows only
        self.legs = tuple(legs)
        self.shapes = shapes                       # the synth preset whose matrices gemm runs
        self.peak_tflops: float | None = None     # set by gemm.run when torch is there
        self.rng = np.random.default_rng(seed)
        self.l2 = l2_bytes(torch)
        self._owned: list = []

    # -- running and recording
    def op(self, what: str, fn, *args, **kw):
        """fn(*args, **kw) guarded (a failure is one skipped line); frees what it allocated."""
        try:
            return self.rec.guard(what, fn, *args, **kw)
        finally:
            for obj in reversed(self._owned):
                obj.close()
            self._owned.clear()

    def need_ours(self) -> None:
        if self.ctx is None:
            raise Skip("libprefill unavailable")

    def time_ours(self, call, **kw) -> dict:
        self.need_ours()
        return time_ours(self.ctx, call, **{"reps": self.reps, **kw})

    def time_torch(self, call, **kw) -> dict:
        return time_torch(self.torch, call, **{"reps": self.reps, **kw})

    def add(self, op: str, T: int, impl: str, t: dict, *, flops: float | None = None,
            nbytes: float | None = None, peer: dict | None = None, note: str = "",
            **extra) -> dict:
        """Record one timed result; rates from the median; ratio = peer time / our time."""
        row = {"op": op, "T": T, "impl": impl, **t, "note": note, **extra}
        sec = t["median_ms"] * 1e-3
        if flops:
            row["flops"], row["tflops"] = flops, flops / sec / 1e12
        if nbytes:
            row["bytes"], row["gbps"] = nbytes, nbytes / sec / 1e9
        if peer is not None:
            row["ratio_vs_peer"] = peer["median_ms"] / t["median_ms"]   # > 1: ours faster
        self.rec.rows.append(row)
        rate = (f" {row['tflops']:8.1f} TF/s" if "tflops" in row else
                f" {row['gbps']:8.1f} GB/s" if "gbps" in row else "")
        self.rec.say(f"  {op:34s} T={T:<6d} {impl:22s} {t['median_ms']:9.4f} ms{rate}")
        return row

    # -- inputs (random, never zeros)
    def sets(self, bytes_per_set: int, max_sets: int = 64) -> int:
        return rotation(bytes_per_set, self.l2, max_sets)

    def rand(self, *shape, scale: float = 1.0) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)

    def own(self, obj):
        self._owned.append(obj)
        return obj

    def upload(self, arr: np.ndarray):
        self.need_ours()
        return self.own(self.ctx.upload(np.ascontiguousarray(arr)))

    def buffer(self, nbytes: int):
        self.need_ours()
        return self.own(self.ctx.buffer(nbytes))

    def slab(self, rows: int, cols: int, n: int = 1, *, scale: float = 1.0) -> Slab:
        """n random float32 [rows][cols] input sets in one buffer."""
        return self.slab_of(self.rand(n * rows, cols, scale=scale), n)

    def slab_of(self, arr: np.ndarray, n: int) -> Slab:
        """Upload arr ([n * rows][cols] float32) as n input sets."""
        arr = np.ascontiguousarray(arr, dtype=np.float32).reshape(arr.shape[0], -1)
        return Slab(self.upload(arr), arr.shape[0] // n, arr.shape[1], n)

    def out_slab(self, rows: int, cols: int, n: int = 1) -> Slab:
        """n float32 [rows][cols] output sets in one buffer (NaN until written)."""
        buf = self.buffer(max(n * rows * cols * 4, 4))
        buf.poison()
        return Slab(buf, rows, cols, n)

    def weight(self, qtype: str, n: int, k: int):
        """A random valid GGUF weight [n][k] on the device."""
        from ..formats.quant import random_blocks
        from ..core import qtype_id
        self.need_ours()
        blocks = random_blocks(n, k, qtype_id(qtype), self.rng)
        return self.own(self.ctx.weight(qtype, n, k, blocks))
