"""The defaults Python writes out (pyprefill._defaults) are the library's: the "default" comments
of include/prefill.h and, where the library fills a number in, its _init functions (CPU)."""
import inspect
import re
from pathlib import Path

import pytest

from pyprefill import _defaults
from pyprefill._defaults import DEFAULT_BATCH_STEPS, DEFAULT_CAPACITY, DEFAULT_STEP_TOKENS

ROOT = Path(__file__).resolve().parents[2]
HEADER = (ROOT / "include" / "prefill.h").read_text()


def _field_comment(struct: str, field: str) -> str:
    """The comment of `field` in `typedef struct struct {...}`, continuation lines joined."""
    body = re.search(rf"typedef struct {struct} \{{(.*?)\}} {struct};", HEADER, re.S)
    assert body, f"no struct {struct} in prefill.h"
    m = re.search(rf"\b{field};\s*/\*(.*?)\*/", body.group(1), re.S)
    assert m, f"no comment on {struct}.{field}"
    return " ".join(m.group(1).split())


def _number(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in {text!r}"
    return int(m.group(1))


def test_capacity_is_the_headers():
    assert _number(r"default (\d+)", _field_comment("pf_session_options", "max_tokens")) == DEFAULT_CAPACITY
    assert _number(r"default 0 = (\d+)", _field_comment("pf_batch_options", "max_context")) == DEFAULT_CAPACITY


def test_step_is_the_headers():
    assert _number(r"default 0 = (\d+)", _field_comment("pf_batch_options", "step_tokens")) == DEFAULT_STEP_TOKENS
    assert _number(r"auto: (\d+) rows", _field_comment("pf_session_options", "chunk_tokens")) == DEFAULT_STEP_TOKENS
    assert _number(r"default 0 = (\d+) x step_tokens",
                   _field_comment("pf_batch_options", "max_tokens")) == DEFAULT_BATCH_STEPS
    assert _defaults.batch_max_tokens() == DEFAULT_BATCH_STEPS * DEFAULT_STEP_TOKENS
    assert _defaults.batch_max_tokens(512) == DEFAULT_BATCH_STEPS * 512


def test_capacity_is_what_the_library_fills_in():
    """pf_session_options_init writes the capacity itself (the batch leaves its 0s to the library)."""
    try:
        from pyprefill._ffi import ffi, lib
    except ImportError as exc:
        pytest.skip(f"libprefill not loadable: {str(exc).splitlines()[0]}")
    opts = ffi.new("pf_session_options *")
    assert lib.pf_session_options_init(opts, ffi.sizeof("pf_session_options")) == lib.PF_STATUS_OK
    assert opts.max_tokens == DEFAULT_CAPACITY


def test_python_signatures_use_the_constants():
    """Every default capacity and step of the public signatures is the constant, not a copy."""
    from pyprefill import model
    from pyprefill.bench import cli as bench_cli
    assert inspect.signature(model.Model.session).parameters["max_tokens"].default == DEFAULT_CAPACITY
    assert inspect.signature(model.Session).parameters["max_tokens"].default == DEFAULT_CAPACITY
    a = bench_cli.build_parser().parse_args(["model"])
    assert a.chunk == DEFAULT_STEP_TOKENS
    assert bench_cli.resolve(a).steps == [DEFAULT_STEP_TOKENS]
    # no module of the package writes them again: no `max_tokens=4096`, `chunk or 2048`,
    # `max(..., 16384)` beside the names of these options
    option = r"(max_tokens|max_context|step_tokens|steps|chunk\w*|capacity)"
    numbers = "|".join(str(n) for n in (DEFAULT_CAPACITY, DEFAULT_STEP_TOKENS,
                                         DEFAULT_BATCH_STEPS * DEFAULT_STEP_TOKENS))
    written = re.compile(rf"{option}[^\n#]*?(=|\bor\b|\[)\s*({numbers})\b|max\([^)\n]*,\s*({numbers})\)")
    for path in (ROOT / "pyprefill").rglob("*.py"):
        if path.name == "_defaults.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if '"' in code or "'" in code:       # help texts and messages may say the number
                code = re.sub(r"(\"[^\"]*\"|'[^']*')", "", code)
            assert not written.search(code), f"{path.relative_to(ROOT)}:{i} writes a default itself: {line.strip()}"
