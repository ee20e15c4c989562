"""Exception types of pyprefill.

Pure Python (no library needed), so the GGUF readers and the NumPy reference raise the same
types as the binding. Each subclass is also the matching built-in, so `except ValueError`
keeps working for callers who do not know pyprefill.
"""


class PrefillError(Exception):
    """Any failure reported by pyprefill; `.status` is the pf_status value (or None)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(PrefillError, ValueError):
    """A bad argument: a shape, a dtype, a size, a token id, an option value."""


class UnsupportedError(PrefillError, NotImplementedError):
    """A valid request that this build cannot serve (a qtype, an architecture)."""


class OutOfMemoryError(PrefillError, MemoryError):
    """A host or device allocation failed."""


class GGUFError(PrefillError, OSError):
    """A GGUF file is missing, unreadable, not a regular file (PF_STATUS_IO_ERROR), or its
    contents are wrong (GGUFFormatError, a subclass: `except GGUFError` catches both)."""


class GGUFFormatError(GGUFError):
    """A GGUF's contents (PF_STATUS_FORMAT_ERROR): not a GGUF, truncated, malformed, or not the
    model it claims (a tensor missing or of a wrong shape, inconsistent metadata)."""


class CudaError(PrefillError, RuntimeError):
    """A CUDA or cuBLAS call failed."""


class NoDeviceError(PrefillError, RuntimeError):
    """No CUDA device (or no driver) is available."""


class AbiMismatchError(PrefillError, RuntimeError):
    """The header pyprefill read and the loaded library disagree."""
