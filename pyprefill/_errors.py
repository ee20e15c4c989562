"""One `_check` for every pf_* call: a failing status becomes a typed exception that carries
the status name and the library's own message (pf_last_error, read right after the call)."""
from __future__ import annotations

from ._ffi import ffi, lib
from .errors import (AbiMismatchError, CudaError, GGUFError, GGUFFormatError, InvalidArgumentError,
                     NoDeviceError, OutOfMemoryError, PrefillError, UnsupportedError)

_BY_STATUS = {
    lib.PF_STATUS_INVALID_ARGUMENT: InvalidArgumentError,
    lib.PF_STATUS_UNSUPPORTED: UnsupportedError,
    lib.PF_STATUS_OUT_OF_MEMORY: OutOfMemoryError,
    lib.PF_STATUS_CUDA_ERROR: CudaError,
    lib.PF_STATUS_CUBLAS_ERROR: CudaError,
    lib.PF_STATUS_IO_ERROR: GGUFError,
    lib.PF_STATUS_FORMAT_ERROR: GGUFFormatError,
    lib.PF_STATUS_ABI_MISMATCH: AbiMismatchError,
    lib.PF_STATUS_NO_DEVICE: NoDeviceError,
}


def last_error() -> str:
    return ffi.string(lib.pf_last_error()).decode("utf-8", "replace")


def _check(status: int) -> None:
    """Raise the matching PrefillError if a pf_* call failed. Call it right after the call."""
    if status == lib.PF_STATUS_OK:
        return
    name = ffi.string(lib.pf_status_name(status)).decode()
    raise _BY_STATUS.get(status, PrefillError)(f"{name}: {last_error()}", status)


def no_device_reason() -> str:
    """Why no CUDA device can be used, in the library's words: no NVIDIA driver, a driver too old
    for the library's CUDA runtime, a stub libcuda, or no GPU ("" when there is a device). Asks
    pf_context_create only when pf_device_count finds none, so nothing is created."""
    n = ffi.new("int32_t *")
    _check(lib.pf_device_count(n))
    if n[0] > 0:
        return ""
    out = ffi.new("pf_context **")
    status = lib.pf_context_create(out, ffi.NULL)
    if status == lib.PF_STATUS_OK:        # the count and the create disagree: use the device
        lib.pf_context_destroy(out[0])
        return ""
    return last_error().removeprefix("pf_context_create: ").removeprefix("no CUDA device: ")
