"""Kernel-level Python wrappers over libprefill's kernel C API, one module per op family
(gemm, rows, gdn, attention) and the helpers they share (_common).

One naming scheme: the buffer-level wrapper is the C entry minus ``pf_`` (``pf_rms_norm`` ->
``rms_norm``, ``pf_gdn_scan`` -> ``gdn_scan``) and takes pyprefill Buffers or :class:`View` s
(``pf_view``: buffer, element offset, row stride) for callers who keep data on the device; the
NumPy convenience is the same name + ``_np`` (arrays in, outputs poisoned with NaN, arrays out),
used by the tests.
"""
from ._common import View

__all__ = ["View"]
