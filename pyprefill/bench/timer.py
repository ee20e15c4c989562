"""One timing loop for every benchmark (the method of docs/benchmarks.md, "How we measure").

`measure(call, clock)` warms up, sizes a batch of calls from one probe, then times `reps`
batches and reports the per-call time of each batch and their median. What differs between
callers is only the clock:

- `HostClock(ctx.synchronize)`: host time around a batch, the device drained before and after.
  libprefill runs on its context's own stream and its public API has no events, so our calls
  are timed this way (one cffi call costs about 1 us of host time; a batch of calls hides it
  whenever the kernel is longer). Whole-model prefill, which returns once the logits are on the
  host, uses the same clock with batches of one call.
- `EventClock(torch)`: CUDA events on torch's current stream, for the torch and FLA peers.

`rotation()` says how many input sets to cycle through so that repeated calls do not time L2.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable

L2_BYTES = 50 << 20       # H200 (60 MiB on some parts); `l2_bytes(torch)` asks the device


def l2_bytes(torch=None) -> int:
    """The device's L2 size from torch when it can tell, else L2_BYTES."""
    try:
        return int(torch.cuda.get_device_properties(0).L2_cache_size) or L2_BYTES
    except Exception:   # noqa: BLE001  no torch, no device, an old torch
        return L2_BYTES


def rotation(bytes_per_set: int, l2: int = L2_BYTES, max_sets: int = 64) -> int:
    """Input sets to rotate among: 1 when one set is larger than L2, else enough that one pass
    over all of them moves more than 2 x L2 (at most max_sets)."""
    if bytes_per_set >= l2:
        return 1
    return max(1, min(max_sets, 2 * l2 // max(bytes_per_set, 1) + 1))


def summarize(per_call_ms: list[float]) -> dict:
    """Median (the number reported), mean, sample std, min, max, and every sample."""
    s = list(per_call_ms)
    return {"median_ms": statistics.median(s), "mean_ms": statistics.fmean(s),
            "std_ms": statistics.stdev(s) if len(s) > 1 else 0.0, "min_ms": min(s),
            "max_ms": max(s), "reps_ms": s}


def calls_per_batch(probe_s: float, target_s: float, max_calls: int) -> int:
    """Calls per timed batch so that a batch lasts about target_s (1 .. max_calls)."""
    return max(1, min(max_calls, math.ceil(target_s / max(probe_s, 1e-7))))


class HostClock:
    """Host clock around a batch; `synchronize` drains the device before and after."""

    def __init__(self, synchronize: Callable[[], None],
                 now: Callable[[], float] = time.perf_counter):
        self.synchronize, self.now = synchronize, now

    def start(self):
        self.synchronize()
        return self.now()

    def stop(self, t0) -> float:
        self.synchronize()
        return self.now() - t0


class EventClock:
    """CUDA events recorded on torch's current stream."""

    def __init__(self, torch):
        self.torch = torch

    def _event(self):
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def start(self):
        return self._event()

    def stop(self, start) -> float:
        end = self._event()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def measure(call: Callable[[int], object], clock, *, reps: int = 7, warmup: int = 2,
            target_s: float = 0.02, max_calls: int = 200,
            setup: Callable[[int], object] | None = None) -> dict:
    """Time call(i), i = 0, 1, 2, ... (i picks the input set to use).

    `warmup` calls first (module load, compilation and handle creation stay out), then one
    timed probe call sizes the batches, then `reps` timed batches. `setup(i)`, when given, runs
    before each warm-up call and each batch, outside the clock (a session reset). Returns
    summarize() of the per-call milliseconds of each batch, plus calls_per_batch."""
    i = 0
    for _ in range(warmup):
        if setup is not None:
            setup(i)
        call(i)
        i += 1
    if setup is not None:
        setup(i)
    t0 = clock.start()
    call(i)
    i += 1
    n = calls_per_batch(clock.stop(t0), target_s, max_calls)
    per_call = []
    for _ in range(reps):
        if setup is not None:
            setup(i)
        t0 = clock.start()
        for _ in range(n):
            call(i)
            i += 1
        per_call.append(clock.stop(t0) * 1e3 / n)
    return {**summarize(per_call), "calls_per_batch": n}


def time_ours(ctx, call, **kw) -> dict:
    """measure() of calls on a pyprefill Context's stream (host clock + ctx.synchronize)."""
    return measure(call, HostClock(ctx.synchronize), **kw)


def time_torch(torch, call, **kw) -> dict:
    """measure() of calls on torch's current stream (CUDA events)."""
    return measure(call, EventClock(torch), **kw)
