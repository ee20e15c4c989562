"""Text <-> token ids from a GGUF's own tokenizer metadata, as the model's tokenizer does it.

    tok = Tokenizer.from_gguf("qwen3-4b.gguf")         # ~0.3 s for a 248k vocabulary
    ids = tok.encode("Hello <|im_end|>")                # added tokens are matched in the text
    tok.decode(ids)                                     # "Hello <|im_end|>"
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi"}])

Byte-level BPE (`tokenizer.ggml.model = gpt2`), the pipeline of the model's Hugging Face
`tokenizer.json` (Qwen2Tokenizer: NFC normalizer, a Split pre-tokenizer, ByteLevel, BPE), built
from the GGUF alone:
1. added tokens (`tokenizer.ggml.token_type` CONTROL 3 and USER_DEFINED 4: `<|im_start|>`,
   `<think>`, ...) are found in the raw text first, leftmost and longest first (HF's
   AddedVocabulary, normalized=false);
2. each stretch of text between them is NFC-normalized and split by the pre-tokenizer regex that
   `tokenizer.ggml.pre` names (PRE_TOKENIZERS; an unknown name is an error, never a fallback);
3. each piece's UTF-8 bytes are written in GPT-2's byte alphabet and merged by BPE: the adjacent
   pair with the lowest rank in `tokenizer.ggml.merges` first, leftmost on ties, until no pair
   has a merge (HF `BPE` with ignore_merges=false, llama.cpp `llm_tokenizer_bpe_session`);
4. the symbols left are looked up in `tokenizer.ggml.tokens`.
Decoding maps normal tokens back through the byte alphabet and writes added tokens as their text.

Pure Python plus the `regex` module (Python's `re` has no \\p{L} classes) and, for chat
templates, jinja2: `pip install 'pyprefill[tokenizer]'`. Pieces are cached, so running text
costs a dictionary lookup per piece once its words have been seen.
"""
from __future__ import annotations

import codecs
import dataclasses
import heapq
import numbers
import os
import re
import unicodedata
from typing import Any, Iterable

import numpy as np

from ._checks import token_id as token_id_arg, token_ids
from .errors import GGUFError, InvalidArgumentError, UnsupportedError

# tokenizer.ggml.token_type values (gguf.TokenType, llama.cpp llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclasses.dataclass(frozen=True)
class PreTokenizer:
    """How `tokenizer.ggml.pre` = name splits text before BPE."""
    name: str
    pattern: str     # the Split regex of the model's tokenizer.json (`regex` module syntax)
    nfc: bool        # the tokenizer.json normalizer is NFC


# The Split regexes as the models' tokenizer.json files write them. llama.cpp (llama-vocab.cpp,
# LLAMA_VOCAB_PRE_TYPE_QWEN2 / _QWEN35) spells the contractions out as '[sS]|'[tT]|...; the
# (?i:...) form here is the tokenizer.json original, which also folds 'ſ (U+017F) like 's, as
# Hugging Face tokenizers and tiktoken do.
PRE_TOKENIZERS = {
    # Qwen2, Qwen2.5, Qwen3: contractions, letter runs with one leading non-letter, single
    # digits, punctuation runs with trailing newlines, newline runs, other whitespace
    "qwen2": PreTokenizer(
        "qwen2",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        nfc=True),
    # Qwen3.5, Qwen3.6: qwen2 with combining marks (\p{M}) kept in letter runs and out of
    # punctuation runs
    "qwen35": PreTokenizer(
        "qwen35",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
        r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        nfc=True),
}


def _byte_alphabet() -> list[str]:
    """GPT-2's byte -> character map (bytes_to_unicode in GPT-2's encoder.py): the printable
    Latin-1 bytes stand for themselves, the other 68 bytes for U+0100.. in byte order."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(0x100 + extra))
            extra += 1
    return out


_BYTE_CHARS = _byte_alphabet()
_LATIN1_TO_ALPHABET = {b: c for b, c in enumerate(_BYTE_CHARS)}          # str.translate table
_ALPHABET_TO_LATIN1 = {ord(c): chr(b) for b, c in enumerate(_BYTE_CHARS)}
_OUTSIDE_ALPHABET = re.compile("[^" + "".join(map(re.escape, _BYTE_CHARS)) + "]")

_CACHE_MAX_PIECE = 64          # pieces longer than this (chars) are not cached
_CACHE_MAX_ENTRIES = 1 << 18   # the piece cache is cleared when it grows past this

# metadata keys this module reads
_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
         "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
         "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
         "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.eot_token_id",
         "tokenizer.ggml.eom_token_id", "tokenizer.ggml.add_bos_token",
         "tokenizer.ggml.add_eos_token", "tokenizer.chat_template")
# texts that end a turn in the chat formats pyprefill serves (with the EOS / EOT / EOM ids)
_END_OF_TURN_TEXTS = ("<|im_end|>", "<|endoftext|>")


def _import_regex():
    try:
        import regex
    except ImportError as exc:
        raise UnsupportedError("text prompts need the `regex` package for the pre-tokenizer's "
                               "\\p{L} classes (pip install 'pyprefill[tokenizer]'), or pass "
                               "token ids") from exc
    return regex


class Tokenizer:
    """A GGUF's byte-level BPE tokenizer (see the module docstring). Build with from_gguf()."""

    def __init__(self, meta: dict[str, Any], source: str = "<metadata>"):
        """From GGUF metadata {key: value} (tokenizer.ggml.* and tokenizer.chat_template; arrays
        as lists or NumPy arrays). `source` names the file in error messages."""
        self.source = source

        def get(key: str, kind) -> Any:
            if key not in meta:
                raise UnsupportedError(f"{source}: no {key} in the GGUF: cannot build a "
                                       "tokenizer (pass token ids instead)")
            if not isinstance(meta[key], kind):
                raise GGUFError(f"{source}: {key} has the wrong type ({type(meta[key]).__name__})")
            return meta[key]

        model = get("tokenizer.ggml.model", str)
        if model != "gpt2":
            raise UnsupportedError(f"{source}: tokenizer.ggml.model={model!r} (only 'gpt2' "
                                   "byte-level BPE)")
        pre = get("tokenizer.ggml.pre", str)
        if pre not in PRE_TOKENIZERS:
            raise UnsupportedError(f"{source}: tokenizer.ggml.pre={pre!r} is not a pre-tokenizer "
                                   f"pyprefill knows ({', '.join(PRE_TOKENIZERS)})")
        self.pre = PRE_TOKENIZERS[pre]
        tokens = get("tokenizer.ggml.tokens", list)
        types = get("tokenizer.ggml.token_type", (list, np.ndarray))
        merges = get("tokenizer.ggml.merges", list)
        n = len(tokens)
        if len(types) != n:
            raise GGUFError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries for "
                            f"{n} tokenizer.ggml.tokens")
        self.n_vocab = n
        self._tokens: list[str] = tokens
        self._types = np.asarray(types, dtype=np.int32)
        self._vocab: dict[str, int] = dict(zip(tokens, range(n)))   # a repeated text: last id
        self._ranks: dict[str, int] = dict(zip(merges, range(len(merges))))  # "a b" -> rank
        missing = [b for b, c in enumerate(_BYTE_CHARS) if c not in self._vocab]
        if missing:
            raise GGUFError(f"{source}: tokenizer.ggml.tokens has no token for byte(s) "
                            f"{', '.join(f'0x{b:02x}' for b in missing[:8])} (byte-level BPE "
                            "needs all 256)")
        # added tokens: CONTROL ones are matched when special=True, USER_DEFINED ones always
        # (llama.cpp's parse_special; HF matches both unless split_special_tokens)
        self._added: dict[int, dict[str, int]] = {CONTROL: {}, USER_DEFINED: {}}
        for kind in (CONTROL, USER_DEFINED):
            for i in np.flatnonzero(self._types == kind).tolist():
                if tokens[i]:
                    self._added[kind][tokens[i]] = i
        self._added_id = {**self._added[USER_DEFINED], **self._added[CONTROL]}
        self._split_added: dict[bool, Any] = {}
        self._split_piece = None           # the pre-tokenizer regex, compiled on first use
        self._cache: dict[str, tuple[int, ...]] = {}
        self._piece_bytes: dict[int, bytes] = {}

        def token_id(key: str) -> int | None:
            v = meta.get(key)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < n:
                raise GGUFError(f"{source}: {key}={v!r} is not a token id in [0, {n})")
            return int(v)

        self.bos_id = token_id("tokenizer.ggml.bos_token_id")
        self.eos_id = token_id("tokenizer.ggml.eos_token_id")
        self.pad_id = token_id("tokenizer.ggml.padding_token_id")
        self.unk_id = token_id("tokenizer.ggml.unknown_token_id")
        self.eot_id = token_id("tokenizer.ggml.eot_token_id")
        self.eom_id = token_id("tokenizer.ggml.eom_token_id")
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        self.add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        for flag, ident, name in ((self.add_bos, self.bos_id, "bos"),
                                  (self.add_eos, self.eos_id, "eos")):
            if flag and ident is None:   # llama.cpp's check_add_special_token
                raise GGUFError(f"{source}: tokenizer.ggml.add_{name}_token is true, but "
                                f"tokenizer.ggml.{name}_token_id is not set")
        template = meta.get("tokenizer.chat_template")
        if template is not None and not isinstance(template, str):
            raise GGUFError(f"{source}: tokenizer.chat_template is not a string")
        self.chat_template: str | None = template

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> "Tokenizer":
        """The tokenizer of the GGUF at `path` (its metadata only; no tensor is read)."""
        from .formats.gguf_meta import read_metadata
        path = os.fspath(path)
        return cls(read_metadata(path, _KEYS), source=path)

    # -------------------------------------------------------------------------------- encode

    def encode(self, text: str, *, special: bool = True, add_bos: bool | None = None,
               add_eos: bool | None = None) -> list[int]:
        """Token ids of `text`. special=True matches CONTROL tokens (<|im_start|>, ...) in the
        text, as the HF tokenizer does; special=False writes them as plain text (USER_DEFINED
        tokens such as <think> are matched either way). add_bos / add_eos: None follows
        tokenizer.ggml.add_bos_token / add_eos_token (false for Qwen)."""
        if not isinstance(text, str):
            raise InvalidArgumentError(f"text: expected str, got {type(text).__name__}")
        out: list[int] = []
        if self.add_bos if add_bos is None else add_bos:
            out.append(self._required_id(self.bos_id, "bos"))
        pos = 0
        split = self._added_splitter(special)
        if split is not None:
            for m in split.finditer(text):
                if m.start() > pos:
                    self._encode_ordinary(text[pos:m.start()], out)
                out.append(self._added_id[m.group()])
                pos = m.end()
        if pos < len(text):
            self._encode_ordinary(text[pos:] if pos else text, out)
        if self.add_eos if add_eos is None else add_eos:
            out.append(self._required_id(self.eos_id, "eos"))
        return out

    def _required_id(self, ident: int | None, name: str) -> int:
        if ident is None:
            raise UnsupportedError(f"{self.source}: no tokenizer.ggml.{name}_token_id in the GGUF")
        return ident

    def _added_splitter(self, special: bool):
        """A compiled alternation of the added tokens' texts, longest first, so that at each
        position the longest one matches (leftmost-longest, as HF's AddedVocabulary)."""
        if special not in self._split_added:
            table = dict(self._added[USER_DEFINED])
            if special:
                table.update(self._added[CONTROL])
            texts = sorted(table, key=lambda t: (-len(t), t))
            self._split_added[special] = (re.compile("|".join(map(re.escape, texts)))
                                          if texts else None)
        return self._split_added[special]

    def _encode_ordinary(self, text: str, out: list[int]) -> None:
        """Text without added tokens: NFC, pre-tokenizer, BPE of each piece (cached)."""
        if self.pre.nfc:
            text = unicodedata.normalize("NFC", text)
        if self._split_piece is None:
            self._split_piece = _import_regex().compile(self.pre.pattern)
        pieces = self._split_piece.findall(text)
        if sum(map(len, pieces)) != len(text):      # a character no branch matches: keep it
            pieces = _split_keeping_gaps(self._split_piece, text)
        cache = self._cache
        for piece in pieces:
            ids = cache.get(piece)
            if ids is None:
                ids = self._bpe(piece)
                if len(piece) <= _CACHE_MAX_PIECE:
                    if len(cache) >= _CACHE_MAX_ENTRIES:
                        cache.clear()
                    cache[piece] = ids
            out.extend(ids)

    def _bpe(self, piece: str) -> tuple[int, ...]:
        """BPE of one pre-tokenized piece: a heap of (rank, left position) over adjacent pairs,
        lowest rank first and leftmost on ties, with stale entries skipped (the scheme of
        llama.cpp's llm_tokenizer_bpe_session and HF's Word::merge_all), O(n log n)."""
        try:
            word = piece.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_ALPHABET)
        except UnicodeEncodeError as e:
            raise InvalidArgumentError(f"text: lone surrogate {piece[e.start]!r} (not UTF-8 "
                                       "encodable)") from None
        n = len(word)
        vocab = self._vocab
        if n == 1:
            return (vocab[word],)
        ranks = self._ranks
        sym = list(word)                   # symbol text at its first position; "" once merged away
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            r = ranks.get(f"{sym[i]} {sym[i + 1]}")
            if r is not None:
                heap.append((r, i, sym[i] + sym[i + 1]))
        heapq.heapify(heap)
        while heap:
            r, i, merged = heapq.heappop(heap)
            left = sym[i]
            j = nxt[i]
            # stale: the left symbol was merged away or grew, or its right neighbour changed
            if not left or j < 0 or left + sym[j] != merged:
                continue
            sym[i], sym[j] = merged, ""
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
            p = prv[i]
            if p >= 0:
                r2 = ranks.get(f"{sym[p]} {merged}")
                if r2 is not None:
                    heapq.heappush(heap, (r2, p, sym[p] + merged))
            if k >= 0:
                r2 = ranks.get(f"{merged} {sym[k]}")
                if r2 is not None:
                    heapq.heappush(heap, (r2, i, merged + sym[k]))
        try:
            return tuple(vocab[s] for s in sym if s)
        except KeyError as e:
            raise GGUFError(f"{self.source}: tokenizer.ggml.merges makes {e.args[0]!r}, which "
                            "is not in tokenizer.ggml.tokens") from None

    # -------------------------------------------------------------------------------- decode

    def token_bytes(self, token_id: int, *, skip_special: bool = False) -> bytes:
        """The bytes token_id stands for: a normal token through the byte alphabet, an added
        token (CONTROL, USER_DEFINED) as its UTF-8 text (b"" for CONTROL with skip_special),
        b"" for UNUSED ones ([PAD...], which the model's own tokenizer does not have)."""
        i = self._check_id(token_id)
        t = int(self._types[i])
        if t == CONTROL or t == UNKNOWN:
            return b"" if skip_special else self._tokens[i].encode("utf-8")
        if t == USER_DEFINED:
            return self._tokens[i].encode("utf-8")
        if t == UNUSED:
            return b""
        b = self._piece_bytes.get(i)
        if b is None:
            b = _alphabet_to_bytes(self._tokens[i])
            self._piece_bytes[i] = b
        return b

    def _check_id(self, token_id) -> int:
        return token_id_arg(token_id, "token id", n_vocab=self.n_vocab)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """The text of `ids` (one id, or a 1-D sequence of them, possibly empty; invalid UTF-8,
        e.g. a cut multi-byte character, becomes U+FFFD). The ids are checked as a session's
        tokens are (pyprefill._checks.token_ids): ints in the vocabulary, naming the first bad one."""
        if isinstance(ids, numbers.Integral) and not isinstance(ids, (bool, np.bool_)):
            ids = [ids]
        ids = token_ids(ids, "ids", n_vocab=self.n_vocab, allow_empty=True)
        return b"".join(self.token_bytes(i, skip_special=skip_special) for i in ids.tolist()
                        ).decode("utf-8", "replace")

    def token_text(self, token_id: int) -> str:
        """The token's text as the GGUF stores it (byte-alphabet form for normal tokens)."""
        return self._tokens[self._check_id(token_id)]

    def token_type(self, token_id: int) -> int:
        return int(self._types[self._check_id(token_id)])

    def stream(self, *, skip_special: bool = False) -> "TextStream":
        """A decoder fed one id at a time that returns text as soon as it is whole UTF-8."""
        return TextStream(self, skip_special=skip_special)

    # -------------------------------------------------------------------------------- ids

    def token_to_id(self, text: str) -> int | None:
        """The id of an added token's text (<|im_end|>), else of a normal token written in the
        byte alphabet; None when the vocabulary has no such token."""
        for kind in (CONTROL, USER_DEFINED):
            if text in self._added[kind]:
                return self._added[kind][text]
        return self._vocab.get(text)

    @property
    def end_of_turn_ids(self) -> frozenset[int]:
        """Ids that end a generated turn: EOS, EOT and EOM from the metadata, and the added
        tokens <|im_end|> and <|endoftext|> where the vocabulary has them."""
        ids = {i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None}
        for text in _END_OF_TURN_TEXTS:
            i = self._added[CONTROL].get(text)
            if i is not None:
                ids.add(i)
        return frozenset(ids)

    def special_tokens_map(self) -> dict[str, str]:
        """{bos_token, eos_token, pad_token, unk_token: text} for the ids the GGUF names, as
        HF passes them to a chat template."""
        out = {}
        for name, ident in (("bos_token", self.bos_id), ("eos_token", self.eos_id),
                            ("pad_token", self.pad_id), ("unk_token", self.unk_id)):
            if ident is not None:
                out[name] = self._tokens[ident]
        return out

    # -------------------------------------------------------------------------------- chat

    def apply_chat_template(self, messages, add_generation_prompt: bool = True,
                            tokenize: bool = True, *, chat_template: str | None = None,
                            tools=None, documents=None, **kwargs):
        """Render `messages` ([{"role": ..., "content": ...}, ...]) with the GGUF's
        tokenizer.chat_template (or `chat_template`) as HF's apply_chat_template does (see
        pyprefill.chat), then encode it with added tokens matched and no BOS added. Extra
        keyword arguments reach the template (e.g. enable_thinking=False). Returns ids, or the
        string with tokenize=False."""
        from .chat import render_chat_template
        source = chat_template if chat_template is not None else self.chat_template
        if source is None:
            raise UnsupportedError(f"{self.source}: no tokenizer.chat_template in the GGUF")
        text = render_chat_template(source, messages, add_generation_prompt=add_generation_prompt,
                                    tools=tools, documents=documents,
                                    origin="chat_template" if chat_template is not None
                                    else f"{self.source}: tokenizer.chat_template",
                                    **{**self.special_tokens_map(), **kwargs})
        if not tokenize:
            return text
        return self.encode(text, special=True, add_bos=False, add_eos=False)


class TextStream:
    """Streaming decode: push() one token id, get back the text that is now complete. A
    multi-byte character cut across tokens comes out whole with the token that ends it;
    pushes + finish() equal decode() of all the ids."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self._tok, self._skip = tokenizer, skip_special
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        return self._dec.decode(self._tok.token_bytes(token_id, skip_special=self._skip))

    def finish(self) -> str:
        """What is left (a cut character at the very end becomes U+FFFD); resets the stream."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out


def _alphabet_to_bytes(text: str) -> bytes:
    """Bytes of a token written in the byte alphabet; a character outside it (a malformed
    vocabulary) stands for its own UTF-8, as in llama.cpp's llama_decode_text."""
    if _OUTSIDE_ALPHABET.search(text) is None:
        return text.translate(_ALPHABET_TO_LATIN1).encode("latin-1")
    return b"".join(_ALPHABET_TO_LATIN1[ord(c)].encode("latin-1") if ord(c) in _ALPHABET_TO_LATIN1
                    else c.encode("utf-8", "replace") for c in text)


def _split_keeping_gaps(pattern, text: str) -> list[str]:
    """Pieces of text by `pattern`, with any stretch no match covers kept as its own piece
    (HF's Split with behavior=Isolated)."""
    out, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            out.append(text[pos:m.start()])
        if m.end() > m.start():
            out.append(m.group())
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


__all__ = ["Tokenizer", "TextStream", "PreTokenizer", "PRE_TOKENIZERS", "NORMAL", "UNKNOWN",
           "CONTROL", "USER_DEFINED", "UNUSED", "BYTE"]
