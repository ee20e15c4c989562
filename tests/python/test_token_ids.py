"""One conversion of token input for every entry point (pyprefill._checks.token_ids): a wrong input
is refused naming the argument, the first bad index and its value, and is never run as another
prompt. The conversion itself, then each entry point on this machine (CPU: the engine's sessions
and batches are checked before their handle is touched, so a closed one shows the order), then
the same on a GPU."""
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest

from pyprefill._checks import INT32_MAX, token_id, token_ids
from pyprefill.errors import InvalidArgumentError

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
TINY = os.path.join(DATA, "qwen3_tiny.mix.gguf")
V = 1024                                              # the vocabulary of the checks without a model

# (input, the message's start): every case the issue lists, and its neighbours
BAD = [
    pytest.param([1.5, 2.7], "tokens[0] = 1.5 is not a token id: token ids are integers, got an array of dtype float64", id="floats"),
    pytest.param(np.array([3, 4.25]), "tokens[1] = 4.25 is not a token id", id="float-array-second"),
    pytest.param(np.array([1.0, 2.0]), "tokens[0] = 1.0 is not a token id: token ids are integers, got an array of dtype float64", id="whole-floats"),
    pytest.param([1, float("nan")], "tokens[1] = nan is not a token id", id="nan"),
    pytest.param(np.array([7, 4294967301], np.int64), f"tokens[1] = 4294967301 is outside the vocabulary [0, {V})", id="int64-wraps-to-5"),
    pytest.param(np.array([2**63 - 1], np.uint64), f"tokens[0] = {2**63 - 1} is outside the vocabulary", id="uint64"),
    pytest.param([5, -1], f"tokens[1] = -1 is outside the vocabulary [0, {V})", id="negative"),
    pytest.param([1, V], f"tokens[1] = {V} is outside the vocabulary [0, {V})", id="one-past-vocab"),
    pytest.param([1, 2**70], f"tokens[1] = {2**70} is outside the vocabulary", id="python-bigint"),
    pytest.param(np.ones((2, 3), np.int32), "tokens: expected a 1-D sequence of token ids, got shape (2, 3)", id="2-D"),
    pytest.param([[1, 2], [3, 4]], "tokens: expected a 1-D sequence of token ids, got shape (2, 2)", id="nested-list"),
    pytest.param(np.ones((1, 3), np.int32), "tokens: expected a 1-D sequence of token ids, got shape (1, 3)", id="row-vector"),
    pytest.param([[1], [2, 3]], "tokens: not a flat sequence of token ids", id="ragged"),
    pytest.param("hello", "tokens: expected token ids (integers), got the str 'hello' (text goes through a tokenizer first", id="str"),
    pytest.param(b"\x01\x02", "tokens: expected token ids (integers), got the bytes", id="bytes"),
    pytest.param(["1", "2"], "tokens[0] = '1' is not a token id: token ids are integers, got an array of dtype <U1", id="str-items"),
    pytest.param([1, None], "tokens[1] = None is not a token id (an integer; got NoneType)", id="none-item"),
    pytest.param(np.array([True, False]), "tokens[0] = True is not a token id: token ids are integers, got an array of dtype bool", id="bools"),
    pytest.param(7, "tokens: expected a 1-D sequence of token ids, got the scalar 7 (write [7])", id="int-scalar"),
    pytest.param(np.int32(7), "tokens: expected a 1-D sequence of token ids, got the scalar", id="numpy-scalar"),
    pytest.param(np.array(7), "tokens: expected a 1-D sequence of token ids, got a 0-d array", id="0-d-array"),
    pytest.param(None, "tokens: expected a 1-D sequence of token ids, got NoneType", id="None"),
    pytest.param({1: 2}, "tokens: expected a 1-D sequence of token ids, got a dict", id="dict"),
    pytest.param([], "tokens: empty (need at least one token id)", id="empty-list"),
    pytest.param(np.zeros(0, np.int32), "tokens: empty (need at least one token id)", id="empty-array"),
]


@pytest.mark.parametrize("bad, words", BAD)
def test_token_ids_refuses_naming_the_index_and_value(bad, words):
    with pytest.raises(InvalidArgumentError) as info:
        token_ids(bad, "tokens", n_vocab=V)
    assert str(info.value).startswith(words), str(info.value)


@pytest.mark.parametrize("good", [[1, 2, 3], (1, 2, 3), range(1, 4), np.array([1, 2, 3], np.int64),
                                  np.array([1, 2, 3], np.uint8), np.array([1, 2, 3], np.int16),
                                  [np.int64(1), np.uint32(2), 3], iter([1, 2, 3]),
                                  np.array([1, 2, 3], object)],
                         ids=["list", "tuple", "range", "int64", "uint8", "int16", "numpy-ints",
                              "iterator", "object"])
def test_token_ids_accepts_integer_sequences(good):
    out = token_ids(good, "tokens", n_vocab=V)
    assert out.dtype == np.int32 and out.flags.c_contiguous and out.tolist() == [1, 2, 3]


def test_token_ids_keeps_an_int32_array_as_it_is():
    ids = np.arange(5, dtype=np.int32)
    assert token_ids(ids, n_vocab=V) is ids
    strided = np.arange(10, dtype=np.int32)[::2]                 # a view: copied, same values
    assert token_ids(strided, n_vocab=V).tolist() == [0, 2, 4, 6, 8]


def test_token_ids_bounds():
    assert token_ids([0, V - 1], n_vocab=V).tolist() == [0, V - 1]
    assert token_ids([INT32_MAX]).tolist() == [INT32_MAX]         # no vocabulary: int32 ids
    with pytest.raises(InvalidArgumentError, match=r"tokens\[0\] = 2147483648 is outside the token ids of int32"):
        token_ids([INT32_MAX + 1])
    assert token_ids([], allow_empty=True).shape == (0,)


def test_the_name_carries_the_place():
    with pytest.raises(InvalidArgumentError, match=r"^items\[2\]\.tokens\[1\] = 4294967301 is outside"):
        token_ids(np.array([1, 4294967301]), "items[2].tokens", n_vocab=V)


@pytest.mark.parametrize("bad, words", [(1.5, "token = 1.5 is not a token id (an integer; got float)"),
                                        (True, "token = True is not a token id"),
                                        ("3", "token = '3' is not a token id"),
                                        (-1, f"token = -1 is outside the vocabulary [0, {V})"),
                                        (np.int64(4294967301), "token = 4294967301 is outside")])
def test_token_id_refuses(bad, words):
    with pytest.raises(InvalidArgumentError) as info:
        token_id(bad, "token", n_vocab=V)
    assert str(info.value).startswith(words), str(info.value)
    assert token_id(np.uint16(5), n_vocab=V) == 5


# ------------------------------------------------------------------ each entry point, no device

def _closed_session():
    """A Session whose handle is closed: its checks must refuse a bad input before the handle
    is asked for (which would say "Session is closed")."""
    from pyprefill.model import Session
    s = Session.__new__(Session)
    s.model = SimpleNamespace(n_vocab=V)
    return s


@pytest.mark.parametrize("bad, words", BAD[:10] + BAD[13:14] + BAD[-1:])
def test_session_prefill_checks_before_the_handle(bad, words):
    pytest.importorskip("pyprefill.model", reason="libprefill not loadable")
    with pytest.raises(InvalidArgumentError) as info:
        _closed_session().prefill(bad)
    assert str(info.value).startswith(words), str(info.value)
    with pytest.raises(InvalidArgumentError, match="Session is closed"):   # a good input gets there
        _closed_session().prefill([1, 2])


def test_session_decode_generate_rollback_check_their_numbers():
    pytest.importorskip("pyprefill.model", reason="libprefill not loadable")
    s = _closed_session()
    for call, words in [(lambda: s.decode(2.7), "token = 2.7 is not a token id"),
                        (lambda: s.decode(V), f"token = {V} is outside the vocabulary"),
                        (lambda: s.generate(2.5), "n: 2.5 is not an int"),
                        (lambda: s.generate(0), "n: 0 is less than 1"),
                        (lambda: s.rollback(2.7), "pos: 2.7 is not an int"),
                        (lambda: s.rollback(-1), "pos: -1 is less than 0"),
                        (lambda: s.prefill([1], logits=["all"]), "logits: ['all'] is not one of")]:
        with pytest.raises(InvalidArgumentError) as info:
            call()
        assert str(info.value).startswith(words), str(info.value)


def _closed_batch():
    from pyprefill.model import Batch
    b = Batch.__new__(Batch)
    b.model = SimpleNamespace(n_vocab=V)
    return b


def test_batch_items_are_checked_before_anything_is_built():
    pytest.importorskip("pyprefill.model", reason="libprefill not loadable")
    from pyprefill.model import Session
    s1, s2 = Session.__new__(Session), Session.__new__(Session)
    b = _closed_batch()
    cases = [
        ([dict(session=s1, tokens=[1, 2]), dict(session=s2, tokens=[1.5])],
         r"^items\[1\]\.tokens\[0\] = 1\.5 is not a token id"),
        ([dict(session=s1, tokens=np.array([3, 4294967301]))], r"^items\[0\]\.tokens\[1\] = 4294967301 is outside the vocabulary"),
        ([dict(session=s1, tokens=np.ones((2, 2), np.int32))], r"^items\[0\]\.tokens: expected a 1-D sequence of token ids, got shape \(2, 2\)"),
        ([dict(session=s1, tokens=[])], r"^items\[0\]\.tokens: empty"),
        ([dict(session=s1, tokens="hi")], r"^items\[0\]\.tokens: expected token ids \(integers\), got the str"),
        ([dict(session=None, tokens=[1])], r"^items\[0\]\.session: expected a pyprefill\.Session, got NoneType"),
        ([dict(session=s1, tokens=[1], logits="first")], r"^items\[0\]\.logits: 'first' is not one of"),
        ([dict(tokens=[1])], r"^items\[0\]: expected a dict with 'session' and 'tokens'"),
        ([], r"^items: empty"),
        ("abc", r"^items: expected a list of dicts, got str"),
    ]
    for items, pattern in cases:
        with pytest.raises(InvalidArgumentError) as info:
            b.plan(items)
        assert re.search(pattern, str(info.value)), str(info.value)
    with pytest.raises(InvalidArgumentError, match="Session is closed"):   # good items get there
        b.plan([dict(session=s1, tokens=[1, 2])])


def test_prefill_batch_converts_every_array_first():
    pytest.importorskip("pyprefill.model", reason="libprefill not loadable")
    from pyprefill.model import Model, Session
    m = Model.__new__(Model)
    m.info = {"n_vocab": V}
    s = Session.__new__(Session)
    with pytest.raises(InvalidArgumentError, match=r"^tokens\[1\]\[0\] = 1\.5 is not a token id"):
        m.prefill_batch([s, s], [[1], [1.5]])
    with pytest.raises(InvalidArgumentError, match=r"^sessions\[0\]: expected a pyprefill\.Session, got int"):
        m.prefill_batch([3], [[1]])


def test_reference_refuses_what_the_engine_refuses():
    from pyprefill.reference import ReferenceModel
    ref = ReferenceModel(TINY)
    s, n_vocab = ref.session(), ref.desc.n_vocab
    for bad, words in [([1.5, 2.7], "tokens[0] = 1.5 is not a token id"),
                       ([[1, 2], [3, 4]], "tokens: expected a 1-D sequence of token ids, got shape (2, 2)"),
                       ("hello", "tokens: expected token ids (integers), got the str"),
                       (np.array([4294967301]), f"tokens[0] = 4294967301 is outside the vocabulary [0, {n_vocab})")]:
        with pytest.raises(InvalidArgumentError) as info:
            s.prefill(bad)
        assert str(info.value).startswith(words), str(info.value)
        assert s.pos == 0                                          # nothing ran
    with pytest.raises(InvalidArgumentError, match="token = 2.5 is not a token id"):
        s.decode(2.5)
    assert s.prefill(np.array([1, 2], np.uint16)).shape == (n_vocab,) and s.pos == 2


def test_tokenizer_decode_takes_ids_as_sessions_do(tmp_path):
    pytest.importorskip("regex", reason="the `tokenizer` extra (regex) is not installed")
    from pyprefill.formats.synth import write_synthetic
    from pyprefill.tokenizer import Tokenizer
    path = tmp_path / "qwen3-tiny.gguf"
    write_synthetic("qwen3-tiny", "q8_0", path, progress=False)
    tok = Tokenizer.from_gguf(path)
    ids = tok.encode("hello world")
    assert tok.decode(ids) == tok.decode(np.array(ids, np.int64)) == "hello world"
    assert tok.decode([]) == "" and tok.decode(ids[0]) == tok.decode(ids[:1])
    with pytest.raises(InvalidArgumentError, match=r"^ids\[1\] = 2\.0 is not a token id"):
        tok.decode([ids[0], 2.0])
    with pytest.raises(InvalidArgumentError, match=r"^ids: expected a 1-D sequence of token ids, got shape \(1, 2\)"):
        tok.decode(np.array([ids[:2]]))
    with pytest.raises(InvalidArgumentError, match=rf"^ids\[0\] = {tok.n_vocab} is outside the vocabulary"):
        tok.decode([tok.n_vocab])
    with pytest.raises(InvalidArgumentError, match=r"^token id = 1\.5 is not a token id"):
        tok.token_text(1.5)


def test_chat_reply_converts_the_prompt_first():
    from pyprefill.chat import generate_reply
    never = SimpleNamespace(prefill=None, generate=None)          # never reached
    tok = SimpleNamespace(end_of_turn_ids=frozenset(), stream=lambda: None)
    with pytest.raises(InvalidArgumentError, match=r"^prompt_ids\[0\] = 1\.5 is not a token id"):
        generate_reply(never, [1.5], tok, 4)
    with pytest.raises(InvalidArgumentError, match=r"^max_new_tokens: 0 is less than 1"):
        generate_reply(never, [1], tok, 0)


# ------------------------------------------------------------------ on a GPU: nothing runs

@pytest.mark.gpu
def test_engine_refuses_and_leaves_the_session_unchanged():
    from pyprefill.model import Model
    with Model.load(TINY, progress=False) as m, m.session(max_tokens=64) as s:
        s.prefill([1, 2, 3], "none")
        for bad in ([1.5, 2.7], np.array([4294967301]), np.ones((2, 3), np.int64), "hello", []):
            with pytest.raises(InvalidArgumentError):
                s.prefill(bad)
            assert s.position == 3
        with m.batch() as b:
            with pytest.raises(InvalidArgumentError, match=r"items\[0\]\.tokens\[0\] = 1\.5"):
                b.prefill([dict(session=s, tokens=[1.5])])
        assert s.position == 3
        got = s.prefill([4, 5])
        with m.session(max_tokens=64) as fresh:       # the same calls, none refused: the same logits
            fresh.prefill([1, 2, 3], "none")
            assert np.array_equal(fresh.prefill([4, 5]), got)
