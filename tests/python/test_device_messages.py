"""Why there is no CUDA device, named right (CPU): no NVIDIA driver at all, a driver too old for
the library's CUDA runtime, the toolkit's stub libcuda, a driver that sees no GPU. cudart calls
the first two cudaErrorInsufficientDriver alike; the library tells them apart by the driver
version. Each case runs in a fresh process whose libcuda.so.1 is a fake built here (cudart loads
it through LD_LIBRARY_PATH and asks it for every entry point through cuGetProcAddress_v2), so
the cases run on any machine with a C compiler, a GPU machine included; the no-driver case runs
only where no libcuda.so.1 can be loaded at all (CI, a developer's machine)."""
import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyprefill._ffi", reason="libprefill not loadable")

ROOT = Path(__file__).resolve().parents[2]

# cuInit's result and the driver version come from the environment of the child process.
FAKE_LIBCUDA = r"""
#include <stdlib.h>
#include <string.h>
static int env_int(const char *name, int dflt) { const char *v = getenv(name); return v ? atoi(v) : dflt; }
static int driver_version(int *v) { *v = env_int("FAKE_CUDA_VERSION", 12040); return 0; }
static int init(unsigned flags) { (void)flags; return env_int("FAKE_CUINIT", 0); }
static int device_count(int *n) { *n = 0; return 0; }
int cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, int *st);
static int get_proc_v1(const char *s, void **p, int v, unsigned long long f) {
    return cuGetProcAddress_v2(s, p, v, f, 0);
}
int cuDriverGetVersion(int *v) { return driver_version(v); }
int cuInit(unsigned flags) { return init(flags); }
int cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, int *st) {
    (void)f;
    void *fn = 0;
    if (!strcmp(s, "cuDriverGetVersion")) fn = (void *)driver_version;
    else if (!strcmp(s, "cuInit")) fn = (void *)init;
    else if (!strcmp(s, "cuDeviceGetCount")) fn = (void *)device_count;
    else if (!strcmp(s, "cuGetProcAddress")) fn = v >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)get_proc_v1;
    *p = fn;
    if (st) *st = fn ? 0 : 1;        /* CU_GET_PROC_ADDRESS_SUCCESS / SYMBOL_NOT_FOUND */
    return fn ? 0 : 500;             /* CUDA_ERROR_NOT_FOUND */
}
"""

PROBE = """
from pyprefill import core, errors
from pyprefill._errors import no_device_reason
assert core.device_count() == 0
try:
    core.Context(0)
except errors.NoDeviceError as e:
    print("ERROR", e)
print("REASON", no_device_reason())
"""


@pytest.fixture(scope="module")
def fake_driver_dir(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the fake libcuda.so.1")
    d = tmp_path_factory.mktemp("fake-driver")
    (d / "fake.c").write_text(FAKE_LIBCUDA)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "libcuda.so.1"), str(d / "fake.c")],
                   check=True, capture_output=True)
    return d


def _probe(env_extra: dict) -> tuple[str, str]:
    env = {**os.environ, **env_extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    return out["ERROR"], out["REASON"]


def _driver_loadable() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def test_no_driver_at_all():
    if _driver_loadable():
        pytest.skip("an NVIDIA driver (libcuda.so.1) is installed here")
    err, why = _probe({})
    assert "no CUDA device: no NVIDIA driver is installed (libcuda.so.1 could not be loaded)" in err
    assert "CUDA 13.0 or newer (version 580 or newer)" in err, err
    assert "insufficient" not in err
    assert why.startswith("no NVIDIA driver is installed"), why


def test_driver_too_old(fake_driver_dir):
    err, why = _probe({"LD_LIBRARY_PATH": str(fake_driver_dir), "FAKE_CUDA_VERSION": "12040"})
    assert ("no CUDA device: the NVIDIA driver supports CUDA 12.4, older than the CUDA 13.0 "
            "runtime this library was built with: update the driver to version 580 or newer") in err
    assert why.startswith("the NVIDIA driver supports CUDA 12.4"), why


def test_driver_without_a_gpu(fake_driver_dir):
    err, why = _probe({"LD_LIBRARY_PATH": str(fake_driver_dir), "FAKE_CUDA_VERSION": "13020",
                       "FAKE_CUINIT": "100"})                       # CUDA_ERROR_NO_DEVICE
    assert "no CUDA device: the NVIDIA driver (CUDA 13.2) is installed but sees no GPU" in err, err
    assert why == "the NVIDIA driver (CUDA 13.2) is installed but sees no GPU"


def test_the_toolkits_stub_is_not_a_driver(tmp_path):
    stub = Path("/usr/local/cuda/lib64/stubs/libcuda.so")
    nvcc = shutil.which("nvcc")
    if nvcc:
        stub = Path(nvcc).resolve().parents[1] / "lib64" / "stubs" / "libcuda.so"
    if not stub.is_file():
        pytest.skip("no CUDA toolkit stub libcuda.so here")
    (tmp_path / "libcuda.so.1").symlink_to(stub)
    err, _ = _probe({"LD_LIBRARY_PATH": str(tmp_path)})
    assert "no CUDA device: the libcuda.so.1 loaded is the CUDA toolkit's stub, not a driver" in err
