"""Engine subcommands of the `pyprefill` CLI: demo (the main job) and run (`bench` lives in
pyprefill.bench)."""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np


def _gpu_available() -> tuple[bool, str]:
    try:
        from ._errors import no_device_reason
    except ImportError as exc:            # the whole reason: which file, why, how to install
        return False, f"libprefill is not loadable: {exc}"
    why = no_device_reason()
    return not why, why


def _top(logits: np.ndarray, k: int = 5) -> str:
    idx = np.argsort(-logits)[:k]
    return ", ".join(f"{int(i)}:{logits[i]:.4f}" for i in idx)


def cmd_demo(args) -> int:
    """Write a small synthetic model, prefill a prompt on the GPU and check the logits against
    the NumPy reference; without a GPU, run the reference alone."""
    from .formats.synth import write_synthetic
    from .reference.model import ReferenceModel

    ok, why = _gpu_available()
    if not ok:
        print(f"no GPU: {why}")
        print("running the NumPy reference alone")
    rng = np.random.default_rng(args.seed)
    workdir = args.dir or tempfile.mkdtemp(prefix="pyprefill-demo-")
    os.makedirs(workdir, exist_ok=True)   # OSError (a file in the way, no permission): one line
    status = 0
    for preset, mix in (("qwen35-tiny", "q4_k_m"), ("qwen3-tiny", "q8_0")):
        path = os.path.join(workdir, f"{preset}-{mix}.gguf")
        if not os.path.exists(path):
            write_synthetic(preset, mix, path, seed=args.seed, progress=False)
        ref = ReferenceModel(path)                     # float64 oracle
        tokens = rng.integers(0, ref.desc.n_vocab, size=args.length).astype(np.int32)
        t0 = time.perf_counter()
        want = ref.session().prefill(tokens, "last")
        t_ref = time.perf_counter() - t0
        print(f"{preset} ({mix}): {ref.desc.n_layer} layers, d={ref.desc.n_embd}, "
              f"vocab {ref.desc.n_vocab}; prompt of {len(tokens)} tokens")
        print(f"  reference (NumPy float64, {t_ref:.2f} s): top-5 {_top(want)}")
        if not ok:
            continue
        from .model import Model
        for gemm, kv in (("f32", "f32"), ("auto", "f16")):
            with Model.load(path, gemm=gemm, prewarm=(gemm != "f32"), progress=False) as m:
                s = m.session(max_tokens=len(tokens) + 8, chunk=64, kv=kv)
                t0 = time.perf_counter()
                got, tok = s.prefill(tokens, "last", return_token=True)
                dt = time.perf_counter() - t0
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            bound = 1e-4 if gemm == "f32" else 2e-2
            same = int(np.argmax(got)) == int(np.argmax(want)) == tok
            verdict = "ok" if err <= bound and same else "MISMATCH"
            if verdict != "ok":
                status = 1
            print(f"  libprefill (gemm={gemm}, kv={kv}, {dt * 1e3:.1f} ms): top-5 {_top(got)}")
            print(f"    rel error vs reference {err:.2e} (bound {bound:.0e}), greedy token {tok} "
                  f"{'equal' if same else 'DIFFERENT'}: {verdict}")
    if not ok:
        print("the NumPy reference ran alone; on a CUDA machine the demo compares libprefill with it")
    return status


def parse_token_ids(text: str) -> np.ndarray:
    """Token ids from "1,2 3": integers >= 0 separated by commas or spaces (InvalidArgumentError
    naming the first bad entry)."""
    from .errors import InvalidArgumentError
    parts = text.replace(",", " ").split()
    if not parts:
        raise InvalidArgumentError("--tokens: no token ids given")
    ids = []
    for p in parts:
        try:
            v = int(p)
        except ValueError:
            raise InvalidArgumentError(f"--tokens: {p!r} is not a token id (integers separated "
                                       "by commas or spaces)") from None
        if not 0 <= v < 2**31:
            raise InvalidArgumentError(f"--tokens: {v} is not a token id (ids are >= 0)")
        ids.append(v)
    return np.array(ids, np.int32)


def _load_tokens(args, path: str) -> np.ndarray:
    if args.tokens is not None:
        return parse_token_ids(args.tokens)
    from .tokenizer import Tokenizer
    return np.array(Tokenizer.from_gguf(path).encode(args.prompt), np.int32)


def cmd_run(args) -> int:
    from .errors import InvalidArgumentError
    from .model import Model, inspect
    info = inspect(args.file)          # the file's faults first, on any machine (no device)
    ids = _load_tokens(args, args.file)
    if len(ids) == 0:
        raise InvalidArgumentError("the prompt has no tokens")
    if ids.max() >= info["n_vocab"]:
        raise InvalidArgumentError(f"token id {int(ids.max())} is outside the model's vocabulary "
                                   f"[0, {info['n_vocab']})")
    need = len(ids) + args.n_predict + 1
    if info["context_length"] > 0 and need > info["context_length"]:
        raise InvalidArgumentError(f"a prompt of {len(ids)} tokens and {args.n_predict} predicted "
                                   f"need {need} positions; the model's context_length is "
                                   f"{info['context_length']}")
    with Model.load(args.file, gemm=args.gemm, prewarm=not args.no_prewarm) as m:
        s = m.session(max_tokens=need, chunk=args.chunk or 0)
        t0 = time.perf_counter()
        logits, tok = s.prefill(ids, "last", return_token=True)
        dt = time.perf_counter() - t0
        print(f"prefill: {len(ids)} tokens in {dt * 1e3:.1f} ms ({len(ids) / dt:.0f} tok/s)")
        print(f"top-5 next tokens: {_top(logits)}")
        out = [tok]
        if args.n_predict > 1:
            out += s.generate(args.n_predict - 1).tolist()
        print(f"greedy tokens: {' '.join(map(str, out[:args.n_predict]))}")
        if not args.tokens:
            from .tokenizer import Tokenizer
            print("text:", repr(Tokenizer.from_gguf(m.path).decode(out[:args.n_predict])))
    return 0


def _int_at_least(low: int):
    """An argparse type: an int >= low (argparse prints the error and exits 2)."""
    import argparse

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{v} is less than {low}")
        return v
    parse.__name__ = f"int >= {low}"
    return parse


def add_parsers(sub) -> None:
    from .cli import DeprecatedOption
    p = sub.add_parser("demo", help="the main job: a synthetic model's prefill vs the NumPy reference")
    p.add_argument("--length", type=_int_at_least(1), default=96,
                   help="prompt length in tokens (random ids; default 96)")
    p.add_argument("--tokens", dest="length", type=_int_at_least(1), action=DeprecatedOption,
                   new="--length", why="`run --tokens` takes token ids; this is a length")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", help="where to write the synthetic models (default: a temp dir)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("run", help="prefill a prompt and print the next tokens")
    p.add_argument("file")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="text (needs the `tokenizers` extra)")
    g.add_argument("--tokens", help="token ids, comma or space separated")
    p.add_argument("--n-predict", type=_int_at_least(0), default=8)
    p.add_argument("--gemm", default="default", type=str.lower, choices=["default", "auto", "f16", "f32"])
    p.add_argument("--chunk", type=_int_at_least(1), default=None,
                   help="rows per internal chunk (default: the session's, 2048 within free memory)")
    p.add_argument("--no-prewarm", action="store_true")
    p.set_defaults(func=cmd_run)
