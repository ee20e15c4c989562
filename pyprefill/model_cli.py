"""Engine subcommands of the `pyprefill` CLI: demo (the main job) and run (`bench` lives in
pyprefill.bench)."""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

from ._cli_args import INT32_MAX, DeprecatedOption, int_in, int_list, nonempty_path
from ._defaults import DEFAULT_STEP_TOKENS


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
    the NumPy reference; without a GPU, run the reference alone. The models go to --dir (kept,
    and reused by the next run) or to a temporary directory removed at the end; either is named."""
    ok, why = _gpu_available()
    if not ok:
        print(f"no GPU: {why}")
        print("running the NumPy reference alone")
    if args.dir is not None:
        os.makedirs(args.dir, exist_ok=True)   # OSError (a file in the way, no permission): one line
        print(f"synthetic models in {args.dir} (kept)")
        return _demo(args, args.dir, ok)
    with tempfile.TemporaryDirectory(prefix="pyprefill-demo-") as workdir:
        print(f"synthetic models in {workdir} (removed at the end; --dir DIR keeps them)")
        return _demo(args, workdir, ok)


def _demo(args, workdir: str, gpu: bool) -> int:
    from .formats.synth import write_synthetic
    from .reference.model import ReferenceModel
    rng = np.random.default_rng(args.seed)
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
        if not gpu:
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
    if not gpu:
        print("the NumPy reference ran alone; on a CUDA machine the demo compares libprefill with it")
    return status


_CHAT_N_PREDICT = 512   # --chat's default --n-predict (a reply, not a peek at the next tokens)


def _load_tokens(args, path: str):
    """(prompt ids, the Tokenizer or None): --tokens as given; --prompt and --chat through the
    GGUF's own tokenizer, built once here and reused to print the reply."""
    if args.tokens is not None:
        return args.tokens, None
    from .tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(path)
    if args.chat is not None:
        from .chat import chat_messages
        kwargs = {"enable_thinking": False} if args.no_think else {}
        ids = tok.apply_chat_template(chat_messages(args.chat, args.system),
                                      add_generation_prompt=True, **kwargs)
    else:
        ids = tok.encode(args.prompt)
    return ids, tok


def cmd_run(args) -> int:
    from ._checks import token_ids
    from .errors import InvalidArgumentError
    from .model import Model, inspect
    if (args.system is not None or args.no_think) and args.chat is None:
        raise InvalidArgumentError("--system and --no-think go with --chat")
    n_predict = args.n_predict
    if n_predict is None:
        n_predict = _CHAT_N_PREDICT if args.chat is not None else 8
    if n_predict == 0 and args.chat is not None:
        raise InvalidArgumentError("--n-predict 0 with --chat: no reply to generate")
    info = inspect(args.file)          # the file's faults first, on any machine (no device)
    ids, tok = _load_tokens(args, args.file)
    # the engine's own conversion, before the device: an id beyond the model's vocabulary (from
    # --tokens, or a tokenizer larger than the embedding) named with its place in the prompt
    ids = token_ids(ids, "--tokens" if args.tokens is not None else "prompt",
                    n_vocab=info["n_vocab"])
    need = len(ids) + n_predict + 1
    if info["context_length"] > 0 and need > info["context_length"]:
        raise InvalidArgumentError(f"a prompt of {len(ids)} tokens and {n_predict} predicted "
                                   f"need {need} positions; the model's context_length is "
                                   f"{info['context_length']}")
    with Model.load(args.file, gemm=args.gemm, prewarm=not args.no_prewarm) as m:
        s = m.session(max_tokens=need, chunk=args.chunk)
        if args.chat is not None:
            from .chat import generate_reply
            reply = generate_reply(s, ids, tok, n_predict,
                                   on_text=lambda text: print(text, end="", flush=True))
            print(flush=True)
            ended = (f"end of turn {tok.token_text(reply.stop_id)!r}" if reply.stop_id is not None
                     else f"--n-predict {n_predict} reached")
            rate = (len(reply.ids) - 1) / reply.generate_s if reply.generate_s > 0 else 0.0
            print(f"[prompt {reply.prompt_tokens} tokens, prefill {reply.prefill_s * 1e3:.1f} ms; "
                  f"{len(reply.ids)} tokens generated ({rate:.1f} tok/s); {ended}]",
                  file=sys.stderr)
            return 0
        t0 = time.perf_counter()
        logits, token = s.prefill(ids, "last", return_token=True)
        dt = time.perf_counter() - t0
        print(f"prefill: {len(ids)} tokens in {dt * 1e3:.1f} ms ({len(ids) / dt:.0f} tok/s)")
        print(f"top-5 next tokens: {_top(logits)}")
        out = [token]
        if n_predict > 1:
            out += s.generate(n_predict - 1).tolist()
        print(f"greedy tokens: {' '.join(map(str, out[:n_predict]))}")
        if tok is not None:
            print("text:", repr(tok.decode(out[:n_predict])))
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("demo", help="the main job: a synthetic model's prefill vs the NumPy reference")
    p.add_argument("--length", type=int_in(1), default=96,
                   help="prompt length in tokens (random ids; default 96)")
    p.add_argument("--tokens", dest="length", type=int_in(1), action=DeprecatedOption,
                   new="--length", why="`run --tokens` takes token ids; this is a length")
    p.add_argument("--seed", type=int_in(0), default=0)
    p.add_argument("--dir", type=nonempty_path,
                   help="where to write the synthetic models, kept for the next run (default: a "
                        "temporary directory, removed at the end)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("run", help="prefill a prompt and print the next tokens")
    p.add_argument("file", type=nonempty_path)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt",
                   help="text, through the GGUF's tokenizer (needs the `tokenizer` extra)")
    g.add_argument("--tokens", type=int_list(0, INT32_MAX, noun="token ids", what="a token id"),
                   help="token ids, comma or space separated")
    g.add_argument("--chat", metavar="TEXT",
                   help="a user message through the GGUF's chat template; the reply is printed "
                        "as it is generated and stops at the end of the turn")
    p.add_argument("--system", metavar="TEXT", help="with --chat: a system message first")
    p.add_argument("--no-think", action="store_true",
                   help="with --chat: enable_thinking=False for the template (Qwen3: no <think>)")
    p.add_argument("--n-predict", type=int_in(0), default=None,
                   help=f"tokens to generate (default 8; {_CHAT_N_PREDICT} with --chat)")
    p.add_argument("--gemm", default="default", type=str.lower, choices=["default", "auto", "f16", "f32"])
    p.add_argument("--chunk", type=int_in(0), default=0,
                   help="rows per internal chunk (default 0: the session's own, "
                        f"{DEFAULT_STEP_TOKENS} within free memory)")
    p.add_argument("--no-prewarm", action="store_true")
    p.set_defaults(func=cmd_run)
