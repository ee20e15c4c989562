#!/usr/bin/env python3
"""Build the HF parity fixtures under tests/data/ (needs torch + transformers; runs on the CPU).

For each seeded tiny random HF model (every parameter randomised, including the zero-centred
norms, A_log, dt_bias and the GDN output norm — spec.md §7.4/§8):
  <name>.f32.gguf   exported with pyprefill.formats.hf_export (quant="f32")
  <name>.f32.npz    logits at every position of a few prompts (one of 200+ tokens) from the
                    ORIGINAL HF model run in true float64 (see `hf_float64`), stored as float32
  <name>.mix.gguf   exported with quant="mix" (Q8_0, Q4_K, Q6_K, IQ4_XS, F16, ... see MIXES)
  <name>.mix.npz    the same prompts through HF with the mix file's DEQUANTIZED weights loaded
                    back (hf_export.load_gguf_into_hf), also in true float64
Each npz: tokens_<i> (int32), logits_<i> (T_i, V) float32, gguf (file name), n_prompts.
Also measured and written to tests/data/README.md: HF fp32 vs HF float64 for each fixture.

    PYTHONPATH=. /work/venv/bin/python scripts/make_fixtures.py [--out tests/data]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pyprefill.formats import hf_export  # noqa: E402
from pyprefill.reference import ReferenceModel  # noqa: E402

PROMPT_LENGTHS = (6, 41, 203)


@dataclass
class Fixture:
    name: str
    arch: str          # "qwen3" | "qwen35"
    seed: int
    cfg: dict
    note: str


FIXTURES = [
    Fixture("qwen3_tiny", "qwen3", 1234, dict(
        vocab_size=128, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=False),
        "qwen3, d=64, H*D=128 != d, H=4 Hkv=2 D=32, n_ff=256, 2 layers, untied, V=128"),
    Fixture("qwen35_hv2", "qwen35", 2345, dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention"] * 2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [6, 5, 5], "mrope_interleaved": True}),
        "qwen35, interval 2 (G,A,G,A), Hk=2 Hv=4 (V-head reorder active), dk=dv=64, "
        "H=2 Hkv=1 D=128 R=32, n_ff=128, d=64, tied, V=128"),
    Fixture("qwen35_hv1", "qwen35", 3456, dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=32,
        linear_value_head_dim=32, linear_conv_kernel_dim=4, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
        "qwen35, interval 4 (G,G,G,A), Hk=Hv=2, dk=dv=32, H=4 Hkv=2 D=32 R=8, n_ff=128, "
        "d=64, untied, V=128"),
]


def build_model(fx: Fixture):
    """A seeded HF model with every parameter randomised (float32)."""
    import torch
    if fx.arch == "qwen3":
        from transformers import Qwen3Config as Cfg, Qwen3ForCausalLM as Model
    else:
        from transformers import Qwen3_5ForCausalLM as Model, Qwen3_5TextConfig as Cfg
    torch.manual_seed(fx.seed)
    config = Cfg(**fx.cfg)
    config._attn_implementation = "sdpa"
    model = Model(config).eval()
    gen = torch.Generator().manual_seed(fx.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            n = lambda: torch.randn(p.shape, generator=gen)  # noqa: E731
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(-1.0, 1.5, generator=gen))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * n())
            elif "norm" in name:
                zero_centred = fx.arch == "qwen35" and "linear_attn.norm" not in name
                p.copy_((0.0 if zero_centred else 1.0) + 0.2 * n())
            elif "conv1d" in name:
                p.copy_(0.5 * n())
            elif "embed_tokens" in name:
                p.copy_(n())
            else:   # linear weights (out, in): keep activations O(1)
                p.copy_(n() / np.sqrt(p.shape[-1]))
    return model


@contextlib.contextmanager
def hf_float64(model):
    """Run an HF model in true float64: model.double() plus widening the fp32 casts the modeling
    code makes on purpose (RMSNorm, RoPE tables, softmax, gates and the delta rule, spec.md §8):
    inside the context Tensor.float() / .to(float32) on a float64 tensor (or an integer position
    tensor) yield float64, and the RoPE inverse frequencies are recomputed in float64."""
    import torch
    orig_to, orig_float = torch.Tensor.to, torch.Tensor.float

    def widen(self, dtype):
        return torch.float64 if dtype in (torch.float32, torch.float) else dtype

    def to(self, *args, **kwargs):
        args = tuple(widen(self, a) if isinstance(a, torch.dtype) else a for a in args)
        if "dtype" in kwargs:
            kwargs["dtype"] = widen(self, kwargs["dtype"])
        return orig_to(self, *args, **kwargs)

    def flt(self, *args, **kwargs):
        return orig_to(self, torch.float64)

    model.double()
    for mod in model.modules():
        if hasattr(mod, "inv_freq") and hasattr(mod, "config"):
            rp = mod.config.rope_parameters
            head_dim = getattr(mod.config, "head_dim", None) or \
                mod.config.hidden_size // mod.config.num_attention_heads
            dim = int(head_dim * rp.get("partial_rotary_factor", 1.0))
            inv = 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            mod.inv_freq = inv
            mod.original_inv_freq = inv.clone()
    torch.Tensor.to, torch.Tensor.float = to, flt
    try:
        yield model
    finally:
        torch.Tensor.to, torch.Tensor.float = orig_to, orig_float


def hf_logits(model, tokens: np.ndarray) -> np.ndarray:
    """(T, V) logits of one prompt, no cache, float64 NumPy."""
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(tokens.astype(np.int64))[None], use_cache=False)
    return out.logits[0].double().numpy()


def rel(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(whole-array relative error ||a-b||/||b||, worst single position)."""
    whole = np.linalg.norm(a - b) / np.linalg.norm(b)
    per = np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)
    return float(whole), float(per.max())


def main() -> None:
    import copy

    import torch
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    readme = ["# tests/data — HF parity fixtures", "",
              "Made by `PYTHONPATH=. /work/venv/bin/python scripts/make_fixtures.py` (CPU, "
              f"torch {torch.__version__}, transformers "
              f"{__import__('transformers').__version__}); deterministic (seeded: a re-run reproduces every "
              ".gguf and .npz byte for byte). "
              f"Prompts: random token ids (numpy seed = model seed), lengths {PROMPT_LENGTHS}.",
              "",
              "Logits are from HF run in **true float64** (`model.double()` plus the fp32 casts "
              "inside the modeling code widened: RMSNorm, RoPE tables (inv_freq recomputed in "
              "float64), softmax (sdpa), gates and the delta rule — see `hf_float64` in the "
              "script), stored as float32. Why: HF fp32 is itself ~1e-6..1e-5 off the exact "
              "result at 200 tokens (measured below), which would leave no margin for a 1e-5 "
              "per-position bar. `*.f32.npz` = the original random HF model; `*.mix.npz` = the "
              "same model with the mix GGUF's dequantized weights loaded back "
              "(`hf_export.load_gguf_into_hf`).", "",
              "Last two columns: relative error ||a-b||/||b|| over all positions of all prompts / "
              "at the worst single position, for HF fp32 vs the stored HF float64 logits, and for "
              "the NumPy reference (`ReferenceModel(gguf, float64)`) vs the stored logits.", "",
              "| file | how it was made | HF fp32 vs HF float64 | reference vs fixture |",
              "|---|---|---|---|"]
    for fx in FIXTURES:
        model = build_model(fx)
        prompts = [np.random.default_rng(fx.seed + i).integers(0, fx.cfg["vocab_size"], n)
                   .astype(np.int32) for i, n in enumerate(PROMPT_LENGTHS)]
        for quant in ("f32", "mix"):
            gguf_name = f"{fx.name}.{quant}.gguf"
            gguf_path = os.path.join(args.out, gguf_name)
            types = hf_export.export_hf_to_gguf(model, gguf_path, quant=quant)
            m = copy.deepcopy(model)
            if quant == "mix":
                hf_export.load_gguf_into_hf(m, gguf_path)
            l32 = [hf_logits(m, p) for p in prompts]
            with hf_float64(m):
                l64 = [hf_logits(m, p) for p in prompts]
            noise = rel(np.concatenate(l32), np.concatenate(l64))
            npz = {"gguf": np.array(gguf_name), "n_prompts": np.array(len(prompts))}
            for i, (p, lg) in enumerate(zip(prompts, l64)):
                npz[f"tokens_{i}"] = p
                npz[f"logits_{i}"] = lg.astype(np.float32)
            np.savez_compressed(os.path.join(args.out, f"{fx.name}.{quant}.npz"), **npz)
            hist: dict[str, int] = {}
            for t in types.values():
                nm = hf_export.QTYPE_NAME_ALL.get(t, str(t))
                hist[nm] = hist.get(nm, 0) + 1
            qdesc = ", ".join(f"{k} x{v}" for k, v in sorted(hist.items()))
            readme.append(f"| `{gguf_name}` | {fx.note}; seed {fx.seed}; "
                          f"`export_hf_to_gguf(quant=\"{quant}\")`: {qdesc} | | |")
            ref_model = ReferenceModel(gguf_path, np.float64)
            ref_err = rel(np.concatenate([ref_model.forward(p, "all") for p in prompts]),
                          np.concatenate([lg.astype(np.float32).astype(np.float64) for lg in l64]))
            src = "original HF model" if quant == "f32" else f"HF with `{gguf_name}` dequantized"
            readme.append(f"| `{fx.name}.{quant}.npz` | logits of {src}, float64 run | "
                          f"{noise[0]:.2e} / {noise[1]:.2e} | {ref_err[0]:.2e} / {ref_err[1]:.2e} |")
            print(f"{fx.name}.{quant}: HF fp32 vs fp64 {noise[0]:.2e} (worst pos {noise[1]:.2e}); "
                  f"reference vs fixture {ref_err[0]:.2e} (worst pos {ref_err[1]:.2e})", flush=True)
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    readme += ["", f"Total size of the generated files: {total / 1e6:.2f} MB.", ""]
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write("\n".join(readme))
    print(f"total {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
