"""pyprefill command line: `pyprefill [check] | info | synth | demo | run | bench`."""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from . import __version__
from ._cli_args import int_in, user_error_line
from .errors import PrefillError


def cmd_check(args) -> int:
    """Version, devices, and a GPU smoke check (weight upload, buffer round trip)."""
    print(f"pyprefill {__version__}")
    try:
        from . import core
    except ImportError as exc:
        print(f"libprefill: not loadable: {exc}")
        return 1
    print(f"libprefill {core.version()} (header {'.'.join(map(str, core.lib_header_version()))})")
    n = core.device_count()
    if n == 0:
        from ._errors import no_device_reason
        print(f"devices: none, GPU smoke check skipped: {no_device_reason() or 'no CUDA device'}")
        return 0
    print(f"devices: {n}")
    rng = np.random.default_rng(args.seed)
    for dev in range(n):
        with core.Context(dev) as ctx:
            free, total = ctx.memory()
            x = rng.standard_normal(1 << 20).astype(np.float32)
            buf = ctx.upload(x)
            back = buf.download(np.float32, x.shape)
            blocks = rng.integers(0, 256, size=(64, 256 // 32 * 34), dtype=np.uint8)
            w = ctx.weight("Q8_0", 64, 256, blocks)
            info = w.info()
            ok = np.array_equal(back, x) and info["bytes"] == blocks.nbytes
            print(f"  device {dev}: {total / 2**30:.1f} GiB ({free / 2**30:.1f} free); "
                  f"buffer round trip of {x.nbytes} bytes {'ok' if np.array_equal(back, x) else 'WRONG'}; "
                  f"Q8_0 weight 64x256 uploaded ({info['bytes']} bytes)")
            if not ok:
                return 1
    return 0


def _optional(register, subparsers):
    try:
        register(subparsers)
    except ImportError as exc:        # a subcommand whose module is not importable here
        p = subparsers.add_parser(register.__name__.replace("add_", "").replace("_parser", ""))
        p.set_defaults(func=lambda a, e=exc: (print(f"unavailable: {e}", file=sys.stderr), 1)[1])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyprefill", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pyprefill {__version__}")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("check", help="version, devices and a GPU smoke check (the default)")
    p.add_argument("--seed", type=int_in(0), default=0)
    p.set_defaults(func=cmd_check)

    def add_info_parser(s):
        from .info_cli import add_info_parser as reg
        reg(s)

    def add_synth_parser(s):
        from .formats.synth import add_synth_parser as reg
        reg(s)

    def add_engine_parsers(s):
        from .model_cli import add_parsers as reg
        reg(s)

    def add_bench_parser(s):
        from .bench.cli import add_parser as reg
        reg(s)

    for register in (add_info_parser, add_synth_parser, add_bench_parser):
        _optional(register, sub)
    try:
        add_engine_parsers(sub)
    except ImportError:
        pass
    return parser


def main(argv=None) -> int:
    """Run one subcommand. A mistake in the user's input (a wrong path, an unwritable output, a
    bad value, no GPU, a library error) prints one line `pyprefill CMD: what went wrong` on
    stderr and returns 1; Ctrl-C returns 130. Any other exception is a bug and keeps its
    traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["check", *(argv or [])])
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:           # `pyprefill info m.gguf | head`: the reader left
        try:
            sys.stdout = open(os.devnull, "w")   # no second error while Python flushes stdout
        except OSError:
            pass
        return 1
    except (PrefillError, OSError, ValueError, ImportError, MemoryError) as exc:
        print(f"pyprefill {args.command}: {user_error_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"pyprefill {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
