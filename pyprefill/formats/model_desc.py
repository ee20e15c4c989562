"""What a GGUF file holds, in the terms of spec.md §1.1/§2.1: the contract shared by the loader,
the NumPy reference, the synthetic-model writer and the tests.

`load_model_desc(path)` (in gguf_model.py) returns a ModelDesc after validating every tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHS = ("qwen3", "qwen35")

# GGML type ids (ggml.h) and their blocks: (elements per block, bytes per block).
QTYPE_F32, QTYPE_F16, QTYPE_Q4_0, QTYPE_Q8_0 = 0, 1, 2, 8
QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_IQ4_XS, QTYPE_BF16 = 12, 13, 14, 23, 30
QTYPE_BLOCK = {
    QTYPE_F32: (1, 4), QTYPE_F16: (1, 2), QTYPE_BF16: (1, 2),
    QTYPE_Q4_0: (32, 18), QTYPE_Q8_0: (32, 34),
    QTYPE_Q4_K: (256, 144), QTYPE_Q5_K: (256, 176), QTYPE_Q6_K: (256, 210),
    QTYPE_IQ4_XS: (256, 136),
}
QTYPE_NAME = {QTYPE_F32: "F32", QTYPE_F16: "F16", QTYPE_BF16: "BF16", QTYPE_Q4_0: "Q4_0",
              QTYPE_Q8_0: "Q8_0", QTYPE_Q4_K: "Q4_K", QTYPE_Q5_K: "Q5_K", QTYPE_Q6_K: "Q6_K",
              QTYPE_IQ4_XS: "IQ4_XS"}


def row_bytes(qtype: int, k: int) -> int:
    """Bytes of one row of k elements; k must be a multiple of the block size."""
    elems, nbytes = QTYPE_BLOCK[qtype]
    if k % elems:
        raise ValueError(f"k={k} is not a multiple of the {QTYPE_NAME[qtype]} block ({elems})")
    return k // elems * nbytes


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: int
    shape: tuple[int, ...]      # NumPy order: (out, in) for a 2-D weight, i.e. reversed GGUF ne
    offset: int                 # absolute byte offset of the data in the file
    nbytes: int


@dataclass(frozen=True)
class ModelDesc:
    path: str
    arch: str                   # "qwen3" | "qwen35"
    n_block: int                # block_count (includes MTP blocks)
    n_layer: int                # block_count - nextn_predict_layers
    n_embd: int                 # d
    n_ff: int
    n_head: int                 # H (attention layers)
    n_head_kv: int              # Hkv
    head_dim: int               # D = attention.key_length
    rope_base: float
    rope_dim: int               # R (rotated dims); qwen3: = head_dim
    eps: float
    context_length: int
    n_vocab: int
    tied_output: bool           # no output.weight: token_embd is the LM head
    layer_kinds: tuple[str, ...]   # per layer < n_layer: "attn" | "gdn"
    # qwen35 only (0 for qwen3)
    full_attention_interval: int = 0
    conv_kernel: int = 0        # Kc
    ssm_dk: int = 0             # ssm.state_size (key head dim = value head dim)
    ssm_hk: int = 0             # ssm.group_count (key heads)
    ssm_hv: int = 0             # ssm.time_step_rank (value heads)
    ssm_inner: int = 0          # Hv * dv
    nextn_predict_layers: int = 0
    tensors: dict[str, TensorInfo] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ssm_dv(self) -> int:
        return self.ssm_inner // self.ssm_hv if self.ssm_hv else 0

    @property
    def key_dim(self) -> int:
        return self.ssm_hk * self.ssm_dk

    @property
    def value_dim(self) -> int:
        return self.ssm_inner

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def attn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == "attn")


def hparam_metadata(desc: ModelDesc, arch: str | None = None) -> dict[str, int | float | list[int]]:
    """The GGUF hyper-parameter keys of spec.md §1.1 / §2.1 for `desc` (ints are u32, floats f32,
    lists i32 arrays), keyed under `arch` (default desc.arch). Tokenizer keys are not included."""
    a = arch or desc.arch
    kv: dict[str, int | float | list[int]] = {
        f"{a}.block_count": desc.n_block, f"{a}.context_length": desc.context_length,
        f"{a}.embedding_length": desc.n_embd, f"{a}.feed_forward_length": desc.n_ff,
        f"{a}.attention.head_count": desc.n_head, f"{a}.attention.head_count_kv": desc.n_head_kv,
        f"{a}.attention.key_length": desc.head_dim, f"{a}.attention.value_length": desc.head_dim,
        f"{a}.rope.freq_base": float(desc.rope_base),
        f"{a}.attention.layer_norm_rms_epsilon": float(desc.eps),
    }
    if desc.arch == "qwen35":
        kv.update({f"{a}.rope.dimension_count": desc.rope_dim,
                   f"{a}.rope.dimension_sections": [11, 11, 10, 0],
                   f"{a}.full_attention_interval": desc.full_attention_interval,
                   f"{a}.ssm.conv_kernel": desc.conv_kernel, f"{a}.ssm.state_size": desc.ssm_dk,
                   f"{a}.ssm.group_count": desc.ssm_hk, f"{a}.ssm.time_step_rank": desc.ssm_hv,
                   f"{a}.ssm.inner_size": desc.ssm_inner})
    return kv


def add_metadata(writer, kv: dict[str, int | float | list[int]]) -> None:
    """Write hparam_metadata-style keys through a gguf.GGUFWriter (u32, f32, i32 arrays)."""
    for key, value in kv.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, int(value))
