"""Write the seed corpus of the fuzz targets (tests/fuzz/corpus/): small real inputs that pass
every check, so that the fuzzer starts deep in the parser instead of at the magic number.

gguf/: tiny valid models of both archs written by the same writer as the test GGUFs (the
tensor table of formats.gguf_model.expected_tensors, every supported qtype on some matrix),
the same with every integer key 64 bits wide (u64 / i64) and floats as f64, plus the
metadata and tensor-info prefix of each test fixture (tests/data/*.mix.gguf: real
tokenizer arrays; the tensor data cut off, so those seeds are truncated files).
state/: a saved state of each layout of tests/fuzz/fuzz_state.cpp at a few positions.
batch/: batches of tests/fuzz/fuzz_batch.cpp's byte encoding (valid ones: ragged lengths,
snapshot cuts, a decode item; and one per rejection class).
shard/: models and rank counts in tests/fuzz/fuzz_shard.cpp's byte encoding (splits of both
archs: tiled GDN heads, replicated KV heads, an uneven FFN, K-quant mixes; and one per refusal).

    python scripts/make_fuzz_seeds.py          (deterministic; rewrites the corpus)
"""
from __future__ import annotations

import dataclasses
import struct
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pyprefill.formats.gguf_model import expected_tensors  # noqa: E402
from pyprefill.formats.model_desc import (QTYPE_BF16, QTYPE_F16, QTYPE_F32, QTYPE_Q4_0,  # noqa: E402
                                          QTYPE_Q8_0, ModelDesc, add_metadata, hparam_metadata,
                                          row_bytes)

CORPUS = ROOT / "tests" / "fuzz" / "corpus"


def tiny(arch: str, **kw) -> ModelDesc:
    """A valid model far smaller than the tiny presets: widths of 32, a vocabulary of 8."""
    base = dict(path="", arch=arch, n_block=1, n_layer=1, n_embd=32, n_ff=32, n_head=2,
                n_head_kv=1, head_dim=16, rope_base=1e4, rope_dim=16, eps=1e-6,
                context_length=64, n_vocab=8, tied_output=True, layer_kinds=("attn",))
    if arch == "qwen35":
        base.update(n_block=4, n_layer=4, layer_kinds=("gdn", "gdn", "gdn", "attn"),
                    full_attention_interval=4, conv_kernel=4, ssm_dk=16, ssm_hk=1, ssm_hv=2,
                    ssm_inner=32, rope_dim=8)
    base.update(kw)
    return ModelDesc(**base)


def write_model(path: Path, desc: ModelDesc, qtypes: list[int], rng: np.random.Generator,
                wide: bool = False) -> None:
    """Every expected tensor; matrices cycle through `qtypes` (where the block divides k).
    wide: integer keys as u64 / i64 (alternately) and floats as f64, so that mutating a value
    reaches every 64-bit magnitude without reshaping the file."""
    w = gguf.GGUFWriter(str(path), desc.arch)
    kv = hparam_metadata(desc)
    if desc.nextn_predict_layers:
        kv[f"{desc.arch}.nextn_predict_layers"] = desc.nextn_predict_layers
    if wide:
        for i, (key, value) in enumerate(kv.items()):
            if isinstance(value, list):
                w.add_array(key, value)
            elif isinstance(value, float):
                w.add_float64(key, value)
            elif i % 2:
                w.add_int64(key, int(value))
            else:
                w.add_uint64(key, int(value))
        w.add_uint64("general.alignment", 32)
    else:
        add_metadata(w, kv)
    i = 0
    for name, (shape, _) in expected_tensors(desc).items():
        if len(shape) == 1 or name.endswith("ssm_conv1d.weight"):
            q = QTYPE_F32
        else:
            q = qtypes[i % len(qtypes)]
            i += 1
            if shape[-1] % 32 and q not in (QTYPE_F32, QTYPE_F16, QTYPE_BF16):
                q = QTYPE_F16
        rb = row_bytes(q, shape[-1])
        data = rng.integers(0, 256, size=(*shape[:-1], rb), dtype=np.uint8)
        if q == QTYPE_F32:   # finite floats for the vectors
            data = rng.standard_normal(shape).astype(np.float32).view(np.uint8)
        w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType(q))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def state_seed(fingerprint: int, kv_dtype: int, n_attn: int, n_gdn: int, kv_dim: int,
               conv: int, ssm: int, pos: int, last: int, rng: np.random.Generator) -> bytes:
    """A state as pf_session_save writes it (session_state.h): header, K/V rows, GDN states."""
    head = struct.pack("<8sQqiiiiqqq", b"PFSTATE1", fingerprint, pos, kv_dtype, n_attn, n_gdn,
                       last, kv_dim, conv, ssm)
    elem = 4 if kv_dtype == 1 else 2
    body = pos * kv_dim * elem * 2 * n_attn + n_gdn * 4 * (conv + ssm)
    return head + rng.integers(0, 256, size=body, dtype=np.uint8).tobytes()


def batch_seed(items, *, kv=0, vocab=64, max_items=8, max_tokens=600, max_context=0, step=128,
               n=None, step_items=4) -> bytes:
    """One input of fuzz_batch.cpp's decoder: the limits, then each item (session index, model,
    KV flip, broken, capacity, position, tokens, mode, buffer, snapshot cut)."""
    u16 = lambda v: bytes((v & 255, v >> 8))
    out = bytes((kv, vocab - 1, max_items - 1)) + u16(max_tokens - 1)
    out += bytes((1,)) if max_context == 0 else bytes((0,)) + u16(max_context - 1)
    out += u16(step - 1) + bytes(((len(items) if n is None else n) + 1,))
    for it in items:
        flags = it.get("session", 0) | (0x40 if it.get("other_model") else 0) | \
            (0x10 if it.get("kv_flip") else 0) | (0x08 if it.get("broken") else 0)
        out += bytes((flags,)) + (bytes((1,)) if it.get("broken") else b"")
        out += u16(it.get("capacity", 700) - 1) + u16(it.get("pos", 0))
        toks = it.get("tokens", [1, 2, 3])
        out += u16(len(toks) + 2) + bytes(2 + t for t in toks)
        out += bytes((0x10 if it.get("null_tokens") else 0,))
        out += bytes(({"none": 0, "last": 1, "all": 2}[it.get("mode", "last")] + 1,))
        out += bytes((0 if it.get("short") else 1,))
        snap = it.get("snap", 0)
        out += bytes((0, snap // 64 - 1)) if snap else bytes((1,))
    return out + bytes((step_items - 1,))


def batch_seeds() -> dict[str, bytes]:
    rng = np.random.default_rng(2028)
    tok = lambda n: [int(t) for t in rng.integers(0, 64, n)]
    ragged = [dict(session=i, tokens=tok(n), pos=p, mode=m) for i, (n, p, m) in
              enumerate([(1, 5, "last"), (63, 0, "all"), (64, 100, "none"), (65, 1, "last"), (200, 64, "last")])]
    return {
        "ragged": batch_seed(ragged),
        "snapshots": batch_seed([dict(session=0, tokens=tok(250), pos=10, snap=128),
                                 dict(session=1, tokens=tok(1), pos=400, mode="all")], step=100),
        "one-step-each": batch_seed([dict(session=i, tokens=tok(1), pos=i) for i in range(8)], step_items=8),
        "reject-same-session": batch_seed([dict(session=3), dict(session=3)]),
        "reject-other-model": batch_seed([dict(session=0), dict(session=1, other_model=True)]),
        "reject-capacity": batch_seed([dict(session=0, tokens=tok(20), pos=690)]),
        "reject-short-logits": batch_seed([dict(session=0, mode="all", short=True)]),
        "reject-no-items": batch_seed([], n=0),
    }


# fuzz_shard.cpp's types, by index, and the roles its bytes 16-29 give a type to
SHARD_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
SHARD_ROLES = ("token_embd", "output", "ffn_gate", "ffn_up", "ffn_down", "attn_q", "attn_k", "attn_v",
               "attn_output", "attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out")


def shard_seed(*, qwen35=False, tied=False, floats=False, untyped=False, alternate=False, ranks=2,
               layers=4, attn_bits=0b1000, kv=2, group=2, head_dim=128, embd=256, ff=512, vocab=1024,
               hk=2, ratio=2, dk=128, kc=4, types=None, drop=0) -> bytes:
    """One input of fuzz_shard.cpp's decoder (its header comment has the layout). `types` maps
    roles to type names; the rest are Q8_0."""
    u16 = lambda v: bytes((v & 255, v >> 8))
    flags = qwen35 | tied << 1 | floats << 2 | untyped << 3 | alternate << 4
    out = bytes((flags, ranks + 1, layers - 1, attn_bits, kv - 1, group - 1, head_dim.bit_length() - 5,
                 embd // 32 - 1))
    out += u16(ff // 32 - 1) + u16(vocab - 1)
    out += bytes((hk - 1, ratio - 1, dk.bit_length() - 5, kc - 2))
    types = types or {}
    out += bytes(SHARD_TYPES.index(types.get(role, "Q8_0")) for role in SHARD_ROLES)
    return out + bytes((drop,))


def shard_seeds() -> dict[str, bytes]:
    q4_k_m = {role: "Q4_K" for role in SHARD_ROLES} | {"token_embd": "Q6_K", "output": "Q6_K",
                                                       "attn_qkv": "Q5_K"}
    ud = {role: "Q5_K" for role in SHARD_ROLES} | {r: "IQ4_XS" for r in ("ffn_gate", "ffn_up", "ffn_down")} | \
        {r: "Q6_K" for r in ("token_embd", "output", "attn_v", "attn_qkv")} | \
        {"ssm_beta": "Q8_0", "ssm_alpha": "Q8_0"}
    return {
        "qwen3-f32-2": shard_seed(floats=True, tied=True),
        "qwen3-q4k-4-replicated-kv": shard_seed(kv=2, group=4, ranks=4, ff=1024, types=q4_k_m, alternate=True),
        "qwen35-tiled-q8-4": shard_seed(qwen35=True, hk=4, ratio=2, kv=1, group=4, ranks=4, head_dim=256),
        "qwen35-27b-like-8": shard_seed(qwen35=True, layers=8, attn_bits=0b10001000, hk=16, ratio=3, kv=4,
                                        group=6, ranks=8, head_dim=256, embd=512, ff=4352, vocab=4096,
                                        types=q4_k_m, alternate=True),
        "one-rank-mixed": shard_seed(qwen35=True, ranks=1, hk=3, ratio=3, types=ud, kc=3, dk=64),
        "reject-ssm-out-block-cut": shard_seed(qwen35=True, hk=2, ratio=1, kv=1, group=2, head_dim=256,
                                               types=ud),
        "reject-heads-3": shard_seed(kv=2, group=4, ranks=3),
        "reject-kv-3": shard_seed(kv=4, group=3, ranks=3),
        "reject-gdn-key-heads-3": shard_seed(qwen35=True, hk=16, ratio=1, kv=3, group=4, ranks=3),
        "reject-ranks-0": shard_seed(ranks=0),
        "reject-ranks-9": shard_seed(ranks=9),
        "reject-untyped": shard_seed(untyped=True, drop=7),
    }


def main() -> None:
    rng = np.random.default_rng(2026)
    g = CORPUS / "gguf"
    s = CORPUS / "state"
    for d in (g, s):
        d.mkdir(parents=True, exist_ok=True)
        for f in d.iterdir():
            f.unlink()
    write_model(g / "qwen3-f32", tiny("qwen3"), [QTYPE_F32], rng)
    write_model(g / "qwen3-mixed-untied", tiny("qwen3", tied_output=False, n_block=2, n_layer=2,
                                                  layer_kinds=("attn", "attn")),
                [QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_F16, QTYPE_BF16], rng)
    write_model(g / "qwen35-q8", tiny("qwen35"), [QTYPE_Q8_0, QTYPE_F16], rng)
    write_model(g / "qwen35-mtp", tiny("qwen35", n_block=5, nextn_predict_layers=1),
                [QTYPE_Q4_0, QTYPE_BF16], rng)
    write_model(g / "qwen3-wide-keys", tiny("qwen3"), [QTYPE_Q8_0], rng, wide=True)
    write_model(g / "qwen35-mtp-wide-keys", tiny("qwen35", n_block=5, nextn_predict_layers=1),
                [QTYPE_F16], rng, wide=True)
    for name in ("qwen3_tiny.mix.gguf", "qwen35_hv2.mix.gguf"):
        path = ROOT / "tests" / "data" / name
        head = gguf.GGUFReader(str(path)).data_offset
        (g / f"fixture-{name.split('.')[0]}-metadata").write_bytes(path.read_bytes()[:head])
    layouts = {"qwen3-like": (0x1111222233334444, 0, 2, 0, 16, 0, 0),
               "qwen35-like": (0x5555666677778888, 0, 1, 3, 8, 24, 32),
               "qwen35-like-f32kv": (0x5555666677778888, 1, 1, 3, 8, 24, 32)}
    rng = np.random.default_rng(2027)   # the states' own stream: new GGUF seeds leave them be
    for name, lay in layouts.items():
        for pos, last in ((0, -1), (3, 5), (4, 63)):
            (s / f"{name}-pos{pos}").write_bytes(state_seed(*lay, pos, last, rng))
    bd = CORPUS / "batch"
    bd.mkdir(parents=True, exist_ok=True)
    for f in bd.iterdir():
        f.unlink()
    for name, data in batch_seeds().items():
        (bd / name).write_bytes(data)
    sd = CORPUS / "shard"
    sd.mkdir(parents=True, exist_ok=True)
    for f in sd.iterdir():
        f.unlink()
    for name, data in shard_seeds().items():
        (sd / name).write_bytes(data)
    total = sum(f.stat().st_size for d in (g, s, bd, sd) for f in d.iterdir())
    print(f"wrote {sum(1 for d in (g, s, bd, sd) for _ in d.iterdir())} seeds, {total} bytes, under {CORPUS}")


if __name__ == "__main__":
    main()
