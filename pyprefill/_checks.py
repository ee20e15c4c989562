"""Argument checks of the Python API, run before any device work (the command line's are in
_cli_args.py). Pure Python + NumPy: the NumPy reference uses them and never imports the binding.

token_ids is the one conversion of token input for every entry point (engine sessions and batch
items, the reference, the tokenizer, the command line): a wrong input is refused, naming the
argument, the first bad index and its value, and is never turned into another prompt (a float
rounded down, an int64 id wrapped into int32, a 2-D array flattened, a string parsed).
"""
from __future__ import annotations

import numbers
import os

import numpy as np

from .errors import InvalidArgumentError

INT32_MAX = 2**31 - 1


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _range_text(n_vocab: int | None) -> str:
    if n_vocab is None:
        return f"outside the token ids of int32 [0, {INT32_MAX}]"
    return f"outside the vocabulary [0, {n_vocab})"


def token_id(value, name: str = "token", *, n_vocab: int | None = None) -> int:
    """One token id: an int (Python or NumPy, not a bool) in [0, n_vocab) (n_vocab None: in
    int32); InvalidArgumentError naming `name` and the value otherwise."""
    if not _is_int(value):
        raise InvalidArgumentError(f"{name} = {_short(value)} is not a token id (an integer; got "
                                   f"{type(value).__name__})")
    v = int(value)
    if not 0 <= v < (INT32_MAX + 1 if n_vocab is None else n_vocab):
        raise InvalidArgumentError(f"{name} = {v} is {_range_text(n_vocab)}")
    return v


def token_ids(tokens, name: str = "tokens", *, n_vocab: int | None = None,
              allow_empty: bool = False) -> np.ndarray:
    """`tokens` as a C-contiguous 1-D int32 array (no copy when it is one already).

    Accepted: a 1-D NumPy array of an integer dtype, or a flat sequence (list, tuple, range) of
    ints, every value in [0, n_vocab) (n_vocab None: in int32). Refused with InvalidArgumentError
    naming `name`, the first bad index and its value: a non-integer dtype or element (floats,
    bools, strings, None), a value outside that range, a scalar or a string (not a sequence), an
    array of 2 or more dimensions, and an empty sequence unless allow_empty.
    """
    if isinstance(tokens, (str, bytes, bytearray)):
        raise InvalidArgumentError(f"{name}: expected token ids (integers), got the "
                                   f"{type(tokens).__name__} {_short(tokens)} (text goes through "
                                   "a tokenizer first: model.tokenizer.encode(text))")
    if _is_int(tokens) or isinstance(tokens, (float, bool, np.generic)):
        raise InvalidArgumentError(f"{name}: expected a 1-D sequence of token ids, got the scalar "
                                   f"{_short(tokens)}" + (f" (write [{tokens}])" if _is_int(tokens) else ""))
    if isinstance(tokens, np.ndarray):
        arr = tokens
    else:
        if tokens is None or not hasattr(tokens, "__iter__"):
            raise InvalidArgumentError(f"{name}: expected a 1-D sequence of token ids, got "
                                       f"{type(tokens).__name__}")
        if not hasattr(tokens, "__len__"):           # an iterator or a generator: its items
            tokens = list(tokens)
        try:
            arr = np.asarray(tokens)
        except (ValueError, TypeError) as exc:       # ragged nesting, an odd iterable
            raise InvalidArgumentError(f"{name}: not a flat sequence of token ids ({exc})") from None
    if arr.ndim != 1:
        what = (f"shape {arr.shape}" if arr.ndim else "a 0-d array" if isinstance(tokens, np.ndarray)
                else f"a {type(tokens).__name__}")
        raise InvalidArgumentError(f"{name}: expected a 1-D sequence of token ids, got {what} "
                                   "(one sequence per call: index a row, or use a batch)")
    if arr.size == 0:
        if allow_empty:
            return np.zeros(0, np.int32)
        raise InvalidArgumentError(f"{name}: empty (need at least one token id)")
    kind = arr.dtype.kind
    if kind == "O":                                  # Python objects: ints beyond int64, mixtures
        for i, v in enumerate(arr.tolist()):
            if not _is_int(v):
                raise InvalidArgumentError(f"{name}[{i}] = {_short(v)} is not a token id (an "
                                           f"integer; got {type(v).__name__})")
            if not 0 <= v < (INT32_MAX + 1 if n_vocab is None else n_vocab):
                raise InvalidArgumentError(f"{name}[{i}] = {v} is {_range_text(n_vocab)}")
        return np.array(arr.tolist(), np.int32)
    if kind not in "iu":
        bad = 0
        if not isinstance(tokens, np.ndarray):       # a list: the first item that is not an int
            bad = next((i for i, v in enumerate(tokens) if not _is_int(v)), 0)
        elif kind in "fc":                           # an array: its first value that is not whole
            whole = np.isfinite(arr) & (arr == np.round(arr.real))
            bad = int(np.argmin(whole)) if not whole.all() else 0
        v = arr[bad].item() if kind != "b" else bool(arr[bad])
        raise InvalidArgumentError(f"{name}[{bad}] = {_short(v)} is not a token id: token ids are "
                                   f"integers, got an array of dtype {arr.dtype}")
    limit = INT32_MAX + 1 if n_vocab is None else n_vocab
    lo = hi = arr.item() if arr.size == 1 else None      # a decode step: one id, no reductions
    if lo is None:
        lo, hi = arr.min(), arr.max()
    if (kind == "i" and lo < 0) or hi >= limit:
        outside = (arr >= limit) if kind == "u" else (arr < 0) | (arr >= limit)
        i = int(np.flatnonzero(outside)[0])
        raise InvalidArgumentError(f"{name}[{i}] = {int(arr[i])} is {_range_text(n_vocab)}")
    return np.ascontiguousarray(arr, dtype=np.int32)


def int_arg(value, name: str, low: int = 0, high: int | None = None) -> int:
    """An int option (Python or NumPy int, not a bool or a float) in [low, high];
    InvalidArgumentError naming `name` otherwise."""
    if not _is_int(value):
        raise InvalidArgumentError(f"{name}: {_short(value)} is not an int (got {type(value).__name__})")
    v = int(value)
    if v < low:
        raise InvalidArgumentError(f"{name}: {v} is less than {low}")
    if high is not None and v > high:
        raise InvalidArgumentError(f"{name}: {v} is more than {high}")
    return v


def path_arg(path, name: str = "path") -> str:
    """A file path as str (str, bytes or os.PathLike); InvalidArgumentError naming `name` for
    anything else (None, a number) and for an empty path."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise InvalidArgumentError(f"{name}: expected a path (str or os.PathLike), got "
                                   f"{type(path).__name__} {_short(path)}")
    text = os.fsdecode(os.fspath(path))
    if not text:
        raise InvalidArgumentError(f"{name}: an empty path")
    return text


__all__ = ["token_ids", "token_id", "int_arg", "path_arg", "INT32_MAX"]
