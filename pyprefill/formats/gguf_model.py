"""Read and validate a qwen3 / qwen35 GGUF file into a ModelDesc (spec.md §1.1-1.2, §2.1-2.5).

`load_model_desc(path)` reads every hyper-parameter key, derives the layer schedule, checks it
against the tensors each block really has, and checks every tensor's shape and type against
`expected_tensors(desc)`. Every fault raises GGUFError / UnsupportedError naming the file, the
tensor or key, what was expected and what was found.
`read_tensor(desc_or_reader, name)` dequantizes one tensor to NumPy order with gguf.quants.
"""
from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from ..errors import GGUFError, GGUFFormatError, UnsupportedError
from .model_desc import (QTYPE_BF16, QTYPE_BLOCK, QTYPE_F16, QTYPE_F32, QTYPE_IQ4_XS, QTYPE_NAME,
                         QTYPE_Q4_0, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_Q8_0,
                         SUPPORTED_ARCHS, ModelDesc, TensorInfo)

SUPPORTED_QTYPES = (QTYPE_F32, QTYPE_F16, QTYPE_Q4_0, QTYPE_Q8_0, QTYPE_Q4_K, QTYPE_Q5_K,
                    QTYPE_Q6_K, QTYPE_IQ4_XS, QTYPE_BF16)
F32_ONLY = (QTYPE_F32,)

_GGUF_MAGIC = b"GGUF"
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")


def qtype_name(qtype: int) -> str:
    """'Q4_K' for 12; ggml's name (or 'type N') for types pyprefill does not support."""
    if qtype in QTYPE_NAME:
        return QTYPE_NAME[qtype]
    try:
        import gguf
        return gguf.GGMLQuantizationType(qtype).name
    except (ValueError, ImportError):
        return f"type {qtype}"


def matrix_qtypes(k: int) -> tuple[int, ...]:
    """Supported qtypes whose block divides a row of k elements."""
    return tuple(t for t in SUPPORTED_QTYPES if k % QTYPE_BLOCK[t][0] == 0)


# ---------------------------------------------------------------------------------------------
# expected tensor table

def expected_tensors(desc: ModelDesc) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """name -> (NumPy-order shape, allowed qtypes) for every tensor the prefill graph reads.

    Covers blocks < n_layer only (MTP blocks are not read); output.weight only when untied.
    """
    d, V = desc.n_embd, desc.n_vocab
    exp: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def mat(name: str, rows: int, cols: int) -> None:
        exp[name] = ((rows, cols), matrix_qtypes(cols))

    def vec(name: str, *shape: int) -> None:
        exp[name] = (tuple(shape), F32_ONLY)

    mat("token_embd.weight", V, d)
    vec("output_norm.weight", d)
    if not desc.tied_output:
        mat("output.weight", V, d)
    H, Hkv, D, ff = desc.n_head, desc.n_head_kv, desc.head_dim, desc.n_ff
    for il, kind in enumerate(desc.layer_kinds):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", d)
        mat(p + "ffn_gate.weight", ff, d)
        mat(p + "ffn_up.weight", ff, d)
        mat(p + "ffn_down.weight", d, ff)
        if desc.arch == "qwen3":
            vec(p + "ffn_norm.weight", d)
        else:
            vec(p + "post_attention_norm.weight", d)
        if kind == "attn":
            q_rows = H * D if desc.arch == "qwen3" else 2 * H * D  # qwen35: per-head [q | gate]
            mat(p + "attn_q.weight", q_rows, d)
            mat(p + "attn_k.weight", Hkv * D, d)
            mat(p + "attn_v.weight", Hkv * D, d)
            mat(p + "attn_output.weight", d, H * D)
            vec(p + "attn_q_norm.weight", D)
            vec(p + "attn_k_norm.weight", D)
        else:
            mat(p + "attn_qkv.weight", desc.conv_dim, d)
            mat(p + "attn_gate.weight", desc.value_dim, d)
            mat(p + "ssm_beta.weight", desc.ssm_hv, d)
            mat(p + "ssm_alpha.weight", desc.ssm_hv, d)
            vec(p + "ssm_conv1d.weight", desc.conv_dim, desc.conv_kernel)
            vec(p + "ssm_dt.bias", desc.ssm_hv)
            vec(p + "ssm_a", desc.ssm_hv)
            vec(p + "ssm_norm.weight", desc.ssm_dv)
            mat(p + "ssm_out.weight", d, desc.value_dim)
    return exp


# ---------------------------------------------------------------------------------------------
# reading

def _open_reader(path: str):
    """A gguf.GGUFReader for path; every failure becomes a GGUFError naming path and fault."""
    import gguf
    if not os.path.exists(path):
        raise GGUFError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise GGUFError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read ({e.strerror or e})") from e
    if magic != _GGUF_MAGIC:
        raise GGUFFormatError(f"{path}: not a GGUF file (magic {magic!r}, expected {_GGUF_MAGIC!r})")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as e:  # the reader raises ValueError, struct/IndexError, OverflowError...
        raise GGUFFormatError(f"{path}: malformed or truncated GGUF ({type(e).__name__}: {e})") from e


def _field_value(field: Any) -> Any:
    """Python value of a gguf ReaderField (scalar, str, or list for arrays)."""
    return field.contents()


class _Meta:
    """Typed access to the metadata of one file; missing / mistyped keys raise GGUFError."""

    def __init__(self, reader: Any, path: str, arch: str):
        self.reader, self.path, self.arch = reader, path, arch

    def raw(self, key: str, default: Any = None, required: bool = True) -> Any:
        full = f"{self.arch}.{key}"
        field = self.reader.fields.get(full)
        if field is None:
            if required:
                raise GGUFFormatError(f"{self.path}: missing metadata key '{full}'")
            return default
        try:
            return _field_value(field)
        except Exception as e:
            raise GGUFFormatError(f"{self.path}: cannot read metadata key '{full}' ({e})") from e

    def get_int(self, key: str, default: int | None = None) -> int:
        v = self.raw(key, default, required=default is None)
        if isinstance(v, list):  # a per-layer array (e.g. head_count_kv): must be uniform
            if not v or any(x != v[0] for x in v):
                raise UnsupportedError(f"{self.path}: '{self.arch}.{key}' varies per layer "
                                       f"({v[:8]}...); only uniform values are supported")
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise GGUFFormatError(f"{self.path}: metadata key '{self.arch}.{key}' must be a "
                            f"non-negative integer, found {v!r}")
        return int(v)

    def get_float(self, key: str, default: float | None = None) -> float:
        v = self.raw(key, default, required=default is None)
        if not isinstance(v, (int, float, np.floating, np.integer)) or isinstance(v, bool):
            raise GGUFFormatError(f"{self.path}: metadata key '{self.arch}.{key}' must be a number, "
                            f"found {v!r}")
        return float(v)


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise GGUFFormatError(msg)


def _tensor_table(reader: Any, path: str) -> dict[str, TensorInfo]:
    """name -> TensorInfo (NumPy-order shape, absolute offset); checks the data lies in the file."""
    size = os.path.getsize(path)
    out: dict[str, TensorInfo] = {}
    for t in reader.tensors:
        qtype = int(t.tensor_type)
        shape = tuple(int(n) for n in reversed(list(t.shape)))
        info = TensorInfo(name=t.name, qtype=qtype, shape=shape, offset=int(t.data_offset),
                          nbytes=int(t.n_bytes))
        if info.offset + info.nbytes > size:
            raise GGUFFormatError(f"{path}: truncated: tensor '{t.name}' needs bytes "
                            f"[{info.offset}, {info.offset + info.nbytes}) but the file has "
                            f"{size} bytes")
        out[t.name] = info
    return out


def _layer_schedule(meta: _Meta, arch: str, n_layer: int, interval: int) -> tuple[str, ...]:
    """'attn' | 'gdn' per layer (spec.md §2: attention iff (il+1) % interval == 0)."""
    if arch == "qwen3":
        return ("attn",) * n_layer
    recurrent = meta.raw("attention.recurrent_layers", None, required=False)
    if recurrent is not None:
        if len(recurrent) < n_layer:
            raise GGUFFormatError(f"{meta.path}: '{arch}.attention.recurrent_layers' has "
                            f"{len(recurrent)} entries, expected >= {n_layer}")
        return tuple("gdn" if recurrent[i] else "attn" for i in range(n_layer))
    if interval <= 0:
        raise GGUFFormatError(f"{meta.path}: '{arch}.full_attention_interval' must be > 0, "
                        f"found {interval}")
    return tuple("attn" if (il + 1) % interval == 0 else "gdn" for il in range(n_layer))


def _check_schedule(path: str, kinds: tuple[str, ...], names: set[str], interval: int) -> None:
    """Each block's mixer tensors must match the schedule: attn_q (attention) vs attn_qkv (GDN)."""
    for il, kind in enumerate(kinds):
        has_q = f"blk.{il}.attn_q.weight" in names
        has_qkv = f"blk.{il}.attn_qkv.weight" in names
        want, other = (("attn_q", "attn_qkv") if kind == "attn" else ("attn_qkv", "attn_q"))
        if (kind == "attn" and has_qkv and not has_q) or (kind == "gdn" and has_q and not has_qkv):
            raise GGUFFormatError(
                f"{path}: layer schedule mismatch: full_attention_interval={interval} makes "
                f"blk.{il} a {'full-attention' if kind == 'attn' else 'GDN'} layer "
                f"(needs blk.{il}.{want}.weight), but the file has blk.{il}.{other}.weight "
                f"instead")


def _validate_tensors(desc: ModelDesc, tensors: dict[str, TensorInfo]) -> None:
    path = desc.path
    expected = expected_tensors(desc)
    for name, (shape, allowed) in expected.items():
        t = tensors.get(name)
        if t is None:
            raise GGUFFormatError(f"{path}: missing tensor '{name}' (expected shape {shape})")
        if t.qtype not in SUPPORTED_QTYPES:
            raise UnsupportedError(
                f"{path}: tensor '{name}' has unsupported type {qtype_name(t.qtype)} "
                f"({t.qtype}); supported: {', '.join(QTYPE_NAME[q] for q in SUPPORTED_QTYPES)}")
        if t.shape != shape:
            raise GGUFFormatError(f"{path}: tensor '{name}' has shape {t.shape}, expected {shape} "
                            f"(NumPy order)")
        if t.qtype not in allowed:
            raise UnsupportedError(
                f"{path}: tensor '{name}' has type {qtype_name(t.qtype)}, expected one of "
                f"{', '.join(QTYPE_NAME[q] for q in allowed)}")
    for name in tensors:
        if name in expected:
            continue
        m = _BLOCK_RE.match(name)
        if m and int(m.group(1)) >= desc.n_layer:
            continue  # MTP / NextN blocks: not part of the prefill graph
        raise UnsupportedError(f"{path}: unexpected tensor '{name}' (not part of the "
                               f"{desc.arch} graph pyprefill implements)")


def load_model_desc(path: str | os.PathLike[str]) -> ModelDesc:
    """Open, read and validate a qwen3/qwen35 GGUF; returns its ModelDesc (tensors included)."""
    path = os.fspath(path)
    reader = _open_reader(path)
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise GGUFFormatError(f"{path}: missing metadata key 'general.architecture'")
    arch = str(_field_value(arch_field))
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedError(f"unsupported architecture '{arch}' "
                               f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    meta = _Meta(reader, path, arch)
    tensors = _tensor_table(reader, path)

    n_block = meta.get_int("block_count")
    nextn = meta.get_int("nextn_predict_layers", 0)
    n_layer = n_block - nextn
    _require(n_layer > 0, f"{path}: block_count {n_block} - nextn_predict_layers {nextn} "
                          f"leaves no layers")
    n_embd = meta.get_int("embedding_length")
    head_dim = meta.get_int("attention.key_length")
    v_len = meta.get_int("attention.value_length")
    _require(v_len == head_dim, f"{path}: attention.value_length {v_len} != key_length "
                                f"{head_dim} (unsupported)")
    rope_dim = meta.get_int("rope.dimension_count", head_dim)  # absent in qwen3 files: R = D
    _require(0 < rope_dim <= head_dim and rope_dim % 2 == 0,
             f"{path}: rope.dimension_count {rope_dim} must be even and in (0, {head_dim}]")
    if arch == "qwen3":
        _require(rope_dim == head_dim, f"{path}: qwen3 needs rope.dimension_count == key_length "
                                       f"({rope_dim} != {head_dim})")

    te = tensors.get("token_embd.weight")
    if te is None:
        raise GGUFFormatError(f"{path}: missing tensor 'token_embd.weight'")
    _require(len(te.shape) == 2, f"{path}: tensor 'token_embd.weight' has shape {te.shape}, "
                                 f"expected (n_vocab, {n_embd})")
    n_vocab = te.shape[0]

    kw: dict[str, Any] = {}
    interval = 0
    if arch == "qwen35":
        interval = meta.get_int("full_attention_interval", 4)  # the converter's default
        kw = dict(full_attention_interval=interval,
                  conv_kernel=meta.get_int("ssm.conv_kernel"),
                  ssm_dk=meta.get_int("ssm.state_size"),
                  ssm_hk=meta.get_int("ssm.group_count"),
                  ssm_hv=meta.get_int("ssm.time_step_rank"),
                  ssm_inner=meta.get_int("ssm.inner_size"),
                  nextn_predict_layers=nextn)
        hk, hv = kw["ssm_hk"], kw["ssm_hv"]
        _require(hk > 0 and hv > 0 and hv % hk == 0,
                 f"{path}: ssm.time_step_rank {hv} must be a positive multiple of "
                 f"ssm.group_count {hk}")
        _require(kw["ssm_inner"] == hv * kw["ssm_dk"],
                 f"{path}: ssm.inner_size {kw['ssm_inner']} != time_step_rank {hv} x state_size "
                 f"{kw['ssm_dk']} (llama.cpp requires dk == dv)")
    n_head = meta.get_int("attention.head_count")
    n_head_kv = meta.get_int("attention.head_count_kv")
    _require(n_head > 0 and n_head_kv > 0 and n_head % n_head_kv == 0,
             f"{path}: attention.head_count {n_head} must be a positive multiple of "
             f"head_count_kv {n_head_kv}")
    kinds = _layer_schedule(meta, arch, n_layer, interval)
    if arch == "qwen35":
        _check_schedule(path, kinds, set(tensors), interval)

    desc = ModelDesc(
        path=path, arch=arch, n_block=n_block, n_layer=n_layer, n_embd=n_embd,
        n_ff=meta.get_int("feed_forward_length"), n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, rope_base=meta.get_float("rope.freq_base"), rope_dim=rope_dim,
        eps=meta.get_float("attention.layer_norm_rms_epsilon"),
        context_length=meta.get_int("context_length"), n_vocab=n_vocab,
        tied_output="output.weight" not in tensors, layer_kinds=kinds, tensors=tensors, **kw)
    _validate_tensors(desc, tensors)
    return desc


def read_tensor(desc_or_reader: Any, name: str, dtype: Any = np.float32) -> np.ndarray:
    """Dequantize tensor `name` to a NumPy-order array (e.g. (out, in)) of float32 or float64.

    desc_or_reader: a ModelDesc (the file is memory-mapped at the recorded offset) or an open
    gguf.GGUFReader.
    """
    from gguf.quants import dequantize
    if isinstance(desc_or_reader, ModelDesc):
        t = desc_or_reader.tensors.get(name)
        if t is None:
            raise GGUFFormatError(f"{desc_or_reader.path}: no tensor '{name}'")
        elems, nbytes = QTYPE_BLOCK[t.qtype]
        raw = np.memmap(desc_or_reader.path, dtype=np.uint8, mode="r", offset=t.offset,
                        shape=(t.nbytes,))
        raw = raw.reshape(t.shape[:-1] + (t.shape[-1] // elems * nbytes,))
        qtype, shape = t.qtype, t.shape
    else:
        found = [t for t in desc_or_reader.tensors if t.name == name]
        if not found:
            raise GGUFFormatError(f"no tensor '{name}' in the GGUF")
        t = found[0]
        raw, qtype = t.data, int(t.tensor_type)
        shape = tuple(int(n) for n in reversed(list(t.shape)))
    if qtype not in SUPPORTED_QTYPES:
        raise UnsupportedError(f"tensor '{name}' has unsupported type {qtype_name(qtype)}")
    if qtype not in (QTYPE_F32, QTYPE_F16):
        raw = np.asarray(raw).view(np.uint8)  # BF16 and the block types are raw bytes
    out = dequantize(np.asarray(raw), qtype).reshape(shape)
    return np.array(out, dtype=dtype)  # always a private, writable copy (never the mmap)
