"""Whole-model NumPy reference for `qwen3` (spec.md §1.3) and `qwen35` (spec.md §3) GGUF files.

Weights are read through the `gguf` package (GGUFReader + gguf.quants.dequantize): a reader
independent of the library's own. MTP blocks (n ≥ n_layer) are skipped; a missing
`output.weight` means the LM head is `token_embd.weight` (tied).

    model = ReferenceModel(path)                 # dtype=np.float64 by default
    sess = model.session()                       # KV caches, conv windows, states, position 0
    logits = sess.prefill(tokens, logits="all")  # (T, V); continues from sess.pos
    step = sess.decode(tok)                      # = prefill([tok], "last"), (V,)

Never imports the CUDA binding.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import numpy as np

from .._checks import token_id, token_ids
from ..errors import InvalidArgumentError
from ..formats.gguf_model import load_model_desc, read_tensor
from ..formats.model_desc import ModelDesc
from . import ops

LogitsMode = Literal["last", "all", "none"]


# ---------------------------------------------------------------------------------------------
# Reading the file
# ---------------------------------------------------------------------------------------------

def _open(path: str) -> tuple[ModelDesc, Callable[[str], np.ndarray]]:
    """(ModelDesc, read(name) -> dequantized float32 ndarray in NumPy order) for a GGUF file.

    Metadata and every tensor are validated by `formats.gguf_model.load_model_desc`; the data go
    through `gguf.quants.dequantize` (`read_tensor`).
    """
    desc = load_model_desc(path)
    return desc, lambda name: read_tensor(desc, name, np.float32)


def layer_tensor_names(desc: ModelDesc, i: int) -> dict[str, str]:
    """Short name ("attn_q", "ffn_down", "ssm_a", ...) -> GGUF tensor name for layer i."""
    kind = desc.layer_kinds[i]
    ffn_norm = "ffn_norm" if desc.arch == "qwen3" else "post_attention_norm"
    names = {"attn_norm": "attn_norm.weight", "ffn_norm": f"{ffn_norm}.weight",
             "ffn_gate": "ffn_gate.weight", "ffn_up": "ffn_up.weight",
             "ffn_down": "ffn_down.weight"}
    if kind == "attn":
        names |= {k: f"{k}.weight" for k in ("attn_q", "attn_k", "attn_v", "attn_output",
                                               "attn_q_norm", "attn_k_norm")}
    else:
        names |= {"attn_qkv": "attn_qkv.weight", "attn_gate": "attn_gate.weight",
                  "ssm_beta": "ssm_beta.weight", "ssm_alpha": "ssm_alpha.weight",
                  "ssm_conv1d": "ssm_conv1d.weight", "ssm_dt": "ssm_dt.bias",
                  "ssm_a": "ssm_a", "ssm_norm": "ssm_norm.weight",
                  "ssm_out": "ssm_out.weight"}
    return {k: f"blk.{i}.{v}" for k, v in names.items()}


def layer_forward(desc: ModelDesc, kind: str, w: dict[str, np.ndarray], x: np.ndarray,
                  pos0: int, state: tuple[np.ndarray, np.ndarray], *, chunked: bool = False,
                  chunk: int = 64, dtype: type[np.floating] = np.float64,
                  project: ops.Projector | None = None, gdn_rows16: bool = False
                  ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """One block over the rows x (T, d) at positions pos0..: mixer + FFN with their residuals.

    kind "attn" (state = (k_cache, v_cache)) or "gdn" (state = (conv window, delta-rule state));
    w: the layer's tensors by short name (`layer_tensor_names`). project: optional projection
    hook (ops.Projector) for every matrix product of the block. gdn_rows16: ops.gdn_mixer's
    rows16 (the GDN layer's q / k / v / o rows in fp16). Returns (x, new state).
    """
    d = desc
    h = ops.rms_norm(x, w["attn_norm"], d.eps, dtype)
    if kind == "attn":
        kc, vc = state
        mix, kc, vc = ops.attention_mixer(
            h, w["attn_q"], w["attn_k"], w["attn_v"], w["attn_output"],
            w["attn_q_norm"], w["attn_k_norm"], kc, vc, pos0,
            n_head=d.n_head, n_head_kv=d.n_head_kv, head_dim=d.head_dim,
            rope_dim=d.rope_dim, rope_base=d.rope_base, eps=d.eps,
            gated=(d.arch == "qwen35"), dtype=dtype, project=project)
        state = (kc, vc)
    else:
        conv, ssm = state
        mix, conv, ssm = ops.gdn_mixer(
            h, w["attn_qkv"], w["attn_gate"], w["ssm_beta"], w["ssm_alpha"],
            w["ssm_conv1d"], w["ssm_dt"], w["ssm_a"], w["ssm_norm"], w["ssm_out"],
            conv, ssm, n_k_heads=d.ssm_hk, n_v_heads=d.ssm_hv,
            head_k_dim=d.ssm_dk, head_v_dim=d.ssm_dv, eps=d.eps,
            chunked=chunked, chunk=chunk, dtype=dtype, project=project, rows16=gdn_rows16)
        state = (conv, ssm)
    x = x + mix
    h2 = ops.rms_norm(x, w["ffn_norm"], d.eps, dtype)
    x = x + ops.swiglu(h2, w["ffn_gate"], w["ffn_up"], w["ffn_down"], dtype, project=project)
    return x, state


def _bind(hook: ops.LayerProjector | None, i: int) -> ops.Projector | None:
    """The layer-i view of a model-level projection hook (None stays None)."""
    if hook is None:
        return None
    return lambda role, x, w: hook(i, role, x, w)


def empty_layer_state(desc: ModelDesc, kind: str, dtype: type[np.floating] = np.float64
                      ) -> tuple[np.ndarray, np.ndarray]:
    """A layer's state at position 0: empty KV caches (attn) or zero conv window + state (gdn)."""
    if kind == "attn":
        empty = np.zeros((0, desc.n_head_kv, desc.head_dim), dtype=dtype)
        return empty, empty.copy()
    return (np.zeros((desc.conv_kernel - 1, desc.conv_dim), dtype=dtype),
            np.zeros((desc.ssm_hv, desc.ssm_dk, desc.ssm_dv), dtype=dtype))


# ---------------------------------------------------------------------------------------------
# Model and session
# ---------------------------------------------------------------------------------------------

@dataclass
class _Layer:
    kind: str                      # "attn" | "gdn"
    w: dict[str, np.ndarray]       # short name -> array in the model's dtype


class ReferenceModel:
    """A qwen3 / qwen35 GGUF model held as dequantized NumPy arrays of `dtype`.

    dtype: np.float64 (the exact oracle) or np.float32. use_chunked_delta selects the chunked
    delta rule (§3.2.1, chunk `delta_chunk`) instead of the token-by-token recurrence (G7) for
    sessions that do not override it. project: optional hook (ops.LayerProjector) through which
    every matrix product of the blocks goes, e.g. a recipe of reference/quant_sim.py; None (the
    default) is the plain product.
    """

    def __init__(self, path: str, dtype: type[np.floating] = np.float64, *,
                 use_chunked_delta: bool = False, delta_chunk: int = 64,
                 project: ops.LayerProjector | None = None):
        if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise InvalidArgumentError(f"dtype must be float32 or float64, got {dtype}")
        self.dtype = np.dtype(dtype).type
        self.project = project
        self.use_chunked_delta = use_chunked_delta
        self.delta_chunk = delta_chunk
        self.desc, read = _open(str(path))
        d = self.desc
        cast = lambda name: read(name).astype(self.dtype)  # noqa: E731
        self.token_embd = cast("token_embd.weight")                       # (V, d)
        self.output_norm = cast("output_norm.weight")
        self.output = self.token_embd if d.tied_output else cast("output.weight")
        self.layers: list[_Layer] = []
        for i, kind in enumerate(d.layer_kinds):                          # blocks >= n_layer: MTP
            names = layer_tensor_names(d, i)
            self.layers.append(_Layer(kind, {k: cast(v) for k, v in names.items()}))

    def session(self, *, use_chunked_delta: bool | None = None,
                delta_chunk: int | None = None) -> "ReferenceSession":
        """A fresh sequence at position 0."""
        return ReferenceSession(
            self, self.use_chunked_delta if use_chunked_delta is None else use_chunked_delta,
            self.delta_chunk if delta_chunk is None else delta_chunk)

    def forward(self, tokens: Sequence[int], logits: LogitsMode = "all") -> np.ndarray:
        """One-shot prefill of `tokens` in a fresh session."""
        return self.session().prefill(tokens, logits)


@dataclass
class ReferenceSession:
    """One sequence: per-layer KV caches (attention), conv windows and delta-rule states (GDN),
    and the position `pos` (= tokens processed so far)."""

    model: ReferenceModel
    use_chunked_delta: bool = False
    delta_chunk: int = 64
    pos: int = 0
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    conv: dict[int, np.ndarray] = field(default_factory=dict)
    ssm: dict[int, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        d, dt = self.model.desc, self.model.dtype
        for i, layer in enumerate(self.model.layers):
            if layer.kind == "attn":
                self.kv[i] = empty_layer_state(d, "attn", dt)
            else:
                self.conv[i], self.ssm[i] = empty_layer_state(d, "gdn", dt)

    def clone(self) -> "ReferenceSession":
        """An independent copy of this session's state (prefix caching / save-restore)."""
        other = copy.copy(self)
        other.kv = {i: (k.copy(), v.copy()) for i, (k, v) in self.kv.items()}
        other.conv = {i: c.copy() for i, c in self.conv.items()}
        other.ssm = {i: s.copy() for i, s in self.ssm.items()}
        return other

    def decode(self, token: int) -> np.ndarray:
        """One decode step: a prefill of one token; logits (V,)."""
        return self.prefill([token_id(token, "token", n_vocab=self.model.desc.n_vocab)], "last")

    def prefill(self, tokens: Sequence[int], logits: LogitsMode = "last") -> np.ndarray:
        """Run `tokens` at positions pos .. pos+T-1 and advance the session.

        Returns logits (V,) for "last", (T, V) for "all", an empty (0, V) array for "none".
        """
        m, d, dt = self.model, self.model.desc, self.model.dtype
        if not isinstance(logits, str) or logits not in ("last", "all", "none"):
            raise InvalidArgumentError(f"logits must be 'last', 'all' or 'none', got {logits!r}")
        ids = token_ids(tokens, "tokens", n_vocab=d.n_vocab)     # the engine's own checks
        T = ids.shape[0]
        pos0 = self.pos
        x = m.token_embd[ids].astype(dt)                                  # (T, d)
        for i, layer in enumerate(m.layers):
            state = self.kv[i] if layer.kind == "attn" else (self.conv[i], self.ssm[i])
            x, state = layer_forward(d, layer.kind, layer.w, x, pos0, state,
                                     chunked=self.use_chunked_delta, chunk=self.delta_chunk,
                                     dtype=dt, project=_bind(self.model.project, i))
            if layer.kind == "attn":
                self.kv[i] = state
            else:
                self.conv[i], self.ssm[i] = state
        self.pos = pos0 + T
        if logits == "none":
            return np.zeros((0, d.n_vocab), dtype=dt)
        rows = x[-1:] if logits == "last" else x
        out = ops.lm_head(rows, m.output_norm, m.output, d.eps, dt)
        return out[0] if logits == "last" else out
