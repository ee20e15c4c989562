"""Text <-> token ids from a GGUF's own vocabulary (tokenizer.ggml.*), through HF `tokenizers`
(the optional extra `pyprefill[tokenizer]`). Byte-level BPE (`tokenizer.ggml.model = gpt2`)."""
from __future__ import annotations

from .errors import UnsupportedError


class Tokenizer:
    def __init__(self, tok):
        self._tok = tok

    @classmethod
    def from_gguf(cls, path: str) -> "Tokenizer":
        try:
            from tokenizers import Tokenizer as HFTokenizer, decoders, models, pre_tokenizers
        except ImportError as exc:
            raise UnsupportedError("text prompts need the `tokenizers` package "
                                   "(pip install 'pyprefill[tokenizer]'), or pass --tokens") from exc
        from gguf import GGUFReader
        r = GGUFReader(path)

        def field(name):
            f = r.fields.get(name)
            if f is None:
                raise UnsupportedError(f"{path}: no {name} in the GGUF: cannot build a tokenizer")
            return f

        model = bytes(field("tokenizer.ggml.model").parts[-1]).decode()
        if model != "gpt2":
            raise UnsupportedError(f"{path}: tokenizer.ggml.model={model!r} (only 'gpt2' byte-level BPE)")
        f = field("tokenizer.ggml.tokens")
        tokens = [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
        f = field("tokenizer.ggml.merges")
        merges = [tuple(bytes(f.parts[i]).decode("utf-8", "replace").split(" ", 1)) for i in f.data]
        vocab = {t: i for i, t in enumerate(tokens)}
        bpe = models.BPE(vocab=vocab, merges=[m for m in merges if len(m) == 2])
        tok = HFTokenizer(bpe)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids) -> str:
        return self._tok.decode(list(map(int, ids)))
