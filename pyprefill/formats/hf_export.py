"""Export a transformers Qwen3ForCausalLM / Qwen3_5ForCausalLM (text-only) to GGUF, following
llama.cpp's converter rules as restated in spec.md §1.4 (qwen3) and §3.3 (qwen35); and the inverse:
load a GGUF's *dequantized* weights back into the HF model, so that "HF with the dequantized
weights" is the expected result for a quantized file.

torch and transformers are imported only inside the functions that need them; the module itself
needs only NumPy and gguf. The transforms are done in NumPy float32 except `ssm_a = −exp(A_log)`,
which uses torch float32 like the converter (§3.3, byte-identical output).

    export_hf_to_gguf(model, "m.gguf", quant="f32")      # or quant="mix", or a {pattern: qtype} dict
    load_gguf_into_hf(model, "m.gguf")                   # inverse transforms, dequantized
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import InvalidArgumentError, UnsupportedError
from .model_desc import (QTYPE_BF16, QTYPE_BLOCK, QTYPE_F16, QTYPE_F32, QTYPE_IQ4_XS,
                         QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K,
                         QTYPE_Q8_0)

# ---------------------------------------------------------------------------------------------
# Quant mixes: a list of (regex on the GGUF tensor name, qtype); first match wins. Tensors that
# the converter keeps in F32 (§3.3 dtype rules) never consult the mix.
# ---------------------------------------------------------------------------------------------

MIXES: dict[str, list[tuple[str, int]]] = {
    # Exercises Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS and F16 (K-quants/IQ4_XS need k % 256 == 0,
    # otherwise the tensor falls back to Q8_0, see `_fallback`).
    "mix": [
        (r"^token_embd\.weight$", QTYPE_Q8_0),
        (r"^output\.weight$", QTYPE_Q6_K),
        (r"\.attn_(q|k|v)\.weight$", QTYPE_Q8_0),
        (r"\.attn_output\.weight$", QTYPE_IQ4_XS),
        (r"\.attn_qkv\.weight$", QTYPE_Q5_K),
        (r"\.attn_gate\.weight$", QTYPE_Q8_0),
        (r"\.ssm_(alpha|beta)\.weight$", QTYPE_F16),
        (r"\.ssm_out\.weight$", QTYPE_Q6_K),
        (r"\.ffn_(gate|up)\.weight$", QTYPE_Q4_K),
        (r"^blk\.\d*[02468]\.ffn_down\.weight$", QTYPE_Q6_K),   # even layers
        (r"\.ffn_down\.weight$", QTYPE_Q4_K),                    # odd layers
    ],
    "q8_0": [(r".", QTYPE_Q8_0)],
    "f16": [(r".", QTYPE_F16)],
    "bf16": [(r".", QTYPE_BF16)],
}


def _fallback(qtype: int, k: int) -> int:
    """The qtype actually used for a row length k: a block that does not divide k falls back to
    Q8_0 (k % 32 == 0), else F16."""
    if k % QTYPE_BLOCK[qtype][0] == 0:
        return qtype
    return QTYPE_Q8_0 if k % 32 == 0 else QTYPE_F16


def _must_stay_f32(name: str, arr: np.ndarray) -> bool:
    """§1.4 / §3.3 dtype rules: 1-D tensors, *_norm.weight, names not ending in .weight (ssm_a,
    ssm_dt.bias) and ssm_conv1d stay F32."""
    return (arr.ndim == 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
            or ".ssm_conv1d." in name)


def choose_qtype(name: str, arr: np.ndarray, quant: str | Mapping[str, int]) -> int:
    """GGML type for tensor `name` (NumPy shape `arr.shape`) under `quant` (a mix name in any
    case: "Q8_0" as llama.cpp writes it, or "q8_0")."""
    if isinstance(quant, str):
        quant = quant.lower()
    if _must_stay_f32(name, arr) or quant == "f32":
        return QTYPE_F32
    rules = MIXES[quant] if isinstance(quant, str) else list(quant.items())
    for pattern, qtype in rules:
        if re.search(pattern, name):
            return _fallback(int(qtype), arr.shape[-1])
    return QTYPE_F32


def _quantize(arr: np.ndarray, qtype: int) -> np.ndarray:
    """Bytes (rows, row_bytes) uint8 of a float32 2-D array; F16 is a plain cast (returned as
    float16). Uses the project quantizer (formats/quant.py)."""
    if qtype == QTYPE_F16:
        return arr.astype(np.float16)
    from .quant import quantize
    return np.asarray(quantize(np.ascontiguousarray(arr, dtype=np.float32), qtype))


# ---------------------------------------------------------------------------------------------
# Config access (transformers 5 keeps rope values in rope_parameters)
# ---------------------------------------------------------------------------------------------

def _cfg(config: Any, name: str, default: Any = None) -> Any:
    v = getattr(config, name, None)
    if v is None:
        rp = getattr(config, "rope_parameters", None) or {}
        v = rp.get(name) if isinstance(rp, dict) else None
    if v is None:
        if default is None:
            raise InvalidArgumentError(f"config has no {name}")
        return default
    return v


def _arch(config: Any) -> str:
    mt = getattr(config, "model_type", "")
    if mt == "qwen3":
        return "qwen3"
    if mt in ("qwen3_5_text", "qwen3_5"):
        return "qwen35"
    raise UnsupportedError(f"model_type {mt!r} is not qwen3 / qwen3_5_text")


def attention_interval(layer_types: list[str]) -> int:
    """The `full_attention_interval` I such that layer i is full attention iff (i+1) % I == 0,
    derived from HF `layer_types` (§3.3 warning); a pattern this rule cannot express is refused."""
    n = len(layer_types)
    is_attn = [t == "full_attention" for t in layer_types]
    if any(t not in ("full_attention", "linear_attention") for t in layer_types):
        raise UnsupportedError(f"unknown layer type in {layer_types}")
    first = is_attn.index(True) if any(is_attn) else n
    interval = first + 1
    if [(i + 1) % interval == 0 for i in range(n)] != is_attn:
        raise UnsupportedError(f"layer_types {layer_types} is not an every-I-th-layer pattern")
    return interval


# ---------------------------------------------------------------------------------------------
# The V-head reorder Rv of §3.3
# ---------------------------------------------------------------------------------------------

def v_reorder(x: np.ndarray, n_k: int, n_v: int, h: int, axis: int = 0) -> np.ndarray:
    """Rv(x, h) along `axis`: GGUF index (jj·Hk + kk)·h + e = HF index (kk·r + jj)·h + e."""
    r = n_v // n_k
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    y = x.reshape(n_k, r, h, *rest).swapaxes(0, 1).reshape(n_v * h, *rest)
    return np.moveaxis(y, 0, axis)


def v_reorder_inverse(x: np.ndarray, n_k: int, n_v: int, h: int, axis: int = 0) -> np.ndarray:
    """Inverse of `v_reorder` (GGUF tiled order -> HF grouped order)."""
    r = n_v // n_k
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    y = x.reshape(r, n_k, h, *rest).swapaxes(0, 1).reshape(n_v * h, *rest)
    return np.moveaxis(y, 0, axis)


# ---------------------------------------------------------------------------------------------
# HF -> GGUF tensors
# ---------------------------------------------------------------------------------------------

def _np(t: Any) -> np.ndarray:
    """A torch tensor (bf16 upcast, §1.4) or array as float32 NumPy."""
    if hasattr(t, "detach"):
        import torch
        t = t.detach().to("cpu")
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy().astype(np.float32)
    return np.asarray(t, dtype=np.float32)


def _neg_exp_f32(a_log: np.ndarray) -> np.ndarray:
    """−exp(A_log) computed with torch in float32, as the converter does (§3.3)."""
    import torch
    return (-torch.exp(torch.from_numpy(np.ascontiguousarray(a_log, dtype=np.float32)))).numpy()


def gguf_tensors_from_hf(state_dict: Mapping[str, Any], config: Any,
                         write_output: bool | None = None) -> dict[str, np.ndarray]:
    """GGUF name -> float32 NumPy array (NumPy order) after every transform of §1.4 / §3.3.

    state_dict: HF names `model.…` / `lm_head.weight` (a `model.language_model.` prefix is
    stripped and `model.visual.*` / `mtp.*` dropped). write_output: write `output.weight`; by
    default iff the checkpoint would hold `lm_head.weight`, i.e. not tie_word_embeddings.
    """
    arch = _arch(config)
    sd = {}
    for k, v in state_dict.items():
        k = k.replace("model.language_model.", "model.")
        if k.startswith(("model.visual.", "mtp.")):
            continue
        sd[k] = v
    if write_output is None:
        write_output = "lm_head.weight" in sd and not getattr(config, "tie_word_embeddings", False)
    plus1 = (lambda a: a + np.float32(1)) if arch == "qwen35" else (lambda a: a)  # §3.3 / §7.4
    out: dict[str, np.ndarray] = {"token_embd.weight": _np(sd["model.embed_tokens.weight"]),
                                  "output_norm.weight": plus1(_np(sd["model.norm.weight"]))}
    if write_output:
        out["output.weight"] = _np(sd["lm_head.weight"])
    n_layer = int(config.num_hidden_layers)
    ffn_norm = "ffn_norm" if arch == "qwen3" else "post_attention_norm"
    for i in range(n_layer):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        g = lambda n: _np(sd[p + n])  # noqa: E731
        out[b + "attn_norm.weight"] = plus1(g("input_layernorm.weight"))
        out[b + f"{ffn_norm}.weight"] = plus1(g("post_attention_layernorm.weight"))
        for hf, gg in (("gate", "gate"), ("up", "up"), ("down", "down")):
            out[b + f"ffn_{gg}.weight"] = g(f"mlp.{hf}_proj.weight")
        if p + "self_attn.q_proj.weight" in sd:
            # per-head [q | gate] rows of qwen35 attn_q kept as they are (§7.3)
            for hf, gg in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")):
                out[b + f"attn_{gg}.weight"] = g(f"self_attn.{hf}_proj.weight")
            out[b + "attn_q_norm.weight"] = plus1(g("self_attn.q_norm.weight"))
            out[b + "attn_k_norm.weight"] = plus1(g("self_attn.k_norm.weight"))
        else:
            nk, nv = int(config.linear_num_key_heads), int(config.linear_num_value_heads)
            dk, dv = int(config.linear_key_head_dim), int(config.linear_value_head_dim)
            key_dim = nk * dk
            rv = lambda a, h, axis=0: v_reorder(a, nk, nv, h, axis)  # noqa: E731
            qkv = g("linear_attn.in_proj_qkv.weight")
            out[b + "attn_qkv.weight"] = np.concatenate(
                [qkv[:2 * key_dim], rv(qkv[2 * key_dim:], dv)], axis=0)
            out[b + "attn_gate.weight"] = rv(g("linear_attn.in_proj_z.weight"), dv)
            out[b + "ssm_beta.weight"] = rv(g("linear_attn.in_proj_b.weight"), 1)
            out[b + "ssm_alpha.weight"] = rv(g("linear_attn.in_proj_a.weight"), 1)
            out[b + "ssm_a"] = _neg_exp_f32(rv(g("linear_attn.A_log"), 1))       # §7.5
            out[b + "ssm_dt.bias"] = rv(g("linear_attn.dt_bias"), 1)
            conv = g("linear_attn.conv1d.weight")                                # (C, 1, Kc)
            conv = conv.reshape(conv.shape[0], conv.shape[-1])                   # squeeze
            out[b + "ssm_conv1d.weight"] = np.concatenate(
                [conv[:2 * key_dim], rv(conv[2 * key_dim:], dv)], axis=0)
            out[b + "ssm_norm.weight"] = g("linear_attn.norm.weight")            # no +1
            out[b + "ssm_out.weight"] = rv(g("linear_attn.out_proj.weight"), dv, axis=1)
    return out


def _write_metadata(w: Any, arch: str, config: Any, n_vocab: int) -> None:
    import gguf
    w.add_name(f"pyprefill-export-{arch}")
    w.add_block_count(int(config.num_hidden_layers))
    w.add_context_length(int(config.max_position_embeddings))
    w.add_embedding_length(int(config.hidden_size))
    w.add_feed_forward_length(int(config.intermediate_size))
    w.add_head_count(int(config.num_attention_heads))
    w.add_head_count_kv(int(config.num_key_value_heads))
    head_dim = int(getattr(config, "head_dim", None)
                   or config.hidden_size // config.num_attention_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(_cfg(config, "rope_theta")))
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    if arch == "qwen35":
        prf = float(_cfg(config, "partial_rotary_factor", 0.25))
        w.add_rope_dimension_count(int(head_dim * prf))
        sections = list(_cfg(config, "mrope_section", [11, 11, 10]))
        w.add_rope_dimension_sections(sections + [0] * (4 - len(sections)))
        w.add_full_attention_interval(attention_interval(list(config.layer_types)))
        w.add_ssm_conv_kernel(int(config.linear_conv_kernel_dim))
        w.add_ssm_state_size(int(config.linear_key_head_dim))
        w.add_ssm_group_count(int(config.linear_num_key_heads))
        w.add_ssm_time_step_rank(int(config.linear_num_value_heads))
        w.add_ssm_inner_size(int(config.linear_value_head_dim * config.linear_num_value_heads))
    # minimal tokenizer metadata (not needed for the prefill math, §2.1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen3" else "qwen35")
    w.add_token_list([f"<t{i}>" for i in range(n_vocab)])
    w.add_token_types([int(gguf.TokenType.NORMAL)] * n_vocab)
    w.add_eos_token_id(n_vocab - 1)
    w.add_add_bos_token(False)


def export_hf_to_gguf(model_or_state_dict: Any, path: str, quant: str | Mapping[str, int] = "f32",
                      config: Any = None, write_output: bool | None = None) -> dict[str, int]:
    """Write a GGUF file from an HF model (or a state dict + `config`).

    quant: "f32", a name in MIXES ("mix", "q8_0", "f16", "bf16"; any case) or a {regex: qtype}
    dict. Returns {tensor name: qtype written}.
    """
    import gguf
    if isinstance(quant, str):
        quant = quant.lower()
    if config is None:
        config = model_or_state_dict.config
        sd = model_or_state_dict.state_dict()
    else:
        sd = model_or_state_dict
    if isinstance(quant, str) and quant != "f32" and quant not in MIXES:
        raise InvalidArgumentError(f"unknown quant mix {quant!r}")
    arch = _arch(config)
    tensors = gguf_tensors_from_hf(sd, config, write_output)
    writer = gguf.GGUFWriter(path, arch)
    _write_metadata(writer, arch, config, tensors["token_embd.weight"].shape[0])
    types: dict[str, int] = {}
    for name, arr in tensors.items():
        qtype = choose_qtype(name, arr, quant)
        types[name] = qtype
        if qtype == QTYPE_F32:
            writer.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
        elif qtype == QTYPE_F16:
            writer.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float16))
        else:
            data = _quantize(arr, qtype)
            writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType(qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return types


# ---------------------------------------------------------------------------------------------
# GGUF (dequantized) -> HF
# ---------------------------------------------------------------------------------------------

def _gguf_reader(path: str, workers: int = 1) -> Callable[[str], np.ndarray]:
    """name -> dequantized float32 NumPy array (validated by load_model_desc); `.names` holds the
    file's tensor names. workers > 1 dequantizes every tensor ahead in a thread pool (gguf's
    NumPy dequantizer is the slow part of loading a large file)."""
    from .gguf_model import load_model_desc, read_tensor
    desc = load_model_desc(path)
    ahead = {}
    if workers > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(workers) as pool:
            ahead = {name: pool.submit(read_tensor, desc, name, np.float32) for name in desc.tensors}

    def read(name: str) -> np.ndarray:
        fut = ahead.pop(name, None)
        return fut.result() if fut is not None else read_tensor(desc, name, np.float32)
    read.names = set(desc.tensors)  # type: ignore[attr-defined]
    return read


def hf_state_dict_from_gguf(path: str, config: Any, workers: int = 1) -> dict[str, np.ndarray]:
    """The HF state dict (float32 NumPy) whose export would be the file's dequantized weights:
    the inverse of `gguf_tensors_from_hf` (norms − 1 for qwen35 except ssm_norm, A_log =
    log(−ssm_a), inverse V-head reorder, conv unsqueeze). Tied files give lm_head = embed.
    workers: threads that dequantize ahead (see _gguf_reader)."""
    arch = _arch(config)
    read = _gguf_reader(path, workers)
    minus1 = (lambda a: a - np.float32(1)) if arch == "qwen35" else (lambda a: a)
    sd: dict[str, np.ndarray] = {"model.embed_tokens.weight": read("token_embd.weight"),
                                 "model.norm.weight": minus1(read("output_norm.weight"))}
    sd["lm_head.weight"] = (read("output.weight") if "output.weight" in read.names  # type: ignore
                            else sd["model.embed_tokens.weight"])
    ffn_norm = "ffn_norm" if arch == "qwen3" else "post_attention_norm"
    for i in range(int(config.num_hidden_layers)):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        sd[p + "input_layernorm.weight"] = minus1(read(b + "attn_norm.weight"))
        sd[p + "post_attention_layernorm.weight"] = minus1(read(b + f"{ffn_norm}.weight"))
        for n in ("gate", "up", "down"):
            sd[p + f"mlp.{n}_proj.weight"] = read(b + f"ffn_{n}.weight")
        if b + "attn_q.weight" in read.names:  # type: ignore[attr-defined]
            for hf, gg in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")):
                sd[p + f"self_attn.{hf}_proj.weight"] = read(b + f"attn_{gg}.weight")
            sd[p + "self_attn.q_norm.weight"] = minus1(read(b + "attn_q_norm.weight"))
            sd[p + "self_attn.k_norm.weight"] = minus1(read(b + "attn_k_norm.weight"))
        else:
            nk, nv = int(config.linear_num_key_heads), int(config.linear_num_value_heads)
            dk, dv = int(config.linear_key_head_dim), int(config.linear_value_head_dim)
            key_dim = nk * dk
            inv = lambda a, h, axis=0: v_reorder_inverse(a, nk, nv, h, axis)  # noqa: E731
            qkv = read(b + "attn_qkv.weight")
            sd[p + "linear_attn.in_proj_qkv.weight"] = np.concatenate(
                [qkv[:2 * key_dim], inv(qkv[2 * key_dim:], dv)], axis=0)
            sd[p + "linear_attn.in_proj_z.weight"] = inv(read(b + "attn_gate.weight"), dv)
            sd[p + "linear_attn.in_proj_b.weight"] = inv(read(b + "ssm_beta.weight"), 1)
            sd[p + "linear_attn.in_proj_a.weight"] = inv(read(b + "ssm_alpha.weight"), 1)
            sd[p + "linear_attn.A_log"] = np.log(-inv(read(b + "ssm_a"), 1))
            sd[p + "linear_attn.dt_bias"] = inv(read(b + "ssm_dt.bias"), 1)
            conv = read(b + "ssm_conv1d.weight")
            conv = np.concatenate([conv[:2 * key_dim], inv(conv[2 * key_dim:], dv)], axis=0)
            sd[p + "linear_attn.conv1d.weight"] = conv[:, None, :]
            sd[p + "linear_attn.norm.weight"] = read(b + "ssm_norm.weight")
            sd[p + "linear_attn.out_proj.weight"] = inv(read(b + "ssm_out.weight"), dv, axis=1)
    return sd


def load_gguf_into_hf(model: Any, path: str, workers: int = 1) -> None:
    """Overwrite every parameter of an HF model with the GGUF file's dequantized weights
    (inverse transforms), keeping the model's dtype. Fails on any missing/unexpected key.
    workers: threads that dequantize ahead (see _gguf_reader)."""
    import torch
    sd = hf_state_dict_from_gguf(path, model.config, workers)
    own = model.state_dict()
    missing = set(own) - set(sd)
    extra = set(sd) - set(own)
    if missing or extra:
        raise InvalidArgumentError(f"state dict mismatch: missing {sorted(missing)}, "
                                   f"unexpected {sorted(extra)}")
    with torch.no_grad():
        for k, t in own.items():
            src = torch.from_numpy(np.ascontiguousarray(sd[k]))
            if tuple(src.shape) != tuple(t.shape):
                raise InvalidArgumentError(f"{k}: shape {tuple(src.shape)} vs {tuple(t.shape)}")
            t.copy_(src.to(t.dtype))


QTYPE_NAME_ALL = {QTYPE_F32: "F32", QTYPE_F16: "F16", QTYPE_BF16: "BF16", QTYPE_Q8_0: "Q8_0",
                  QTYPE_Q4_K: "Q4_K", QTYPE_Q5_K: "Q5_K", QTYPE_Q6_K: "Q6_K",
                  QTYPE_IQ4_XS: "IQ4_XS"}
