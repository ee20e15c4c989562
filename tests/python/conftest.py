"""GPU tests are marked `gpu` and skip with a reason where no device or library is usable;
CPU tests run everywhere."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))   # helpers.py


def _gpu_state() -> tuple[int, str]:
    try:
        from pyprefill import core
    except ImportError as exc:
        return 0, f"libprefill not loadable: {str(exc).splitlines()[0]}"
    n = core.device_count()
    if n:
        return n, ""
    from pyprefill._errors import no_device_reason
    return 0, f"no CUDA device: {no_device_reason() or 'pf_device_count() == 0'}"


def pytest_addoption(parser):
    parser.addoption("--pf-shard", default=None, metavar="K/N",
                     help="keep the selected tests whose index is K modulo N (0 <= K < N): N "
                          "processes, one per K, run a file's selection exactly once between them "
                          "(scripts/device-check.sh)")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device and the built library")


def _shard(config, items):
    spec = config.getoption("--pf-shard")
    if not spec:
        return
    try:
        k, n = (int(x) for x in spec.split("/"))
        assert 0 <= k < n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--pf-shard={spec}: expected K/N with 0 <= K < N") from None
    keep = [it for i, it in enumerate(items) if i % n == k]
    drop = [it for i, it in enumerate(items) if i % n != k]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.hookimpl(trylast=True)     # after -k / -m deselection: a shard splits what is selected
def pytest_collection_modifyitems(config, items):
    _shard(config, items)
    n, reason = _gpu_state()
    if n > 0:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """Name what the run leaves on disk: the synthetic models kept for the next run (GPU tests
    write them once per machine; $PF_TEST_TMP moves them)."""
    from _engine_models import cache_dir
    d = cache_dir()
    if not os.path.isdir(d):
        return
    files = [os.path.join(d, f) for f in os.listdir(d)]
    size = sum(os.path.getsize(f) for f in files if os.path.isfile(f))
    if files:
        terminalreporter.write_line(f"synthetic models kept for the next run: {d} ({len(files)} files, "
                                    f"{size / 2**20:.0f} MiB; PF_TEST_TMP moves them, rm -r frees them)")


@pytest.fixture(scope="session")
def ctx():
    """One context for the GPU tests of the session (kernels, legs)."""
    from pyprefill.core import Context
    with Context(0) as c:
        yield c


@pytest.fixture
def rng(request):
    """Fresh random inputs per test, seeded from the test id so that failures reproduce."""
    import zlib

    import numpy as np
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
