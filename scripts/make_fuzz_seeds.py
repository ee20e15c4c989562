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
prefix/: operation sequences in tests/fuzz/fuzz_prefix.cpp's byte encoding (prompts that share
prefixes and diverge inside a page, snapshots and re-runs, the host tier, claims in flight, forks
and rollbacks, every kind of bad input; and one per refused config).

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


# fuzz_prefix.cpp's operation codes
PX_START, PX_COMPUTE, PX_FINISH, PX_DROP, PX_FORK, PX_ROLLBACK, PX_EXTEND, PX_INSERT, PX_EVICT, PX_LOOKUP, \
    PX_BAD, PX_EVICT_BUDGET = 0, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14


def prefix_seed(ops, *, recurrent=False, page128=False, every=0, host=0, vocab=5, budget_pages=16,
                pages=120, slots=40, snap=0, broken=None) -> bytes:
    """One input of fuzz_prefix.cpp's decoder (its header comment has the layout): the config,
    then `ops`, already encoded by px_* below."""
    flags = recurrent | page128 << 1 | (every // 64) << 2 | (host > 0) << 4 | (broken is not None) << 5
    head = bytes((flags, vocab - 2, budget_pages - 1, max(host, 2) - 2, pages - 4, slots - 2, snap,
                  broken or 0))
    return head + b"".join(ops)


def px(code, session=0, *args) -> bytes:
    return bytes((code | session << 4, *args))


def px_start(session, base=None, keep=255, new=0, logits=False, hist=0) -> bytes:
    """A request: prompt = the first `keep` of earlier prompt `base` (None: none; the decoder's
    history then has `hist` prompts) and new tokens (new * 3 page_rows / 256 of them)."""
    a = (hist if base is None else base) | (128 if logits else 0)
    return px(PX_START, session, a, keep, new)


def prefix_seeds() -> dict[str, bytes]:
    full = lambda s: [px(PX_COMPUTE, s), px(PX_FINISH, s)]
    return {
        # qwen3: a prompt, one that diverges inside its second page, the first again, then a
        # budget of 4 pages: least recent first.
        "qwen3-share-diverge-evict": prefix_seed(
            [px_start(0, new=120), *full(0), px_start(1, 0, keep=20, new=60, hist=1), *full(1),
             px_start(2, 0, logits=True), *full(2), px(PX_EVICT, 0, 16), px(PX_LOOKUP, 0, 1, 255, 0)],
            budget_pages=4),
        # qwen35: snapshots every 64, a branch inside an edge, re-runs, the host tier round trip.
        "qwen35-snapshots-host": prefix_seed(
            [px_start(0, new=200), *full(0), px_start(1, 0, keep=30, new=90, hist=1), *full(1),
             px(PX_EVICT, 0, 0), px_start(2, 1, keep=254, logits=True), *full(2),
             px(PX_LOOKUP | 0x80, 0, 0, 40, 10), px(PX_EVICT_BUDGET)],
            recurrent=True, every=64, host=60, snap=1),
        # a snapshot nobody resumed from goes to the host alone; a prefill that snapshots every
        # page boundary (op bit 7: session 10 is session 0) gives the tree a device copy back
        "qwen35-snapshot-host-replace": prefix_seed(
            [px_start(0, new=214), px(PX_COMPUTE, 10), px(PX_FINISH, 0), px(PX_LOOKUP, 0, 128, 255, 0),
             px(PX_EVICT, 0, 16), px_start(1, 0, keep=255), px(PX_COMPUTE, 11), px(PX_FINISH, 1)],
            recurrent=True, every=64, host=60),
        # two requests for the same prefix in flight: the second waits
        "claims-in-flight": prefix_seed(
            [px_start(0, new=150), px_start(1, 0, keep=255, new=30, hist=1), px(PX_COMPUTE, 0),
             px(PX_FINISH, 0), px_start(1, 0, keep=255, new=30), *full(1)],
            recurrent=True, every=128, page128=True),
        # a session forked at a partial page, rolled back into a shared page, extended, inserted
        "fork-rollback-extend": prefix_seed(
            [px_start(0, new=100), *full(0), px(PX_FORK, 0, 1), px(PX_ROLLBACK, 1, 40),
             px(PX_EXTEND, 1, 70, 9), px(PX_INSERT, 1), px(PX_DROP, 0), px(PX_EVICT, 0, 4)],
            vocab=3, host=10),
        # a pool of 6 pages: appends and restores run out and evict
        "tight-pool": prefix_seed(
            [px_start(0, new=250), *full(0), px_start(1, new=250, hist=1), *full(1),
             px_start(2, 0, keep=255, new=40, hist=2), *full(2)],
            pages=6, budget_pages=2, host=8),
        "bad-inputs": prefix_seed(
            [px_start(0, new=80), px(PX_COMPUTE, 0)] +
            [px(PX_BAD, 0, kind, 7 * kind + 1, 0, 255, 40) for kind in range(14)] + full(0),
            recurrent=True, every=64),
        **{f"reject-config-{name}": prefix_seed([px_start(0, new=10)], recurrent=True, broken=field)
           for field, name in enumerate(("device-budget", "host-budget", "page-rows", "snapshot-every",
                                         "vocab", "snapshot-bytes"))},
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
    px_dir = CORPUS / "prefix"
    px_dir.mkdir(parents=True, exist_ok=True)
    for f in px_dir.iterdir():
        f.unlink()
    for name, data in prefix_seeds().items():
        (px_dir / name).write_bytes(data)
    dirs = (g, s, bd, sd, px_dir)
    total = sum(f.stat().st_size for d in dirs for f in d.iterdir())
    print(f"wrote {sum(1 for d in dirs for _ in d.iterdir())} seeds, {total} bytes, under {CORPUS}")


if __name__ == "__main__":
    main()
