"""The prefix cache in the library (pf_prefix_cache, issue 39): a radix tree over token ids whose
nodes hold KV pages of the model's pool and, for a qwen35 model, snapshots of the recurrent state.

    model.kv_pool(pages)                                     # the pages it shares with sessions
    tree = model.prefix_tree(device_bytes=8 << 30, host_bytes=16 << 30)
    with model.session(max_tokens=8192, paged=True) as s:
        logits = tree.prefill(s, prompt_ids)                 # as s.reset(); s.prefill(prompt_ids)
        s.generate(16)                                       # s continues on its own
    tree.stats                                               # tokens served, re-run, bytes per tier

A prompt attaches the pages of the longest prefix the tree holds below the deepest snapshot in
it (R; no KV rows copied), its recurrent state restored from that snapshot, and runs the rest in
the session, its steps ending where the tree keeps snapshots (at each prompt's end and at the
multiples of snapshot_every that keep them at most that far apart); then the prompt's new pages
and snapshots go into the tree (with the session's own versions of the pages it re-ran, so that
every prefix's pages and state are of one chain of calls). What no longer fits device_bytes moves to the host tier (pinned, when
host_bytes > 0) or is dropped, least recently used first; a later hit copies it back. The logits
are bitwise those of a cold session of the same options that ran the same calls.

Where pyprefill.prefix_cache (entries that are whole sessions, found by comparing prompts, in
Python) keeps a session per prompt, this keeps each distinct prefix once, in pages.
"""
from __future__ import annotations

import numpy as np

from ._checks import INT32_MAX, int_arg, token_ids
from ._errors import _check
from ._ffi import ffi, lib
from .core import _Owner, as_carray
from .errors import InvalidArgumentError
from .model import LOGITS

_STATS = ("requests", "prompt_tokens", "matched_tokens", "served_tokens", "rerun_tokens", "prefilled_tokens",
          "nodes", "device_pages", "device_snapshots", "device_bytes", "host_pages", "host_snapshots",
          "host_bytes", "evicted_pages", "evicted_snapshots", "offloaded_pages", "offloaded_snapshots",
          "restored_pages", "restored_snapshots", "snapshots_skipped", "pinned_bytes")
_LOGITS = {k: LOGITS[k] for k in ("none", "last")}   # no "all": the cache keeps no rows' logits


class PrefixTree(_Owner):
    """See the module's text. Made by Model.prefix_tree; closed with its model at the latest."""

    def __init__(self, model, *, snapshot_every: int | None = None, snapshot_slots: int | None = None,
                 device_bytes: int = 0, host_bytes: int = 0):
        """snapshot_every (a multiple of 64) and snapshot_slots: None = the library's defaults
        (1024 and 64 for qwen35; 0 for a model without recurrent state). device_bytes: what the
        tree may hold on the device after each call (0 = half the KV pool's bytes and half the
        slots'); host_bytes: the pinned host tier (0 = none)."""
        opts = ffi.new("pf_prefix_cache_options *")
        _check(lib.pf_prefix_cache_options_init(opts, ffi.sizeof("pf_prefix_cache_options")))
        if snapshot_every is not None:
            opts.snapshot_every = int_arg(snapshot_every, "snapshot_every", 0, INT32_MAX)
        if snapshot_slots is not None:
            opts.snapshot_slots = int_arg(snapshot_slots, "snapshot_slots", 0, INT32_MAX)
        opts.device_bytes = int_arg(device_bytes, "device_bytes", 0, 2**62)
        opts.host_bytes = int_arg(host_bytes, "host_bytes", 0, 2**62)
        out = ffi.new("pf_prefix_cache **")
        _check(lib.pf_prefix_cache_create(out, model.ptr, opts))
        self.model = model
        self._adopt(out[0], lib.pf_prefix_cache_destroy, model)
        model._sessions.add(self)   # closed with the model, before it

    def prefill(self, session, tokens, logits: str = "last", *, return_token: bool = False):
        """Prefill `tokens` into `session` (paged, of this model) from position 0 through the
        tree. Returns the last token's logits (None for "none"), and the greedy next token if
        return_token."""
        from .model import Session
        if not isinstance(session, Session):
            raise InvalidArgumentError(f"session: expected a pyprefill.Session, got {type(session).__name__}")
        if not isinstance(logits, str) or logits not in _LOGITS:
            raise InvalidArgumentError(f"logits: {logits!r} is not one of {list(_LOGITS)}")
        V = self.model.n_vocab
        ids = token_ids(tokens, "tokens", n_vocab=V)
        out = np.empty(V, np.float32) if logits == "last" else None
        tok = ffi.new("int32_t *")
        lview = ffi.cast("float *", as_carray(out, "logits", np.float32, writable=True)) if out is not None \
            else ffi.NULL
        _check(lib.pf_prefix_cache_prefill(self.ptr, session.ptr, ffi.from_buffer("int32_t[]", ids), ids.size,
                                           _LOGITS[logits], lview, 0 if out is None else out.size, tok))
        return (out, int(tok[0])) if return_token else out

    def prefill_batch(self, sessions, tokens, logits: str = "last") -> list[dict]:
        """prefill() for many prompts at once (pf_prefix_cache_prefill_batch on the model's batch
        executor, Model.reserve_batch): sessions[i] (paged, distinct) takes tokens[i] from
        position 0; a prefix two prompts share beyond what the tree holds is computed once, first.
        Returns per prompt {"logits", "token"}. Every argument is checked before anything runs."""
        from .model import Session, batch_items
        sessions, tokens = list(sessions), list(tokens)
        if len(sessions) != len(tokens) or not sessions:
            raise InvalidArgumentError(f"sessions: {len(sessions)} sessions for {len(tokens)} token arrays "
                                       "(at least one)")
        if not isinstance(logits, str) or logits not in _LOGITS:
            raise InvalidArgumentError(f"logits: {logits!r} is not one of {list(_LOGITS)}")
        V = self.model.n_vocab
        ids = []
        for i, (s, t) in enumerate(zip(sessions, tokens)):
            if not isinstance(s, Session):
                raise InvalidArgumentError(f"sessions[{i}]: expected a pyprefill.Session, got {type(s).__name__}")
            ids.append(token_ids(t, f"tokens[{i}]", n_vocab=V))
        b = self.model.reserve_batch(max_items=len(sessions), max_context=max(s.max_tokens for s in sessions),
                                     kv=sessions[0].kv)
        items, _keep, results = batch_items([(t, s, logits) for s, t in zip(sessions, ids)], V)
        _check(lib.pf_prefix_cache_prefill_batch(self.ptr, b.ptr, items, len(sessions)))
        return [{"logits": out, "token": int(tok[0])} for out, tok in results]

    @property
    def stats(self) -> dict:
        """Requests and their tokens (matched in the tree, served without computing, re-run for
        the recurrent state, prefilled), the tree's nodes, pages, snapshots and bytes per tier,
        what was evicted, offloaded and restored, snapshots skipped, the pinned bytes."""
        s = ffi.new("pf_prefix_cache_stats *")
        _check(lib.pf_prefix_cache_stats_get(self.ptr, s, ffi.sizeof("pf_prefix_cache_stats")))
        return {k: int(getattr(s, k)) for k in _STATS}

    def evict(self, target_bytes: int) -> None:
        """Moves (to the host tier where it has room) or drops least recently used pages and
        snapshots until the device bytes are at most target_bytes."""
        _check(lib.pf_prefix_cache_evict(self.ptr, int_arg(target_bytes, "target_bytes", 0, 2**62)))

    def clear(self) -> None:
        """Drops every cached prefix."""
        _check(lib.pf_prefix_cache_clear(self.ptr))
