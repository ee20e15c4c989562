"""Model level: load a GGUF onto a GPU, open sessions, prefill, decode, save and restore.

    model = pyprefill.Model.load("qwen35-4b.gguf")         # progress bar on load and prewarm
    s = model.session(max_tokens=8192)
    logits = s.prefill(np.array(ids, np.int32))             # last-token logits, (n_vocab,)
    more = s.generate(16)                                    # greedy tokens
    state = s.save(); s2 = model.restore(state)              # continue from the same point
    model.chat("Why is the sky blue?", max_new_tokens=256)   # the GGUF's chat template, a reply
"""
from __future__ import annotations

import weakref

import numpy as np

from ._errors import _check
from ._ffi import enum_map, enum_value, ffi, lib
from . import tuning as _tuning
from ._checks import INT32_MAX, int_arg, path_arg, token_id, token_ids
from ._defaults import DEFAULT_CAPACITY, batch_max_tokens
from ._progress import StageBars
from .core import Context, _Owner, as_carray
from .errors import InvalidArgumentError

from .kernels.attention import KV_DTYPES as _KV, PATHS as _ATTN
from .kernels.gemm import LEGS as _LEGS

LOGITS = enum_map("pf_logits_mode", "PF_LOGITS_")    # {"none": 0, "last": 1, "all": 2}
ARCHS = enum_map("pf_arch", "PF_ARCH_")               # {"qwen3": 1, "qwen35": 2}
ARCH_NAMES = {v: k for k, v in ARCHS.items()}


def _leg_id(gemm) -> int:
    return enum_value(gemm, _LEGS, "gemm", any_int=True)


def _kv_attention_ids(kv: str, attention: str) -> tuple[int, int]:
    """A session's or batch's KV dtype and attention path as their C values, named when wrong."""
    if not isinstance(kv, str) or kv not in _KV:
        raise InvalidArgumentError(f"kv: {kv!r} is not one of {list(_KV)}")
    if not isinstance(attention, str) or attention not in _ATTN:
        raise InvalidArgumentError(f"attention: {attention!r} is not one of {list(_ATTN)}")
    return _KV[kv], _ATTN[attention]


def _check_model(model) -> None:
    """A session's or batch's model: an open pyprefill.Model (InvalidArgumentError otherwise)."""
    if not isinstance(model, Model):
        raise InvalidArgumentError(f"model: expected a pyprefill.Model, got {type(model).__name__}")
    model.ptr                                 # InvalidArgumentError when it is closed


def _info_dict(i) -> dict:
    d = {name: getattr(i, name) for name in dir(i)}
    d["arch"] = ARCH_NAMES.get(i.arch, str(i.arch))
    return d


def inspect(path: str) -> dict:
    """Parse and validate a GGUF as Model.load does, without a device: the model's info."""
    path = path_arg(path)
    i = ffi.new("pf_model_info *")
    _check(lib.pf_model_inspect(path.encode(), i))
    return _info_dict(i)


class Model(_Owner):
    """A qwen3 / qwen35 GGUF model on one device (owns its Context unless one is given)."""

    _tokenizer = None                   # built from the GGUF on first use of .tokenizer

    def __init__(self, path: str, *, device: int = 0, gemm="default", prewarm: bool = True,
                 prewarm_headroom: int = 0, progress: bool = True, context: Context | None = None,
                 tuning: dict | None = None):
        """tuning: pyprefill.tuning fields over the context's (the prewarm's fuse_groups and
        prewarm_* fields; the rest is inherited by the sessions).

        Every argument, and the file itself (pf_model_inspect: missing, not a regular file, not
        a GGUF, not a model of this library), is checked before the device is asked for."""
        path = path_arg(path)
        if context is None:
            device = int_arg(device, "device", 0, INT32_MAX)
        elif not isinstance(context, Context):
            raise InvalidArgumentError(f"context: expected a pyprefill.Context, got {type(context).__name__}")
        else:
            context.ptr                       # InvalidArgumentError when it is closed
        opts = ffi.new("pf_model_options *")
        _check(lib.pf_model_options_init(opts, ffi.sizeof("pf_model_options")))
        opts.gemm_leg = _leg_id(gemm)
        opts.prewarm = 1 if prewarm else 0
        opts.prewarm_headroom_bytes = int_arg(prewarm_headroom, "prewarm_headroom", 0, 2**63 - 1)
        _tuning.fill(opts.tuning, tuning)     # before the context: a bad field leaves nothing behind
        inspect(path)                         # the file's faults, in the library's words
        self._own_ctx = context is None
        self.ctx = context if context is not None else Context(device)
        bars = StageBars(progress)

        @ffi.callback("void(void *, const char *, int64_t, int64_t)")
        def _progress(user, stage, done, total):
            try:
                bars(ffi.string(stage).decode(), done, total)
            except Exception:   # a callback must never raise into C
                pass

        opts.progress = _progress
        self._progress_cb = _progress   # the library calls it again on a later prewarm: keep it alive
        out = ffi.new("pf_model **")
        try:
            _check(lib.pf_model_load(out, self.ctx.ptr, path.encode(), opts))
        except BaseException:
            if self._own_ctx:
                self.ctx.close()
            raise
        finally:
            bars.close()
        self._adopt(out[0], lib.pf_model_destroy, self.ctx)
        self.path = path
        self.ctx._children.add(self)    # closing the context first closes this model
        # weak: a Session holds its Model (so the model outlives it), never the other way round,
        # so garbage collection can never free a model before one of its sessions
        self._sessions: weakref.WeakSet = weakref.WeakSet()
        self.info = self._info()

    @classmethod
    def load(cls, path: str, device: int = 0, gemm="default", prewarm: bool = True, **kw) -> "Model":
        return cls(path, device=device, gemm=gemm, prewarm=prewarm, **kw)

    def _info(self) -> dict:
        i = ffi.new("pf_model_info *")
        _check(lib.pf_model_info_get(self.ptr, i))
        return _info_dict(i)

    def refresh_info(self) -> dict:
        self.info = self._info()
        return self.info

    @property
    def n_vocab(self) -> int:
        return int(self.info["n_vocab"])

    def prewarm(self, headroom: int = 0) -> bool:
        armed = ffi.new("int32_t *")
        _check(lib.pf_model_prewarm(self.ptr, headroom, armed))
        self.refresh_info()
        return bool(armed[0])

    def prewarm_report(self) -> dict:
        """The last prewarm's report (at load or prewarm()): armed, bytes read / written,
        elapsed_ms (wall) and device_ms (the dequantization on the device)."""
        from .kernels.gemm import new_prewarm_report, prewarm_report_dict
        rep = new_prewarm_report()
        _check(lib.pf_model_prewarm_report(self.ptr, rep))
        return prewarm_report_dict(rep)

    def weight(self, name: str):
        """The model's matrix `name` (GGUF tensor name) as a borrowed Weight (kernel-level
        calls, e.g. gemm.weight_f16_np); valid while the model is open."""
        from .core import Weight
        out = ffi.new("pf_weight **")
        _check(lib.pf_model_weight(self.ptr, str(name).encode(), out))
        return Weight._borrowed(out[0], self.ctx, self)

    def session(self, max_tokens: int = DEFAULT_CAPACITY, *, chunk: int = 0, kv: str = "f16",
                gemm="default", attention: str = "auto", graphs: bool = True,
                tuning: dict | None = None, own_executor: bool = True, snapshot_every: int = 0,
                snapshot_at_end: bool = False, snapshot_slots: int = 0,
                paged: bool = False) -> "Session":
        return Session(self, max_tokens=max_tokens, chunk=chunk, kv=kv, gemm=gemm,
                       attention=attention, graphs=graphs, tuning=tuning, own_executor=own_executor,
                       snapshot_every=snapshot_every, snapshot_at_end=snapshot_at_end,
                       snapshot_slots=snapshot_slots, paged=paged)

    def kv_pool(self, pages: int, *, page_rows: int = 0, kv: str = "f16") -> None:
        """Makes the model's pool of KV pages (pf_model_kv_pool): `pages` pages of `page_rows`
        positions (a multiple of 64; 0 = the least multiple of the Hopper attention kernel's key
        tiles, 704 rows at head_dim 128, 320 at 256) of every attention layer's K and V rows, for
        sessions made with paged=True. Forks and copies of paged sessions share their common
        prefix's pages; the logits are bitwise those of contiguous sessions. Replaces the pool
        while no session uses it."""
        from .kernels.attention import kv_dtype_id, tile_page_rows
        pages = int_arg(pages, "pages", 1, INT32_MAX)
        page_rows = int_arg(page_rows, "page_rows", 0, INT32_MAX) or tile_page_rows(self.info["head_dim"])
        _check(lib.pf_model_kv_pool(self.ptr, page_rows, pages, kv_dtype_id(kv)))
        b = getattr(self, "_batch", None)   # made before the pool: it cannot run paged sessions
        if b is not None:
            b.close()
            self._batch = None

    def kv_pool_info(self) -> dict:
        """The pool's pages (all and free), page rows and device bytes; zeros when there is none."""
        n, free, rows, size = (ffi.new("int32_t *"), ffi.new("int32_t *"), ffi.new("int32_t *"),
                               ffi.new("size_t *"))
        _check(lib.pf_model_kv_pool_info(self.ptr, n, free, rows, size))
        return {"pages": int(n[0]), "free": int(free[0]), "page_rows": int(rows[0]), "bytes": int(size[0])}

    def prefix_cache(self, *, max_tokens: int = DEFAULT_CAPACITY, snapshot_every: int = 1024,
                     max_entries: int = 32, budget_bytes: int | None = None, kv: str = "f16",
                     gemm="default", paged: bool = False):
        """A prefix cache of this model (pyprefill.prefix_cache.PrefixCache): cache.prefill(session,
        ids) reuses every prompt prefix it computed before, exactly."""
        from .prefix_cache import PrefixCache
        return PrefixCache(self, max_tokens=max_tokens, snapshot_every=snapshot_every, max_entries=max_entries,
                           budget_bytes=budget_bytes, kv=kv, gemm=gemm, paged=paged)

    def prefix_tree(self, *, snapshot_every: int | None = None, snapshot_slots: int | None = None,
                    device_bytes: int = 0, host_bytes: int = 0):
        """The prefix cache in the library (pyprefill.prefix_tree.PrefixTree: pf_prefix_cache, a
        radix tree whose nodes hold pages of the model's KV pool; Model.kv_pool first):
        tree.prefill(session, ids) on paged sessions reuses every prefix it holds, exactly."""
        from .prefix_tree import PrefixTree
        return PrefixTree(self, snapshot_every=snapshot_every, snapshot_slots=snapshot_slots,
                          device_bytes=device_bytes, host_bytes=host_bytes)

    def batch(self, *, max_items: int = 64, step_tokens: int = 0, max_tokens: int = 0,
              max_context: int = 0, kv: str = "f16", gemm="default", attention: str = "auto",
              graphs: bool = True, tuning: dict | None = None) -> "Batch":
        """A batch executor of this model (pf_batch): runs the tokens of many sessions together."""
        return Batch(self, max_items=max_items, step_tokens=step_tokens, max_tokens=max_tokens,
                     max_context=max_context, kv=kv, gemm=gemm, attention=attention, graphs=graphs,
                     tuning=tuning)

    def prefill_batch(self, sessions, tokens, logits: str = "last") -> list[dict]:
        """Prefill tokens[i] into sessions[i] for every i, in one batch (ragged lengths, sessions
        at any positions). Returns per item {"logits": (n_vocab,) | (n, n_vocab) | None,
        "token": the greedy next token}. The batch executor is kept by the model (made again
        when a call needs more items, tokens or context than it holds)."""
        sessions, tokens = list(sessions), list(tokens)
        if len(sessions) != len(tokens):
            raise InvalidArgumentError(f"sessions: {len(sessions)} sessions for {len(tokens)} token arrays")
        for i, s in enumerate(sessions):
            if not isinstance(s, Session):
                raise InvalidArgumentError(f"sessions[{i}]: expected a pyprefill.Session, got {type(s).__name__}")
        tokens = [token_ids(t, f"tokens[{i}]", n_vocab=self.n_vocab) for i, t in enumerate(tokens)]
        kvs = {s.kv for s in sessions}
        if len(kvs) > 1:
            raise InvalidArgumentError(f"sessions: mixed KV dtypes {sorted(kvs)} in one batch")
        b = self.reserve_batch(max_items=len(sessions), max_tokens=sum(t.size for t in tokens),
                               max_context=max((s.max_tokens for s in sessions), default=0),
                               kv=next(iter(kvs)) if kvs else None)
        return b.prefill([dict(session=s, tokens=t, logits=logits) for s, t in zip(sessions, tokens)])

    def reserve_batch(self, max_items: int = 64, max_tokens: int = 0, max_context: int = 0, kv: str | None = None):
        """The batch executor prefill_batch runs on, made now (or made again) if the one the model
        keeps holds fewer items (at least 64), tokens per call or context, or another KV dtype
        (None: any): a server makes it before its first request, so that no request's time to
        first token pays for it (the prefix cache does, when it is made)."""
        b = getattr(self, "_batch", None)
        items = max(64, int(max_items))
        if (b is None or b.closed or b.max_items < items or b.max_tokens < max_tokens
                or b.max_context < max_context or (kv is not None and b.kv != kv)):
            if b is not None:
                b.close()
            b = self._batch = self.batch(max_items=items, max_tokens=max(max_tokens, batch_max_tokens()),
                                         max_context=max(max_context, DEFAULT_CAPACITY), kv=kv or "f16")
        return b

    def restore(self, state: bytes | np.ndarray, max_tokens: int | None = None, **kw) -> "Session":
        """A fresh session holding a state saved by Session.save()."""
        s = self.session(max_tokens=max_tokens or DEFAULT_CAPACITY, **kw)
        s.restore(state)
        return s

    @property
    def tokenizer(self):
        """The GGUF's own tokenizer (pyprefill.tokenizer.Tokenizer), built once, on first use."""
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_gguf(self.path)
        return self._tokenizer

    def chat(self, messages, system: str | None = None, max_new_tokens: int = 512, *,
             stream=None, **template_kwargs) -> str:
        """One greedy reply to `messages` (the user's text, or [{"role", "content"}, ...]) with
        an optional system message, through the GGUF's chat template; generation stops at the
        end of the turn (<|im_end|>, EOS) or after max_new_tokens. stream(text) receives the
        reply as it grows; template_kwargs reach the template (e.g. enable_thinking=False)."""
        from .chat import chat_messages, generate_reply
        tok = self.tokenizer
        ids = tok.apply_chat_template(chat_messages(messages, system), add_generation_prompt=True,
                                      **template_kwargs)
        with self.session(max_tokens=len(ids) + max_new_tokens) as s:
            return generate_reply(s, ids, tok, max_new_tokens, on_text=stream).text

    def close(self) -> None:
        if self._ptr is None:
            return
        b = getattr(self, "_batch", None)
        if b is not None:
            b.close()
        for s in list(self._sessions):
            s.close()
        super().close()
        if self._own_ctx and self.ctx is not None:
            self.ctx.close()


class Session(_Owner):
    """One sequence on a Model: KV caches, conv windows, recurrent states, position."""

    def __init__(self, model: Model, *, max_tokens: int = DEFAULT_CAPACITY, chunk: int = 0, kv: str = "f16",
                 gemm="default", attention: str = "auto", graphs: bool = True,
                 tuning: dict | None = None, own_executor: bool = True, snapshot_every: int = 0,
                 snapshot_at_end: bool = False, snapshot_slots: int = 0, paged: bool = False,
                 _handle=None):
        """tuning: pyprefill.tuning fields over the model's, resolved with the other options
        into the session's execution plan once, here. own_executor=False: state only, for
        sessions that run in batches (Model.batch / prefill_batch). snapshot_every (a multiple
        of 64), snapshot_at_end, snapshot_slots: keep the recurrent state on the device at those
        positions, for rollback(). paged: the KV rows in pages of the model's pool
        (Model.kv_pool first). Every argument is checked before any device work."""
        if _handle is not None:                   # pf_session_fork's new session
            self.model, self.max_tokens, self.kv, self.paged = model, max_tokens, kv, bool(paged)
            self._adopt(_handle, lib.pf_session_destroy, model)
            model._sessions.add(self)
            return
        max_tokens = int_arg(max_tokens, "max_tokens", 1, INT32_MAX)
        opts = ffi.new("pf_session_options *")
        _check(lib.pf_session_options_init(opts, ffi.sizeof("pf_session_options")))
        opts.max_tokens = max_tokens
        opts.chunk_tokens = int_arg(chunk, "chunk", 0, INT32_MAX)
        opts.kv_dtype, opts.attn_path = _kv_attention_ids(kv, attention)
        opts.gemm_leg = _leg_id(gemm)
        opts.cuda_graphs = 1 if graphs else 0
        _tuning.fill(opts.tuning, tuning)
        opts.own_executor = 1 if own_executor else 0
        opts.snapshot_every = int_arg(snapshot_every, "snapshot_every", 0, INT32_MAX)
        opts.snapshot_at_end = 1 if snapshot_at_end else 0
        opts.snapshot_slots = int_arg(snapshot_slots, "snapshot_slots", 0, INT32_MAX)
        opts.kv_paged = 1 if paged else 0
        _check_model(model)
        self.model, self.max_tokens, self.kv, self.paged = model, max_tokens, kv, bool(paged)
        out = ffi.new("pf_session **")
        _check(lib.pf_session_create(out, model.ptr, opts))
        self._adopt(out[0], lib.pf_session_destroy, model)
        model._sessions.add(self)

    @property
    def position(self) -> int:
        out = ffi.new("int32_t *")
        _check(lib.pf_session_position(self.ptr, out))
        return int(out[0])

    def prefill(self, tokens, logits: str = "last", *, return_token: bool = False):
        """Run `tokens` from the session's position. Returns the logits ((n_vocab,) for "last",
        (n, n_vocab) for "all", None for "none"), and the greedy next token if return_token."""
        if not isinstance(logits, str) or logits not in LOGITS:
            raise InvalidArgumentError(f"logits: {logits!r} is not one of {list(LOGITS)}")
        V = self.model.n_vocab
        ids = token_ids(tokens, "tokens", n_vocab=V)
        out = None
        if logits == "last":
            out = np.empty(V, np.float32)
        elif logits == "all":
            out = np.empty((ids.size, V), np.float32)
        tok = ffi.new("int32_t *")
        lview = as_carray(out, "logits", np.float32, writable=True) if out is not None else ffi.NULL
        _check(lib.pf_session_prefill(self.ptr, ffi.from_buffer("int32_t[]", ids), ids.size,
                                      LOGITS[logits], ffi.cast("float *", lview) if out is not None else ffi.NULL,
                                      0 if out is None else out.size, tok))
        if return_token:
            return out, int(tok[0])
        return out

    def decode(self, token: int) -> np.ndarray:
        return self.prefill([token_id(token, "token", n_vocab=self.model.n_vocab)], "last")

    def generate(self, n: int) -> np.ndarray:
        """Greedy: n tokens, each fed back (needs a prior prefill)."""
        n = int_arg(n, "n", 1, INT32_MAX)
        out = np.empty(n, np.int32)
        _check(lib.pf_session_generate(self.ptr, n, ffi.from_buffer("int32_t[]", out, require_writable=True)))
        return out

    def reset(self) -> None:
        _check(lib.pf_session_reset(self.ptr))

    def save(self) -> bytes:
        size = ffi.new("size_t *")
        _check(lib.pf_session_state_size(self.ptr, size))
        buf = np.empty(size[0], np.uint8)
        _check(lib.pf_session_save(self.ptr, ffi.from_buffer("char[]", buf, require_writable=True), buf.size))
        return buf.tobytes()

    def restore(self, state) -> None:
        arr = np.frombuffer(state, np.uint8) if isinstance(state, (bytes, bytearray, memoryview)) else state
        arr = np.ascontiguousarray(arr, dtype=np.uint8)
        _check(lib.pf_session_restore(self.ptr, ffi.from_buffer("char[]", arr), arr.size))

    def fork(self) -> "Session":
        """A new session with this one's options holding its state (KV rows, conv windows,
        recurrent states, position): both continue as this one would have (pf_session_fork)."""
        out = ffi.new("pf_session **")
        _check(lib.pf_session_fork(out, self.ptr))
        return Session(self.model, max_tokens=self.max_tokens, kv=self.kv, paged=self.paged, _handle=out[0])

    def copy_from(self, other: "Session", pos: int | None = None) -> None:
        """Replaces this session's state by other's (pf_session_copy, on the device); with pos, by
        other's state as it stood at position pos (pf_session_copy_prefix: KV rows [0, pos) and, for
        a qwen35 model, other's snapshot at pos: UnsupportedError naming the nearest otherwise)."""
        if not isinstance(other, Session):
            raise InvalidArgumentError(f"other: expected a Session, got {type(other).__name__}")
        if pos is None:
            _check(lib.pf_session_copy(self.ptr, other.ptr))
            return
        pos = int_arg(pos, "pos", 0, INT32_MAX)
        _check(lib.pf_session_copy_prefix(self.ptr, other.ptr, pos))

    def snapshots(self) -> tuple[list[int], int]:
        """(the positions whose recurrent state is held, ascending; the device bytes of one)."""
        count, each = ffi.new("int32_t *"), ffi.new("size_t *")
        _check(lib.pf_session_snapshots(self.ptr, ffi.NULL, 0, count, each))
        pos = ffi.new("int32_t[]", max(int(count[0]), 1))
        _check(lib.pf_session_snapshots(self.ptr, pos, int(count[0]), count, each))
        return [int(pos[i]) for i in range(int(count[0]))], int(each[0])

    def rollback(self, pos: int) -> None:
        """Back to position pos exactly as if only the first pos tokens had been prefilled (a
        snapshot at pos for a qwen35 model; UnsupportedError naming the nearest otherwise)."""
        pos = int_arg(pos, "pos", 0, INT32_MAX)
        _check(lib.pf_session_rollback(self.ptr, pos))


def batch_items(checked, n_vocab: int):
    """The pf_batch_item array of checked (token ids, Session, logits mode) triples, each item's
    logits array and greedy-token cell fresh: (the array, what must stay alive while the library
    may write through it, per item (logits, token cell))."""
    c = ffi.new("pf_batch_item[]", len(checked))
    keep, results = [], []
    for i, (ids, sess, mode) in enumerate(checked):
        out = {"last": lambda: np.empty(n_vocab, np.float32),
               "all": lambda: np.empty((ids.size, n_vocab), np.float32), "none": lambda: None}[mode]()
        tok = ffi.new("int32_t *", -1)
        c[i].session = sess.ptr
        c[i].tokens = ffi.from_buffer("int32_t[]", ids)
        c[i].n_tokens = ids.size
        c[i].logits_mode = LOGITS[mode]
        c[i].logits = ffi.cast("float *", ffi.from_buffer("float[]", out, require_writable=True)) \
            if out is not None else ffi.NULL
        c[i].logits_len = 0 if out is None else out.size
        c[i].out_token = tok
        keep.append((ids, out, tok))
        results.append((out, tok))
    return c, keep, results


class Batch(_Owner):
    """A chunk executor shared by the items of batches of one model (pf_batch): every
    projection, norm and FFN runs once over the rows of all items; each item's conv window,
    delta rule, KV cache and attention run on its own session's state.

        b = model.batch()
        out = b.prefill([{"session": s1, "tokens": ids1}, {"session": s2, "tokens": ids2, "logits": "all"}])
        out[0]["logits"], out[0]["token"]
    """

    def __init__(self, model: Model, *, max_items: int = 64, step_tokens: int = 0,
                 max_tokens: int = 0, max_context: int = 0, kv: str = "f16", gemm="default",
                 attention: str = "auto", graphs: bool = True, tuning: dict | None = None):
        """Every argument is checked before any device work (the library judges the ranges it
        documents in pf_batch_options: max_items up to 4096, ...)."""
        max_items = int_arg(max_items, "max_items", 1, INT32_MAX)
        step_tokens = int_arg(step_tokens, "step_tokens", 0, INT32_MAX)
        max_tokens = int_arg(max_tokens, "max_tokens", 0, INT32_MAX)
        max_context = int_arg(max_context, "max_context", 0, INT32_MAX)
        kv_id, attn_id = _kv_attention_ids(kv, attention)
        opts = ffi.new("pf_batch_options *")
        _check(lib.pf_batch_options_init(opts, ffi.sizeof("pf_batch_options")))
        opts.max_items, opts.step_tokens, opts.max_tokens = max_items, step_tokens, max_tokens
        opts.max_context, opts.kv_dtype, opts.gemm_leg = max_context, kv_id, _leg_id(gemm)
        opts.attn_path, opts.cuda_graphs = attn_id, 1 if graphs else 0
        _tuning.fill(opts.tuning, tuning)
        _check_model(model)
        out = ffi.new("pf_batch **")
        _check(lib.pf_batch_create(out, model.ptr, opts))
        self._adopt(out[0], lib.pf_batch_destroy, model)
        model._sessions.add(self)                 # closed before the model, like its sessions
        self.model, self.kv = model, kv
        self.max_items = max_items
        self.max_tokens = max_tokens or batch_max_tokens(step_tokens)   # the library's 0
        self.max_context = max_context or DEFAULT_CAPACITY
        self._pending = None

    def plan(self, items) -> None:
        """Checks and plans `items` (dicts: session, tokens, logits = "last" | "all" | "none");
        run() then launches them."""
        if not isinstance(items, (list, tuple)):
            raise InvalidArgumentError(f"items: expected a list of dicts, got {type(items).__name__}")
        if not items:
            raise InvalidArgumentError("items: empty (a batch needs at least one item)")
        V = self.model.n_vocab
        checked = []
        for i, it in enumerate(items):        # every item checked before anything is built
            if not isinstance(it, dict) or "session" not in it or "tokens" not in it:
                raise InvalidArgumentError(f"items[{i}]: expected a dict with 'session' and 'tokens'")
            mode = it.get("logits", "last")
            if not isinstance(mode, str) or mode not in LOGITS:
                raise InvalidArgumentError(f"items[{i}].logits: {mode!r} is not one of {list(LOGITS)}")
            if not isinstance(it["session"], Session):
                raise InvalidArgumentError(f"items[{i}].session: expected a pyprefill.Session, got "
                                           f"{type(it['session']).__name__}")
            checked.append((token_ids(it["tokens"], f"items[{i}].tokens", n_vocab=V), it["session"], mode))
        c, keep, results = batch_items(checked, V)
        _check(lib.pf_batch_plan(self.ptr, c, len(items)))
        self._pending = (c, keep, results)

    def run(self) -> list[dict]:
        """Runs the plan: per item {"logits": ..., "token": greedy next token}."""
        if self._pending is None:
            raise InvalidArgumentError("Batch.run: nothing planned (plan() first; a plan runs once)")
        _, _, results = self._pending
        try:
            _check(lib.pf_batch_run(self.ptr))
        finally:
            self._pending = None
        return [{"logits": out, "token": int(tok[0])} for out, tok in results]

    def prefill(self, items) -> list[dict]:
        self.plan(items)
        return self.run()
