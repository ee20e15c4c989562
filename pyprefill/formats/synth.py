"""Synthetic GGUF models with the real shapes of spec.md §5 (random weights, valid tokenizer).

`write_synthetic("qwen35-27b", "q4_k_m", "/tmp/m.gguf")` streams a ~16 GB file in minutes:
tensors are written chunk by chunk (never the whole model in RAM), matrices as random valid
GGML blocks (quant.random_blocks), 1-D tensors with plausible values (norms ~ 1, ssm_a < 0).
Tiny presets (`qwen3-tiny`, `qwen35-tiny` and its `-hv1` / `-hv3` head-ratio twins) and the
n_layer / n_vocab overrides give small models
for tests. The file loads with load_model_desc, gguf-py and llama.cpp's loader.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from .._checks import int_arg, path_arg
from .._cli_args import INT32_MAX, int_in, nonempty_path
from .._progress import byte_bar
from ..errors import InvalidArgumentError, PrefillError
from .gguf_model import expected_tensors, load_model_desc
from .model_desc import (QTYPE_BF16, QTYPE_BLOCK, QTYPE_F16, QTYPE_F32, QTYPE_IQ4_XS,
                         QTYPE_Q4_0, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_0, ModelDesc,
                         add_metadata, hparam_metadata, row_bytes)
from .quant import quantize, random_blocks


@dataclass(frozen=True)
class Preset:
    """Hyper-parameters of one model (spec.md §5); qwen35-only fields are 0 for qwen3."""
    arch: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    tied: bool
    context_length: int
    rope_base: float
    rope_dim: int
    ssm_hk: int = 0
    ssm_hv: int = 0
    ssm_dk: int = 0
    conv_kernel: int = 0
    interval: int = 0


def _qwen3(d: int, L: int, H: int, Hkv: int, ff: int, tied: bool, V: int = 151936) -> Preset:
    return Preset("qwen3", d, L, H, Hkv, 128, ff, V, tied, 40960, 1e6, 128)


def _qwen35(d: int, L: int, H: int, Hkv: int, hk: int, hv: int, ff: int, tied: bool,
            V: int = 248320) -> Preset:
    # head_dim 256 with R = 64 (partial_rotary 0.25), GDN dk = dv = 128, Kc 4, interval 4
    return Preset("qwen35", d, L, H, Hkv, 256, ff, V, tied, 262144, 1e7, 64,
                  ssm_hk=hk, ssm_hv=hv, ssm_dk=128, conv_kernel=4, interval=4)


PRESETS: dict[str, Preset] = {
    "qwen3-0.6b": _qwen3(1024, 28, 16, 8, 3072, True),
    "qwen3-4b": _qwen3(2560, 36, 32, 8, 9728, True),
    "qwen3-8b": _qwen3(4096, 36, 32, 8, 12288, False),
    "qwen35-0.8b": _qwen35(1024, 24, 8, 2, 16, 16, 3584, True),
    "qwen35-2b": _qwen35(2048, 24, 8, 2, 16, 16, 6144, True),
    "qwen35-4b": _qwen35(2560, 32, 16, 4, 16, 32, 9216, True),
    "qwen35-9b": _qwen35(4096, 32, 16, 4, 16, 32, 12288, False),
    "qwen35-27b": _qwen35(5120, 64, 24, 4, 16, 48, 17408, False),
    # small models for tests: every dim a multiple of 256 so all K-quants apply; H*D != d;
    # qwen35-tiny has Hv = 2*Hk (exercises the tiled head pairing) and is untied; its -hv1 and
    # -hv3 twins have Hv = Hk and Hv = 3*Hk (the other head ratios of the whole-model tests).
    "qwen3-tiny": _qwen3(256, 4, 4, 2, 512, True, V=1024),
    "qwen35-tiny": _qwen35(256, 4, 2, 1, 2, 4, 512, False, V=1024),
    "qwen35-tiny-hv1": _qwen35(256, 4, 2, 1, 2, 2, 512, False, V=1024),
    "qwen35-tiny-hv3": _qwen35(256, 4, 2, 1, 2, 6, 512, False, V=1024),
}

MIXES = ("q4_k_m", "q8_0", "f16", "bf16", "f32", "q4_0", "ud")
# llama.cpp's general.file_type (llama_ftype) written for each mix
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15, "ud": 15, "bf16": 32}
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_SPECIAL_BASE = {"qwen3": 151643, "qwen35": 248044}  # id of <|endoftext|> in the real vocab
_CHUNK_BYTES = 64 << 20


def min_vocab() -> int:
    """The smallest vocabulary a synthetic model can have: 256 byte tokens, the specials, one more."""
    return 256 + len(_SPECIALS) + 1


def preset_desc(model: str, n_layer: int | None = None, n_vocab: int | None = None,
                path: str = "", interval: int | None = None) -> ModelDesc:
    """The ModelDesc a synthetic file of this preset would have (no tensors, nothing written).
    n_layer, n_vocab and (qwen35) the full-attention interval may be overridden: interval=1
    makes every layer an attention layer (shortened models for tests)."""
    model = model.lower()
    if model not in PRESETS:
        raise InvalidArgumentError(f"unknown model preset '{model}' "
                                   f"(known: {', '.join(PRESETS)})")
    p = PRESETS[model]
    L = p.n_layer if n_layer is None else int(n_layer)
    V = p.n_vocab if n_vocab is None else int(n_vocab)
    if L < 1:
        raise InvalidArgumentError(f"n_layer must be >= 1, got {L}")
    if V < min_vocab():
        raise InvalidArgumentError(f"n_vocab must be >= {min_vocab()} "
                                   f"(256 byte tokens + specials), got {V}")
    iv = p.interval if interval is None else int(interval)
    if p.arch == "qwen3":
        if interval is not None:
            raise InvalidArgumentError(f"interval applies to qwen35 presets, not {model}")
        kinds = ("attn",) * L
    else:
        if iv < 1:
            raise InvalidArgumentError(f"interval must be >= 1, got {iv}")
        kinds = tuple("attn" if (il + 1) % iv == 0 else "gdn" for il in range(L))
    return ModelDesc(
        path=path, arch=p.arch, n_block=L, n_layer=L, n_embd=p.n_embd, n_ff=p.n_ff,
        n_head=p.n_head, n_head_kv=p.n_head_kv, head_dim=p.head_dim, rope_base=p.rope_base,
        rope_dim=p.rope_dim, eps=float(np.float32(1e-6)), context_length=p.context_length,
        n_vocab=V, tied_output=p.tied, layer_kinds=kinds,
        full_attention_interval=iv, conv_kernel=p.conv_kernel, ssm_dk=p.ssm_dk,
        ssm_hk=p.ssm_hk, ssm_hv=p.ssm_hv, ssm_inner=p.ssm_hv * p.ssm_dk)


# ---------------------------------------------------------------------------------------------
# quant mixes

def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp llama-quant.cpp use_more_bits: first/last eighth and every third in between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_qtype(mix: str, name: str, desc: ModelDesc) -> int:
    """The GGML type `mix` gives tensor `name` (1-D tensors and ssm_conv1d are always F32).

    q4_k_m follows llama-quantize's Q4_K_M: Q6_K for output (or tied token_embd); attn_v and the
    GDN attn_qkv share the attn_v rule (Q6_K on use_more_bits layers, else Q4_K / Q5_K for
    attn_qkv as llama-quant gives fused qkv); ffn_down Q6_K on use_more_bits layers; Q4_K
    elsewhere. ud (unsloth-dynamic-like): IQ4_XS FFN, Q8_0 ssm_alpha/beta, Q6_K for embeddings,
    output, attn_v, attn_qkv, Q5_K for the other matrices.
    """
    mix = mix.lower()
    shape, _ = expected_tensors(desc)[name]
    if len(shape) == 1 or name.endswith("ssm_conv1d.weight"):
        return QTYPE_F32
    role = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
    il = int(name.split(".")[1]) if name.startswith("blk.") else -1
    output_like = role == "output" or (role == "token_embd" and desc.tied_output)
    if mix in ("f32", "f16", "bf16", "q8_0", "q4_0"):
        q = {"f32": QTYPE_F32, "f16": QTYPE_F16, "bf16": QTYPE_BF16, "q8_0": QTYPE_Q8_0,
             "q4_0": QTYPE_Q4_0}[mix]
    elif mix == "q4_k_m":
        if output_like:
            q = QTYPE_Q6_K
        elif role in ("attn_v", "attn_qkv", "ffn_down") and _use_more_bits(il, desc.n_layer):
            q = QTYPE_Q6_K
        elif role == "attn_qkv":
            q = QTYPE_Q5_K
        else:
            q = QTYPE_Q4_K
    elif mix == "ud":
        if role in ("ffn_gate", "ffn_up", "ffn_down"):
            q = QTYPE_IQ4_XS
        elif role in ("ssm_alpha", "ssm_beta"):
            q = QTYPE_Q8_0
        elif role in ("token_embd", "output", "attn_v", "attn_qkv"):
            q = QTYPE_Q6_K
        else:
            q = QTYPE_Q5_K
    else:
        raise InvalidArgumentError(f"unknown quant mix '{mix}' (known: {', '.join(MIXES)})")
    k = shape[-1]
    if k % QTYPE_BLOCK[q][0]:  # llama-quantize's fallback for rows the block does not divide
        q = QTYPE_Q8_0 if k % 32 == 0 else QTYPE_F16
    return q


def tensor_plan(desc: ModelDesc, mix: str) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, NumPy shape, qtype) for every tensor, in file order (token_embd, blocks, output)."""
    exp = expected_tensors(desc)
    head = ["token_embd.weight"]
    tail = ["output_norm.weight"] + ([] if desc.tied_output else ["output.weight"])
    names = head + [n for n in exp if n.startswith("blk.")] + tail
    return [(n, exp[n][0], tensor_qtype(mix, n, desc)) for n in names]


# ---------------------------------------------------------------------------------------------
# tensor contents

def _vector_values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Plausible float32 values for the 1-D / conv tensors (NumPy shape)."""
    if name.endswith("ssm_a"):            # -exp(A_log), A_log small: decays in (-4.5, -1]
        return -np.exp(rng.uniform(0.0, 1.5, shape)).astype(np.float32)
    if name.endswith("ssm_dt.bias"):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("ssm_conv1d.weight"):
        return (0.2 * rng.standard_normal(shape)).astype(np.float32)
    return (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32)  # every norm weight


def _tensor_chunks(name: str, shape: tuple[int, ...], qtype: int, rng: np.random.Generator,
                   fast: bool) -> Iterator[np.ndarray]:
    """Yield the tensor's bytes (uint8 arrays) in row chunks of at most ~64 MB."""
    if len(shape) == 1 or name.endswith("ssm_conv1d.weight"):
        yield _vector_values(name, shape, rng).view(np.uint8).reshape(-1)
        return
    rows, k = shape
    rb = row_bytes(qtype, k)
    scale = float(np.clip(1.0 / np.sqrt(k), 0.02, 0.05))
    step = max(1, _CHUNK_BYTES // (rb if fast else 4 * k))  # slow path holds float32 rows
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        if fast:
            yield random_blocks(n, k, qtype, rng, scale=scale).reshape(-1)
        else:
            w = rng.standard_normal((n, k), dtype=np.float32) * np.float32(scale)
            yield quantize(w, qtype).reshape(-1)


# ---------------------------------------------------------------------------------------------
# tokenizer

def _byte_unicode() -> list[str]:
    """GPT-2's byte -> printable unicode map (bytes_to_unicode), as 256 token strings."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def synthetic_vocab(arch: str, n_vocab: int, seed: int = 0
                    ) -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """(tokens, token types, merges, special ids) of a byte-level BPE vocabulary of n_vocab.

    Ids 0..255: the byte tokens; then merged tokens, each the concatenation of two earlier
    tokens (the first 1000 are listed as merges); <|endoftext|>, <|im_start|>, <|im_end|> at
    their real ids when the vocabulary is the real size (else at the end); ids after the
    specials are [PADn] (type UNUSED). Token types: 1 normal, 3 control, 5 unused.
    """
    base = min(_SPECIAL_BASE[arch], n_vocab - len(_SPECIALS))
    rng = np.random.default_rng(seed + 7919)
    tokens = _byte_unicode()
    seen = set(tokens)
    merges: list[str] = []
    pool = rng.integers(0, 1 << 30, size=(2 * (base - 256) + 64, 2))
    pi = 0
    while len(tokens) < base:
        lim = min(len(tokens), 4096)   # combine short tokens only: lengths stay small
        a, b = int(pool[pi, 0] % lim), int(pool[pi, 1] % lim)
        pi += 1
        if pi == len(pool):
            pool, pi = rng.integers(0, 1 << 30, size=(4096, 2)), 0
        s = tokens[a] + tokens[b]
        if s in seen:
            continue
        seen.add(s)
        if len(merges) < 1000:
            merges.append(f"{tokens[a]} {tokens[b]}")
        tokens.append(s)
    types = [1] * base
    tokens += list(_SPECIALS)
    types += [3] * len(_SPECIALS)
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(5)
    ids = {s: base + i for i, s in enumerate(_SPECIALS)}
    return tokens, types, merges, ids


# ---------------------------------------------------------------------------------------------
# writer

def _add_metadata(w: Any, desc: ModelDesc, model: str, mix: str, seed: int) -> None:
    import gguf
    a = desc.arch
    w.add_string("general.type", "model")
    w.add_string("general.name", f"pyprefill synthetic {model} {mix} seed {seed}")
    w.add_uint32("general.file_type", _FILE_TYPE[mix])
    w.add_uint32("general.quantization_version", 2)
    add_metadata(w, hparam_metadata(desc))
    tokens, types, merges, ids = synthetic_vocab(a, desc.n_vocab, seed)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2" if a == "qwen3" else "qwen35")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_key_value("tokenizer.ggml.token_type", types, gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.INT32)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.eos_token_id", ids["<|im_end|>"])
    w.add_uint32("tokenizer.ggml.bos_token_id", ids["<|endoftext|>"])
    w.add_uint32("tokenizer.ggml.padding_token_id", ids["<|endoftext|>"])
    w.add_bool("tokenizer.ggml.add_bos_token", False)


def write_synthetic(model: str, mix: str, out_path: str | os.PathLike[str], seed: int = 0,
                    progress: bool = True, n_vocab: int | None = None,
                    n_layer: int | None = None, fast: bool = True,
                    interval: int | None = None) -> ModelDesc:
    """Write a synthetic GGUF of preset `model` in quant mix `mix`; returns its ModelDesc.

    fast=True writes random valid blocks (GB/s); fast=False quantizes random normal weights
    with quant.quantize (slow; for small models that should hold "real" quantized data).
    Peak memory is one ~64 MB chunk plus the tokenizer metadata.
    """
    import gguf
    mix, model = mix.lower(), model.lower()   # "Q4_K_M" as llama.cpp writes it, or "q4_k_m"
    if mix not in MIXES:
        raise InvalidArgumentError(f"unknown quant mix '{mix}' (known: {', '.join(MIXES)})")
    out_path = path_arg(out_path, "out_path")
    seed = int_arg(seed, "seed", 0)
    if os.path.isdir(out_path):
        raise InvalidArgumentError(f"{out_path}: is a directory (give the path of the .gguf to write)")
    parent = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        raise InvalidArgumentError(f"{out_path}: {os.path.dirname(out_path) or parent} {what}")
    desc = preset_desc(model, n_layer=n_layer, n_vocab=n_vocab, path=out_path, interval=interval)
    plan = tensor_plan(desc, mix)
    rng = np.random.default_rng(seed)

    w = gguf.GGUFWriter(out_path, desc.arch)
    _add_metadata(w, desc, model, mix, seed)
    sizes = []
    for name, shape, qtype in plan:
        nbytes = row_bytes(qtype, shape[-1]) * int(np.prod(shape[:-1], dtype=np.int64))
        byte_shape = (*shape[:-1], row_bytes(qtype, shape[-1]))
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes,
                          raw_dtype=gguf.GGMLQuantizationType(qtype))
        sizes.append(nbytes)
    align = w.data_alignment
    bar = byte_bar(sum(sizes), f"synth {model} {mix}", progress)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        f = w.fout[0]
        f.write(b"\0" * (-f.tell() % align))
        for (name, shape, qtype), nbytes in zip(plan, sizes):
            written = 0
            for chunk in _tensor_chunks(name, shape, qtype, rng, fast):
                f.write(memoryview(np.ascontiguousarray(chunk)))
                written += chunk.nbytes
                bar.update(chunk.nbytes)
            assert written == nbytes, (name, written, nbytes)
            f.write(b"\0" * (-nbytes % align))  # tensor data offsets are aligned (GGUF)
    except BaseException:
        w.close()
        if os.path.isfile(out_path):   # a partial file; never a device (-o /dev/full) or a dir
            os.remove(out_path)
        raise
    finally:
        bar.close()
    w.close()
    return load_model_desc(out_path)


# ---------------------------------------------------------------------------------------------
# CLI

def _run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        write_synthetic(args.model, args.quant, args.output, seed=args.seed,
                        progress=not args.quiet, n_vocab=args.vocab, n_layer=args.layers,
                        fast=not args.exact)
    except OSError as e:   # a write that failed midway (disk full): name the file
        if e.filename is None and not isinstance(e, PrefillError):
            raise OSError(e.errno, e.strerror, args.output) from e
        raise
    size = os.path.getsize(args.output)
    shown = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"   # tiny: MiB
    print(f"wrote {args.output}: {shown} in {time.monotonic() - t0:.1f} s")
    return 0


def add_synth_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `pyprefill synth --model NAME --quant MIX -o FILE [...]`; func(args) -> int."""
    p = subparsers.add_parser("synth", help="write a synthetic GGUF model with real shapes",
                              description=write_synthetic.__doc__)
    p.add_argument("--model", required=True, type=str.lower, choices=list(PRESETS), help="shape preset")
    p.add_argument("--quant", default="q4_k_m", type=str.lower, choices=list(MIXES),
                   help="quant mix, any case (Q4_K_M as llama.cpp writes it)")
    p.add_argument("-o", "--output", required=True, type=nonempty_path, help="output .gguf path")
    p.add_argument("--seed", type=int_in(0), default=0)
    p.add_argument("--layers", type=int_in(1, INT32_MAX), default=None,
                   help="override the layer count (>= 1)")
    p.add_argument("--vocab", type=int_in(min_vocab(), INT32_MAX), default=None,
                   help=f"override the vocabulary size (>= {min_vocab()}: 256 byte tokens, the "
                        "specials and one merge)")
    p.add_argument("--exact", action="store_true",
                   help="quantize random normal weights instead of random blocks (slow)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
    return p
