"""Bad arguments from Python raise typed exceptions that name the fault (CPU)."""
import numpy as np
import pytest

from pyprefill import core, errors
from pyprefill._errors import _check
from pyprefill._ffi import ffi, lib


def test_status_names_and_strings():
    for s in range(lib.PF_STATUS_COUNT):
        assert ffi.string(lib.pf_status_name(s)).decode().startswith("PF_STATUS_")
        assert ffi.string(lib.pf_status_string(s))


def test_exception_hierarchy():
    assert issubclass(errors.InvalidArgumentError, ValueError)
    assert issubclass(errors.UnsupportedError, NotImplementedError)
    assert issubclass(errors.OutOfMemoryError, MemoryError)
    assert issubclass(errors.GGUFError, OSError)
    assert issubclass(errors.CudaError, RuntimeError)
    for cls in (errors.InvalidArgumentError, errors.UnsupportedError, errors.OutOfMemoryError,
                errors.GGUFError, errors.CudaError, errors.NoDeviceError):
        assert issubclass(cls, errors.PrefillError)


def test_matrix_bytes_errors_are_typed():
    assert core.matrix_bytes("Q4_K", 3, 512) == 3 * 2 * 144
    with pytest.raises(errors.InvalidArgumentError, match="not a multiple of the Q4_K block"):
        core.matrix_bytes("Q4_K", 3, 100)
    with pytest.raises(errors.InvalidArgumentError, match="must be positive"):
        core.matrix_bytes("Q8_0", -1, 32)
    with pytest.raises(errors.UnsupportedError, match="GGML type 10 is not supported"):
        core.matrix_bytes(10, 1, 256)
    with pytest.raises(errors.InvalidArgumentError, match="qtype: unknown name"):
        core.matrix_bytes("Q3_XL", 1, 256)


def test_check_carries_status_and_message():
    with pytest.raises(errors.InvalidArgumentError) as info:
        _check(lib.pf_device_count(ffi.NULL))
    assert info.value.status == lib.PF_STATUS_INVALID_ARGUMENT
    assert "PF_STATUS_INVALID_ARGUMENT" in str(info.value) and "out is NULL" in str(info.value)


def test_abi_mismatch_is_reported():
    opts = ffi.new("pf_context_options *")
    with pytest.raises(errors.AbiMismatchError, match="struct_size"):
        _check(lib.pf_context_options_init(opts, ffi.sizeof("pf_context_options") + 8))


def test_array_checks_name_the_argument():
    with pytest.raises(errors.InvalidArgumentError, match="data: expected a numpy array"):
        core.as_carray([1, 2, 3], "data")
    with pytest.raises(errors.InvalidArgumentError, match=r"x: expected dtype float32, got float64"):
        core.as_carray(np.zeros(3), "x", np.float32)
    with pytest.raises(errors.InvalidArgumentError, match="not C-contiguous"):
        core.as_carray(np.zeros((4, 4), np.float32)[:, ::2], "x", np.float32)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(errors.InvalidArgumentError, match="read-only"):
        core.as_carray(ro, "out", np.float32, writable=True)


def test_no_device_context_error():
    if core.device_count() > 0:
        pytest.skip("a GPU is present: the no-device path cannot be exercised here")
    with pytest.raises(errors.NoDeviceError, match="no CUDA device"):
        core.Context(0)


def test_memory_budget_argument_is_checked_before_the_device():
    """Context(memory_budget=) refuses a negative or non-integer budget, naming the argument,
    before it asks for a device (so this runs on any machine)."""
    for bad in (-1, 2.5, "24G"):
        with pytest.raises(errors.InvalidArgumentError, match="memory_budget"):
            core.Context(0, memory_budget=bad)


def test_cli_check_runs(capsys):
    from pyprefill.cli import main
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "pyprefill" in out and "devices:" in out


@pytest.mark.parametrize("init,ctype", [("pf_context_options_init", "pf_context_options"),
                                        ("pf_model_options_init", "pf_model_options"),
                                        ("pf_session_options_init", "pf_session_options")])
def test_every_options_struct_is_size_checked(init, ctype):
    opts = ffi.new(f"{ctype} *")
    with pytest.raises(errors.AbiMismatchError, match=rf"{init}: struct_size=\d+ but this library's {ctype}"):
        _check(getattr(lib, init)(opts, ffi.sizeof(ctype) - 8))
    _check(getattr(lib, init)(opts, ffi.sizeof(ctype)))
    assert opts.struct_size == ffi.sizeof(ctype)
    with pytest.raises(errors.InvalidArgumentError, match="pointer is NULL"):
        _check(getattr(lib, init)(ffi.NULL, ffi.sizeof(ctype)))


def test_session_options_defaults():
    opts = ffi.new("pf_session_options *")
    _check(lib.pf_session_options_init(opts, ffi.sizeof("pf_session_options")))
    assert (opts.max_tokens, opts.chunk_tokens, opts.kv_dtype, opts.gemm_leg) == (4096, 0, 0, 0)
    assert opts.cuda_graphs == 1
    m = ffi.new("pf_model_options *")
    _check(lib.pf_model_options_init(m, ffi.sizeof("pf_model_options")))
    assert m.prewarm == 1 and m.progress == ffi.NULL
