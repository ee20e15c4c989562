"""pyprefill: prompt prefill of GGUF-quantized LLMs (qwen3, qwen35) on CUDA GPUs.

The binding to libprefill (Context, Buffer, Weight, Model, ...) loads lazily, so that the
pure-Python parts (pyprefill.formats, pyprefill.reference) work where no library is built.
"""
from .errors import (AbiMismatchError, CudaError, GGUFError, GGUFFormatError, InvalidArgumentError,
                     NoDeviceError, OutOfMemoryError, PrefillError, UnsupportedError)

__version__ = "0.6.0"

_LAZY = {"Context": "core", "Buffer": "core", "Weight": "core", "device_count": "core",
         "Model": "model", "Session": "model", "Batch": "model", "Tokenizer": "tokenizer"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'pyprefill' has no attribute {name!r}")


def __dir__():
    """The lazy names too (Model, Session, Batch, ...): dir() and completion show the API."""
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["__version__", "PrefillError", "InvalidArgumentError", "UnsupportedError",
           "OutOfMemoryError", "GGUFError", "GGUFFormatError", "CudaError", "NoDeviceError",
           "AbiMismatchError", *_LAZY]
