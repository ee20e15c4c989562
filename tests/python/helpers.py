"""Shared test helpers: the error measure of DESIGN.md (relative Frobenius error over the whole
array, worst single row beside it) with both numbers in the failure message."""
from __future__ import annotations

import numpy as np


def rel_error(ref: np.ndarray, out: np.ndarray) -> tuple[float, float]:
    """(||out-ref|| / ||ref|| over the whole array, the worst row's relative error)."""
    r = np.asarray(ref, dtype=np.float64)
    o = np.asarray(out, dtype=np.float64)
    whole = float(np.linalg.norm(o - r) / max(np.linalg.norm(r), 1e-300))
    if r.ndim >= 2:
        r2, o2 = r.reshape(r.shape[0], -1), o.reshape(o.shape[0], -1)
        rows = np.linalg.norm(o2 - r2, axis=1) / np.maximum(np.linalg.norm(r2, axis=1), 1e-300)
        worst = float(rows.max(initial=0.0))
    else:
        worst = whole
    return whole, worst


def assert_close(name: str, ref, out, *, rtol: float, worst_rtol: float | None = None) -> float:
    ref, out = np.asarray(ref), np.asarray(out)
    assert out.shape == ref.shape, f"{name}: shape {out.shape} != reference {ref.shape}"
    assert np.isfinite(out).all(), (
        f"{name}: {int((~np.isfinite(out)).sum())} non-finite values in the output "
        f"(unwritten elements stay NaN after poisoning)")
    whole, worst = rel_error(ref, out)
    msg = f"{name}: rel error {whole:.3e} (bound {rtol:.0e}), worst row {worst:.3e}"
    assert whole <= rtol, msg
    if worst_rtol is not None:
        assert worst <= worst_rtol, msg + f" (row bound {worst_rtol:.0e})"
    return whole
