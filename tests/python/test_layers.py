"""The layers of cuda/ point one way (docs/architecture.md "Folders"): each folder includes only
the folders below it. Bottom up: base/ (errors, the operand view, the context), plan/ (host-only
decisions and formats: no CUDA header), ptx/ (device primitives), kernels/<family>/, runtime/,
api/. A header is included by its path under cuda/ ("plan/route.h"); the public header as
"prefill.h"."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

CUDA = Path(__file__).resolve().parents[2] / "cuda"
ORDER = ["base", "plan", "ptx", "kernels", "runtime", "api"]
# Inside runtime/, bottom up: a model and its pool of KV pages; one sequence's state; the
# executor that runs a step (its layer loop and its projections); the runner of planned items;
# sessions; batches and the prefix cache (it runs sessions).
RUNTIME = [{"model", "kv_pool"}, {"sequence"}, {"executor", "forward", "project"}, {"run"}, {"session"},
           {"batch", "prefix_cache"}]
# plan/ is host-only: of base/ it may read only the host-only headers.
PLAN_BASE = {"base/error.h", "base/mat.h"}
CUDA_SYSTEM = re.compile(r"#include <(cuda|cublas|cudaTypedefs|cuda_fp16|cuda_runtime|device_)")
INCLUDE = re.compile(r'#include "([^"]+)"')


def _sources():
    return sorted(p for p in CUDA.rglob("*") if p.is_file())


def test_every_file_sits_in_a_layer():
    strays = [str(p.relative_to(CUDA)) for p in _sources() if p.relative_to(CUDA).parts[0] not in ORDER]
    assert not strays, f"files outside the layer folders {ORDER}: {strays}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(CUDA)))
def test_includes_point_down(path: Path):
    rel = path.relative_to(CUDA)
    layer = ORDER.index(rel.parts[0])
    text = path.read_text()
    for name in INCLUDE.findall(text):
        if name == "prefill.h":
            continue
        assert (CUDA / name).is_file(), f"{rel}: #include \"{name}\" is not a path under cuda/"
        target = name.split("/")[0]
        assert ORDER.index(target) <= layer, f"{rel} ({rel.parts[0]}/) includes {name}: a layer above it"
        if rel.parts[0] == "plan" and target == "base":
            assert name in PLAN_BASE, f"{rel}: plan/ is host-only, {name} is not"
    if rel.parts[0] == "plan":
        assert not CUDA_SYSTEM.search(text), f"{rel}: plan/ includes a CUDA header"
    if rel.parts[0] == "runtime":
        rank = _runtime_rank(rel.stem)
        for name in INCLUDE.findall(text):
            if name.startswith("runtime/"):
                assert _runtime_rank(Path(name).stem) <= rank, f"{rel} includes {name}: a runtime room above it"


def _runtime_rank(stem: str) -> int:
    ranks = [i for i, room in enumerate(RUNTIME) if stem in room]
    assert ranks, f"runtime/{stem}: not in the runtime order of test_layers.py"
    return ranks[0]
