"""The model-level paths end to end, short enough to run under every compute-sanitizer tool
(scripts/device-check.sh runs memcheck, racecheck, initcheck and synccheck over this file): load,
prefill in chunks, decode, generate, save, restore, reset, destroy, on the tiny fixtures of both
archs with the exact and the default legs. GPU; a few seconds plain. PF_LIFECYCLE_SHAPES=all adds
a qwen35-0.8b-shape synthetic model (written once under $PF_TEST_TMP, ~0.5 GB)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from _engine_models import random_tokens, synth_model
from _reference_fixtures import fixture_path

pytestmark = pytest.mark.gpu

LEGS = {"exact": dict(gemm="f32", kv="f32", attention="cublas"),
        "default": dict(gemm="default", kv="f16", attention="auto")}
MODELS = ["qwen3_tiny.mix.gguf", "qwen35_hv2.mix.gguf"]
if os.environ.get("PF_LIFECYCLE_SHAPES") == "all":
    MODELS.append("synth:qwen35-0.8b")


def _path(name: str) -> str:
    return synth_model(name[6:], "q4_k_m") if name.startswith("synth:") else fixture_path(name)


@pytest.mark.parametrize("legs", list(LEGS))
@pytest.mark.parametrize("name", MODELS)
def test_load_prefill_decode_generate_save_restore_reset_destroy(name, legs, rng):
    from pyprefill.model import Model
    opts = dict(kv=LEGS[legs]["kv"], attention=LEGS[legs]["attention"], chunk=8)
    m = Model.load(_path(name), gemm=LEGS[legs]["gemm"], prewarm=legs == "default", progress=False)
    toks = random_tokens(rng, 40, m.n_vocab)
    s = m.session(max_tokens=64, **opts)
    first = s.prefill(toks[:13], "all")                 # chunks of 8: 8 + 5
    s.prefill(toks[13:30], "last")                      # continues at 13: 3 chunks
    step = s.decode(int(toks[30]))
    assert s.position == 31 and np.isfinite(first).all() and np.isfinite(step).all()
    state = s.save()
    gen = s.generate(3)
    r = m.restore(state, max_tokens=64, **opts)
    assert r.position == 31 and np.array_equal(r.generate(3), gen)
    s.reset()
    assert s.position == 0 and np.array_equal(s.prefill(toks[:13], "all"), first)
    r.close()
    s.close()
    m.close()
