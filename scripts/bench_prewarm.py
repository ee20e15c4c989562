"""The prewarm's bandwidth over several loads per setting (issue 11 item 7; NOTES session 17).

    python3 scripts/bench_prewarm.py [--models qwen35-4b qwen3-4b] [--reps 5]
                                     [--pieces default 0] [--dir out/models]

Per model (the bench's synthetic Q4_K_M GGUF of the real shapes, written once under --dir) and
per prewarm_piece_bytes tuning ("default": pieces from 256 MiB; "one-allocation": the whole
cache in one, as v1; or bytes): `reps` loads in one context, each prewarming at load. Prints the median
wall (pf_model_info.prewarm_ms: host set-up, allocations, launches, final sync) and device time
(the report's device_ms: the launches) as GB/s of bytes read + written and as % of the device
copy bandwidth measured in the same process (pyprefill bench model's yardstick)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


class _Say:  # the bench's recorder, reduced to what synthetic_gguf uses
    @staticmethod
    def say(text: str) -> None:
        print(text, flush=True)


def measure(path: str, reps: int, piece: str) -> dict:
    from pyprefill.bench.model import copy_bytes_for, device_copy_gbs
    from pyprefill.core import Context
    from pyprefill.model import Model
    tuning = {} if piece == "default" else {
        "prewarm_piece_bytes": piece if piece == "one-allocation" else int(piece)}
    wall, dev, moved = [], [], 0
    with Context(0) as ctx:
        for _ in range(reps):
            with Model(path, context=ctx, gemm="auto", prewarm=True, progress=False, tuning=tuning) as m:
                rep = m.prewarm_report()
                if not rep["armed"]:
                    raise SystemExit(f"{path}: prewarm not armed: {rep['reason']}")
                moved = rep["bytes_read"] + rep["bytes_added"]
                wall.append(m.info["prewarm_ms"])
                dev.append(rep["device_ms"])
        copy = device_copy_gbs(ctx, copy_bytes_for(moved, ctx.memory()[0]))
    out = {"moved_gb": moved / 1e9, "copy_gbs": copy}
    for key, ms in (("wall", statistics.median(wall)), ("device", statistics.median(dev))):
        out[f"{key}_ms"] = ms
        out[f"{key}_gbs"] = moved / (ms * 1e6)
        out[f"{key}_pct"] = 100 * out[f"{key}_gbs"] / copy
    return out


def main(argv=None) -> int:
    from pyprefill.bench.model import synthetic_gguf
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["qwen35-4b", "qwen3-4b"])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--pieces", nargs="+", default=["default", "one-allocation"],
                   help='tuning.prewarm_piece_bytes values: "default", "one-allocation" or bytes')
    p.add_argument("--dir", default="out/models", help="where the synthetic GGUFs are kept")
    a = p.parse_args(argv)
    print("| model | piece | GB moved | wall ms | wall GB/s | wall % copy | device ms | "
          "device GB/s | device % copy | copy GB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for preset in a.models:
        path = synthetic_gguf(_Say(), preset, "q4_k_m", a.dir)
        for piece in a.pieces:
            r = measure(path, a.reps, piece)
            print(f"| {preset} | {piece} | {r['moved_gb']:.2f} | {r['wall_ms']:.2f} | "
                  f"{r['wall_gbs']:.0f} | {r['wall_pct']:.0f} | {r['device_ms']:.2f} | "
                  f"{r['device_gbs']:.0f} | {r['device_pct']:.0f} | {r['copy_gbs']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
