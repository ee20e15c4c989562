"""A prefix cache over sessions (issue 39, first form): every prompt prefix already computed is
reused, exactly, without the KV rows being paged yet.

    cache = model.prefix_cache(max_tokens=8192, snapshot_every=1024, max_entries=32)
    logits = cache.prefill(session, prompt_ids)            # as session.prefill(prompt_ids) from 0
    logits, token = cache.prefill(session, ids, return_token=True)
    session.generate(16)                                    # the session continues on its own
    cache.stats                                             # tokens served from the cache, ...

How: the cache keeps "entries", sessions of its own that ran earlier prompts, each holding its
prompt's KV rows and snapshots of the recurrent state every `snapshot_every` positions, at the end
of its prompt and where it diverged from the entry it was made from. A request finds the entry
and snapshot that let it resume furthest: the deepest snapshot at or below the longest prefix the
entry shares with the prompt (a qwen3 model, which has no recurrent state, resumes at the shared
prefix itself). A new entry takes that prefix on the device (Session.copy_from(entry, pos):
pf_session_copy_prefix), runs the prompt's other tokens (a first call to the point of divergence,
so that a snapshot is kept there, then the rest) through the model's batch executor, and the
caller's session takes the result (pf_session_copy). The caller's session is never shared: it
continues (decodes) on its own. Entries are dropped least recently used first beyond
`max_entries` or `budget_bytes`.

Exactness: the logits are bitwise those of a cold session that ran the same prompt in the same
calls (the resumed prefix, then the rest; the split at the divergence point), within the leg's
tolerance of one cold call.

paged=True (Model.kv_pool first; the callers' sessions paged too): the entries and the sessions
hold their KV rows in pages of the model's pool, and every copy_from above shares the prefix's
pages instead of copying rows (an attach of 8192 tokens at a snapshot: 0.041 ms on qwen35-4b
against 0.148 ms copying, session 42), so entries that share a prefix hold it once. Their
device bytes are then their recurrent states and snapshots (entry_bytes, what budget_bytes
counts) plus the pool's pages, which the pool bounds: a run the pool cannot hold drops the least
recently used entries (their pages come back) and runs again. The tree form is
pyprefill.prefix_tree (Model.prefix_tree, the C API's pf_prefix_cache): each distinct prefix held
once in pages, snapshots in slots of its own, a host tier.
"""
from __future__ import annotations

import bisect
import dataclasses

import numpy as np

from ._checks import int_arg, token_ids
from .errors import InvalidArgumentError

LOGITS = ("last", "none")


@dataclasses.dataclass
class _Entry:
    session: object
    tokens: np.ndarray
    snapshots: list[int]
    logits: np.ndarray | None   # the last token's logits (an exact repeat returns them)
    token: int                  # the greedy token after the prompt
    tick: int = 0


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the longest common prefix of two token arrays."""
    n = min(a.size, b.size)
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixCache:
    """See the module's text. One per model; not thread-safe."""

    def __init__(self, model, *, max_tokens: int, snapshot_every: int = 1024, max_entries: int = 32,
                 budget_bytes: int | None = None, kv: str = "f16", gemm="default", paged: bool = False):
        self.model = model
        self.paged = bool(paged)
        if self.paged and model.kv_pool_info()["pages"] == 0:
            raise InvalidArgumentError("paged: the model has no KV pool (make one with Model.kv_pool first)")
        self.max_tokens = int_arg(max_tokens, "max_tokens", 1, 2**31 - 1)
        self.snapshot_every = int_arg(snapshot_every, "snapshot_every", 64, 2**31 - 1)
        if self.snapshot_every % 64:
            raise InvalidArgumentError(f"snapshot_every={snapshot_every} must be a positive multiple of 64")
        self.max_entries = int_arg(max_entries, "max_entries", 1, 2**20)
        self.budget_bytes = None if budget_bytes is None else int_arg(budget_bytes, "budget_bytes", 1, 2**62)
        if kv not in ("f16", "f32"):
            raise InvalidArgumentError(f"kv: {kv!r} is not one of ['f16', 'f32']")
        self.kv, self.gemm = kv, gemm
        info = model.info
        self._recurrent = info["n_layer"] > info["n_attn_layers"]   # qwen35: snapshots needed to resume
        self._entries: list[_Entry] = []
        self._tick = 0
        self._entry_bytes = self.entry_bytes()
        if self.budget_bytes is not None and self.budget_bytes < self._entry_bytes:
            raise InvalidArgumentError(f"budget_bytes={self.budget_bytes} holds no entry: one takes "
                                       f"{self._entry_bytes} bytes (max_tokens={self.max_tokens}, "
                                       f"snapshot_every={self.snapshot_every})")
        self.stats = {"requests": 0, "prompt_tokens": 0, "served_tokens": 0, "rerun_tokens": 0,
                      "prefilled_tokens": 0, "hits": 0, "entries": 0, "evicted": 0, "device_bytes": 0}
        # the batch executor the entries run on, made here rather than in a first request's time
        model.reserve_batch(max_context=self.max_tokens, kv=kv)

    # -- the entries -------------------------------------------------------------------------
    def entry_bytes(self) -> int:
        """The device bytes of one entry: the KV rows of max_tokens positions (none when paged:
        they are the pool's pages), and for a qwen35 model its recurrent state and snapshot slots
        (the sizes pf_session_snapshots reports)."""
        info = self.model.info
        kv = 0 if self.paged else self.max_tokens * info["n_attn_layers"] * 2 * info["n_head_kv"] * \
            info["head_dim"] * (2 if self.kv == "f16" else 4)
        if not self._recurrent:
            return kv
        conv_dim = 2 * info["ssm_hk"] * info["ssm_dk"] + info["ssm_hv"] * info["ssm_dv"]
        snap = 4 * (info["n_layer"] - info["n_attn_layers"]) * (
            (info["conv_kernel"] - 1) * conv_dim + info["ssm_hv"] * info["ssm_dk"] * info["ssm_dv"])
        return kv + (self._slots + 1) * snap

    @property
    def _slots(self) -> int:
        # snapshots every snapshot_every positions and at each call's end (the divergence point and
        # the prompt's end): slots for all of them
        return self.max_tokens // self.snapshot_every + 3

    def _new_session(self):
        """An entry's session (entry_bytes on the device): its snapshots as above, no executor of
        its own (the model's batch runs it)."""
        return self.model.session(max_tokens=self.max_tokens, kv=self.kv, gemm=self.gemm, own_executor=False,
                                  snapshot_every=self.snapshot_every if self._recurrent else 0,
                                  snapshot_at_end=self._recurrent,
                                  snapshot_slots=self._slots if self._recurrent else 0, paged=self.paged)

    def _resume(self, e: _Entry, prompt: np.ndarray) -> tuple[int, int]:
        """(the prefix e shares with prompt, the position a request resumes from with e)."""
        m = _shared(e.tokens, prompt)
        if not self._recurrent:   # no recurrent state: any position
            return m, m
        return m, max((p for p in e.snapshots if p <= m), default=0)

    def _evict(self, keep: list, room: int) -> None:
        """Drops least recently used entries (never those in `keep`) until `room` more fit."""
        def over() -> bool:
            n = len(self._entries) + room
            return n > self.max_entries or (self.budget_bytes is not None
                                            and n * self._entry_bytes > self.budget_bytes)
        while over() and self._evict_one(keep):
            pass

    def _evict_one(self, keep: list) -> bool:
        """Drops the least recently used entry not in `keep`; False when there is none."""
        victims = [e for e in self._entries if not any(e is k for k in keep)]
        if not victims:
            return False
        v = min(victims, key=lambda e: e.tick)
        self._entries.remove(v)
        v.session.close()
        self.stats["evicted"] += 1
        return True

    # -- the calls ---------------------------------------------------------------------------
    def prefill(self, session, tokens, logits: str = "last", *, return_token: bool = False):
        """Prefill `tokens` into `session` from position 0, reusing what the cache holds: the
        session ends at position len(tokens) exactly as after session.reset(); session.prefill(
        tokens, logits). Returns the last token's logits (None for "none"), and the greedy next
        token if return_token. The session must be of this cache's model, KV dtype and hold
        len(tokens) positions."""
        out = self.prefill_batch([session], [tokens], logits)[0]
        return (out["logits"], out["token"]) if return_token else out["logits"]

    def prefill_batch(self, sessions, tokens, logits: str = "last") -> list[dict]:
        """prefill() for many requests at once: sessions[i] takes tokens[i], the tokens every
        request needs run in one batch (model.prefill_batch); a prefix that several of them share
        beyond what the cache holds is computed once, first, as an entry of its own, and they all
        resume from it (so is a prompt that comes twice). Returns per request {"logits", "token"}.
        Every argument is checked before anything runs; the sessions must be distinct."""
        from .model import Session
        sessions, tokens = list(sessions), list(tokens)
        if len(sessions) != len(tokens) or not sessions:
            raise InvalidArgumentError(f"sessions: {len(sessions)} sessions for {len(tokens)} token arrays "
                                       "(at least one)")
        if not isinstance(logits, str) or logits not in LOGITS:
            raise InvalidArgumentError(f"logits: {logits!r} is not one of {list(LOGITS)}")
        prompts = []
        for i, (session, t) in enumerate(zip(sessions, tokens)):
            what = "session" if len(sessions) == 1 else f"sessions[{i}]"
            if not isinstance(session, Session) or session.model is not self.model:
                raise InvalidArgumentError(f"{what}: expected a Session of the cache's model")
            if session.kv != self.kv:
                raise InvalidArgumentError(f"{what}: kv={session.kv!r}, the cache's entries {self.kv!r}")
            if session.paged != self.paged:
                raise InvalidArgumentError(f"{what}: paged={session.paged}, the cache's entries "
                                           f"paged={self.paged} (copies need one kind)")
            p = token_ids(t, "tokens" if len(sessions) == 1 else f"tokens[{i}]", n_vocab=self.model.n_vocab)
            if p.size == 0:
                raise InvalidArgumentError(("tokens" if len(sessions) == 1 else f"tokens[{i}]") + ": empty")
            if p.size > min(self.max_tokens, session.max_tokens):
                raise InvalidArgumentError(f"tokens: {p.size} tokens, the cache's entries hold {self.max_tokens} "
                                           f"and the session {session.max_tokens} positions")
            prompts.append(p)
        if len({id(s) for s in sessions}) != len(sessions):
            raise InvalidArgumentError("sessions: one session twice in a batch")
        self._tick += 1
        # what several requests share beyond what the cache holds: computed once, first
        while len(prompts) > 1 and (common := self._shared_in_batch(prompts)) is not None:
            self._serve([common], request=False)
        served = self._serve(prompts)
        st = self.stats
        st["requests"] += len(prompts)
        st["prompt_tokens"] += sum(int(p.size) for p in prompts)
        out = []
        for session, (entry, last, token) in zip(sessions, served):
            session.copy_from(entry.session)
            out.append({"logits": last.copy() if logits == "last" else None, "token": token})
        # back within the limits (a batch holds an entry per prompt until its sessions took them)
        self._evict(keep=[], room=0)
        st["entries"] = len(self._entries)
        st["device_bytes"] = len(self._entries) * self._entry_bytes
        return out

    def _plan(self, prompt: np.ndarray) -> tuple[_Entry | None, int, int]:
        """(the entry to resume from, the prefix it shares with prompt, the resume position): the
        deepest resume, the most recently used entry among equals. The entries are tried in the
        order of the most each could give (_bound: one token compared per snapshot), and the
        search stops where that is less than the resume found: the previous turn of a
        conversation is found first and the other entries are not compared whole (with 256
        entries of 4k tokens the compare of every one took 1.4 ms of the 16 ms a chat request
        took, session 43)."""
        bounds = [(self._bound(e, prompt), e.tick, i) for i, e in enumerate(self._entries)]
        bounds.sort(key=lambda b: (-b[0], -b[1], b[2]))
        best, shared, resume = None, 0, 0
        for bound, _, i in bounds:
            if best is not None and bound < resume:
                break
            e = self._entries[i]
            m, r = self._resume(e, prompt)
            if best is None or r > resume or (r == resume and e.tick > best.tick):
                best, shared, resume = e, m, r
        return best, shared, resume

    def _bound(self, e: _Entry, prompt: np.ndarray) -> int:
        """At least the position a prompt resumes from with e (_resume's second value), found
        without comparing whole prefixes: e's length and the prompt's, and for a recurrent model
        the deepest snapshot s within both whose token s - 1 is the prompt's (a prefix of s tokens
        shared needs that token equal)."""
        m = min(int(prompt.size), int(e.tokens.size))
        if not self._recurrent:
            return m
        for k in range(bisect.bisect_right(e.snapshots, m) - 1, -1, -1):
            s = e.snapshots[k]
            if s == 0 or e.tokens[s - 1] == prompt[s - 1]:
                return s
        return 0

    def _shared_in_batch(self, prompts) -> np.ndarray | None:
        """The longest prefix two of the prompts share beyond where both would resume (at least
        64 tokens more: worth a call of its own), or None."""
        resumes = [self._plan(p)[2] for p in prompts]
        best, length = None, 0
        for i in range(len(prompts)):
            for j in range(i + 1, len(prompts)):
                m = _shared(prompts[i], prompts[j])
                if m > length and m >= max(resumes[i], resumes[j]) + 64:
                    best, length = prompts[i][:m], m
        if best is not None and any(e.tokens.size == length and _shared(e.tokens, best) == length
                                    for e in self._entries):
            return None   # held already (a snapshot short of it): nothing more to share
        return best

    def _serve(self, prompts, request: bool = True) -> list[tuple[_Entry, np.ndarray, int]]:
        """Every prompt into an entry (new ones run in one batch, an exact repeat reuses its
        entry): per prompt (the entry, its last logits, its greedy token). request=False: a prefix
        several requests share (its tokens count as prefilled, not as served or a hit)."""
        st = self.stats
        plans, keep = [], []
        for p in prompts:
            best, shared, resume = self._plan(p)
            if best is not None:
                keep.append(best)
            if best is not None and resume == p.size and best.tokens.size == p.size:
                plans.append(("hit", best, p.size, p.size))   # the same prompt again
                continue
            if resume == p.size:   # held up to the prompt's end but not its last logits: the last
                # token runs again, from the snapshot before it (qwen35) or from right before it
                resume = (max((q for q in best.snapshots if q < p.size), default=0) if self._recurrent
                          else p.size - 1)
            plans.append(("run", best, shared, resume))
        runs = [i for i, pl in enumerate(plans) if pl[0] == "run"]
        self._evict(keep=keep, room=len(runs))
        news = {}
        try:
            for i in runs:
                news[i] = self._new_session()
                _, best, _, resume = plans[i]
                if resume:
                    best.tick = self._tick
                    news[i].copy_from(best.session, pos=resume)
            # to each divergence point first (a snapshot is kept there: a request that branches
            # at the same token later resumes there), then the rest: two batches at most
            cuts = {}
            for i in runs:
                _, best, shared, resume = plans[i]
                cuts[i] = shared if resume < shared < prompts[i].size else resume
            first = [i for i in runs if cuts[i] > plans[i][3]]
            # the entries this call still reads (its hits'); those runs resume from were copied
            hits = [pl[1] for pl in plans if pl[0] == "hit"]
            if first:
                self._run([news[i] for i in first], [prompts[i][plans[i][3]:cuts[i]] for i in first], "none",
                          hits)
            outs = (self._run([news[i] for i in runs], [prompts[i][cuts[i]:] for i in runs], "last", hits)
                    if runs else [])
        except BaseException:
            for n in news.values():
                n.close()
            raise
        result, made = [], {}
        for i, o in zip(runs, outs):
            made[i] = _Entry(news[i], prompts[i].copy(), news[i].snapshots()[0], o["logits"], int(o["token"]),
                             self._tick)
            self._entries.append(made[i])
        for i, (kind, best, shared, resume) in enumerate(plans):
            if kind == "hit":
                best.tick = self._tick
                if request:
                    st["served_tokens"] += int(prompts[i].size)
                    st["hits"] += 1
                result.append((best, best.logits, best.token))
                continue
            e = made[i]
            st["rerun_tokens"] += max(0, min(shared, prompts[i].size) - resume)
            st["prefilled_tokens"] += int(prompts[i].size) - resume
            if request:
                st["served_tokens"] += resume
                st["hits"] += resume > 0
            result.append((e, e.logits, e.token))
        return result

    def _run(self, sessions, tokens, logits: str, keep: list) -> list[dict]:
        """model.prefill_batch; paged, while the pool is short (OutOfMemoryError: the run changed
        nothing), the least recently used entry not in `keep` goes (its pages come back; what a
        run resumed from is its own by then, shared or copied) and the run goes again."""
        from .errors import OutOfMemoryError
        while True:
            try:
                return self.model.prefill_batch(sessions, tokens, logits=logits)
            except OutOfMemoryError:
                if not (self.paged and self._evict_one(keep)):
                    raise

    def clear(self) -> None:
        """Drops every entry."""
        for e in self._entries:
            e.session.close()
        self._entries.clear()
        self.stats["entries"] = 0
        self.stats["device_bytes"] = 0

    close = clear

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.clear()
