"""Kernel-level Python wrappers over libprefill's kernel C API, one module per op family.

Each module offers buffer-level calls (pyprefill Buffers in, results in Buffers, for callers who
keep data on the device) and NumPy convenience calls (arrays in, arrays out) used by the tests.
"""
