"""Issue 13 item 7: every restore of a corrupted, truncated, foreign-model or crafted state is
rejected with a typed error before the session changes; the session then continues bitwise as
if nothing had been tried. (The header checks themselves are fuzzed on the CPU:
tests/fuzz/fuzz_state.cpp.) GPU; about 10 s."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from _engine_models import random_tokens, synth_model
from pyprefill import errors

pytestmark = pytest.mark.gpu

EXACT = dict(gemm="f32", attention="cublas")
HEADER = 64   # session_state.h: magic, fingerprint, pos, kv_dtype, n_attn, n_gdn, last_token, 3 dims
CAPACITY = 96


@pytest.fixture(scope="module")
def models():
    from pyprefill.model import Model
    out = {p: Model.load(synth_model(p, "q8_0"), gemm="f32", prewarm=False, progress=False)
           for p in ("qwen3-tiny", "qwen35-tiny")}
    out["qwen35-tiny-q4_0"] = Model.load(synth_model("qwen35-tiny", "q4_0"), gemm="f32",
                                         prewarm=False, progress=False)
    yield out
    for m in out.values():
        m.close()


def _patch(state: bytes, offset: int, fmt: str, value) -> bytes:
    b = bytearray(state)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


def _bad_states(state: bytes, n_vocab: int) -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, the error message's phrase). Offsets follow StateHeader."""
    pos = struct.unpack_from("<q", state, 16)[0]
    cases = {
        "empty": (b"", "pf_session_restore: "),   # "too short" (or "src is NULL")
        "header_only_cut": (state[:HEADER - 1], "too short"),
        "truncated_by_one": (state[:-1], f"a state of {pos} positions has"),
        "truncated_half": (state[:len(state) // 2], "positions has"),
        "one_byte_more": (state + b"\0", "positions has"),
        "not_a_state": (bytes(np.random.default_rng(1).integers(0, 256, len(state), np.uint8)),
                        "not a pyprefill session state"),
        "magic": (_patch(state, 7, "<B", ord("2")), "not a pyprefill session state"),
        "fingerprint": (_patch(state, 8, "<Q", struct.unpack_from("<Q", state, 8)[0] ^ 1),
                        "another model"),
        "kv_dtype_field": (_patch(state, 24, "<i", 1 - struct.unpack_from("<i", state, 24)[0]), "KV dtype"),
        "pos_beyond_capacity": (_patch(state, 16, "<q", CAPACITY + 1), "capacity is 96"),
        "pos_negative": (_patch(state, 16, "<q", -1), "capacity"),
        "pos_huge": (_patch(state, 16, "<q", 2**62), "capacity"),
        "pos_smaller": (_patch(state, 16, "<q", pos - 1), "positions has"),
        "n_attn": (_patch(state, 28, "<i", struct.unpack_from("<i", state, 28)[0] + 1), "layout"),
        "kv_dim_huge": (_patch(state, 40, "<q", 2**62), "layout"),
        "conv_floats_huge": (_patch(state, 48, "<q", 2**62 + 1), "layout"),
        "ssm_floats_negative": (_patch(state, 56, "<q", -4), "layout"),
        "next_token_beyond_vocab": (_patch(state, 36, "<i", n_vocab), "outside the vocabulary"),
        "next_token_negative": (_patch(state, 36, "<i", -2), "outside the vocabulary"),
    }
    # every single header byte flipped, except the low byte of the next token (a flip there
    # can name another valid token: a different, legitimate state)
    for i in range(HEADER):
        if i != 36:
            cases[f"flip_header_byte_{i}"] = (_patch(state, i, "<B", state[i] ^ 0xFF), "pf_session_restore")
    return cases


def _assert_rejected(session, blob: bytes, phrase: str, pos: int):
    with pytest.raises(errors.InvalidArgumentError, match="pf_session_restore") as info:
        session.restore(blob)
    assert phrase in str(info.value), str(info.value)
    assert session.position == pos


@pytest.mark.parametrize("kv", ["f16", "f32"])
@pytest.mark.parametrize("preset", ["qwen3-tiny", "qwen35-tiny"])
def test_bad_states_leave_the_session_unchanged(models, preset, kv, rng):
    m = models[preset]
    tokens = random_tokens(rng, 60, m.n_vocab)
    s = m.session(max_tokens=CAPACITY, chunk=16, kv=kv, **EXACT)
    s.prefill(tokens[:40], "none")
    good = s.save()
    want = s.prefill(tokens[40:52], "all")          # what continuing from position 40 gives
    s.restore(good)
    assert s.position == 40
    for name, (blob, phrase) in _bad_states(good, m.n_vocab).items():
        try:
            _assert_rejected(s, blob, phrase, 40)
        except AssertionError as e:
            raise AssertionError(f"{preset} kv={kv} case {name}: {e}") from None
    got = s.prefill(tokens[40:52], "all")
    assert np.array_equal(got, want), (f"{preset} kv={kv}: after the rejected restores the logits "
                                       f"differ (max |diff| {np.abs(got - want).max():.3e})")


def test_foreign_states_are_rejected(models, rng):
    """A state of another arch, of the same preset in another quant mix (another file), of the
    other KV dtype, and one longer than the session's capacity."""
    a, b, b_q4 = models["qwen3-tiny"], models["qwen35-tiny"], models["qwen35-tiny-q4_0"]
    tokens = random_tokens(rng, 50, b.n_vocab)
    ref = b.session(max_tokens=CAPACITY, chunk=16, kv="f16", **EXACT)
    ref.prefill(tokens[:20], "none")
    want = ref.prefill(tokens[20:30], "last")
    s = b.session(max_tokens=CAPACITY, chunk=16, kv="f16", **EXACT)
    s.prefill(tokens[:20], "none")

    def state_of(model, n, kv="f16", cap=CAPACITY):
        t = model.session(max_tokens=cap, chunk=16, kv=kv, **EXACT)
        t.prefill(tokens[:n], "none")
        return t.save()

    _assert_rejected(s, state_of(a, 20), "another model", 20)
    _assert_rejected(s, state_of(b_q4, 20), "another model", 20)
    _assert_rejected(s, state_of(b, 20, kv="f32"), "KV dtype", 20)
    small = b.session(max_tokens=32, chunk=16, kv="f16", **EXACT)
    small.prefill(tokens[:5], "none")
    _assert_rejected(small, state_of(b, 40), "capacity is 32", 5)
    got = s.prefill(tokens[20:30], "last")
    assert np.array_equal(got, want)


def test_huge_byte_count_is_rejected_before_reading(models, rng):
    """A caller that passes a length far beyond its buffer: the size check fails before a single
    payload byte is read (only the 64-byte header is)."""
    from pyprefill._errors import _check
    from pyprefill._ffi import ffi, lib
    m = models["qwen3-tiny"]
    s = m.session(max_tokens=CAPACITY, chunk=16, kv="f16", **EXACT)
    s.prefill(random_tokens(rng, 8, m.n_vocab), "none")
    good = np.frombuffer(s.save(), np.uint8).copy()
    for n in (2**63, 2**64 - 1, len(good) + 4096):
        with pytest.raises(errors.InvalidArgumentError, match="positions has"):
            _check(lib.pf_session_restore(s.ptr, ffi.from_buffer("char[]", good), n))
    with pytest.raises(errors.InvalidArgumentError, match="src is NULL"):
        _check(lib.pf_session_restore(s.ptr, ffi.NULL, len(good)))
    assert s.position == 8
