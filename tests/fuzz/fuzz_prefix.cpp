// fuzz_prefix.cpp — libFuzzer target: the prefix cache's host bookkeeping (issue 39:
// cuda/plan/prefix_tree.cpp, page_pool.cpp) driven by a sequence of operations decoded from the
// bytes — requests that look up, restore, claim, prefill (copy-on-write), snapshot and insert;
// session forks, rollbacks and extensions; evictions to a target; lookups alone; bad input — through
// the simulated runtime of prefix_sim.h, with its brute-force reference. Contract checked beyond
// "no crash, no leak, no UB" (abort on any violation): every lookup returns the longest prefix
// the reference holds and the pages of exactly those tokens (the rows of the simulated device
// say whose prefix they hold), the deepest snapshot and its state, the live claim over its
// positions; no page or slot is freed while referenced (every pool count equals the references
// of the tree, its leases and the sessions, after every operation); every invariant of
// PrefixTree::check; an evict plan fits its target unless a lease pins the rest; bad input is
// INVALID_ARGUMENT naming the argument with nothing changed; at the end, with every session and
// lease released and the tree cleared, every count is back to zero.
//
// Input layout (zeros past the end; scripts/make_fuzz_seeds.py writes seeds in it):
//   0 flags: 1 recurrent, 2 page_rows 128 (else 64), 4|8 snapshot_every 64 * ((flags >> 2) & 3)
//     (recurrent only), 16 a host tier, 32 a broken config (byte 7 says which field)
//   1 n_vocab = 2 + byte % 48        2 device budget = 1000 (1 + byte % 48) bytes (a page: 1000)
//   3 host budget = 500 (2 + byte)   4 device pages = 4 + byte % 200   5 slots = 2 + byte % 60
//   6 snapshot bytes = 500 (1 + byte % 3)   7 the broken field (flag 32): byte % 6
//   then operations, one byte each (op % 16, session = (op >> 4) % 5) and their arguments:
//   0-3 start (prompt: 3 bytes, see prompt())  4 compute (op bit 7: a snapshot at every page
//   boundary too)  5 finish  6 drop  7 fork (1: target)
//   8 rollback (1: positions back)  9 extend (2: count, token seed)  10 insert the session
//   11 evict (1: target = byte * 250 bytes)  12 lookup alone (prompt; op bit 7: restore)
//   13 bad input (1: kind, 1: seed, prompt)  14 evict to the budget  15 nothing
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define PF_FUZZ_TARGET "fuzz_prefix"
#include "fuzz_common.h"
#include "prefix_sim.h"

namespace {

constexpr int kSessions = 5;
constexpr int kMaxOps = 400;

// A prompt from 3 bytes: a, the earlier prompt it continues (a % (history + 1); the last value:
// none) and whether the request wants the last logits (a & 128); b, how much of that one it keeps
// (255: all; 254: all but one; else b * 4, moved to a page boundary - 1 or + 0 when b % 3 is 0 or
// 1); c, how many new tokens follow (c * 3 page_rows / 256, from a generator seeded by c).
prefix_sim::Prompt prompt(Reader &r, const prefix_sim::Sim &sim, std::vector<prefix_sim::Prompt> &history,
                          bool *want_logits) {
    const uint8_t a = r.u8(), b = r.u8(), c = r.u8();
    *want_logits = a & 128;
    prefix_sim::Prompt q;
    const size_t pick = size_t(a & 127) % (history.size() + 1);
    if (pick < history.size()) {
        q = history[pick];
        int64_t keep = b == 255 ? q.n() : b == 254 ? q.n() - 1 : int64_t(b) * 4;
        if (b < 254 && b % 3 != 2) keep = (keep / sim.P()) * sim.P() + (b % 3 == 0 ? -1 : 0);
        q.resize(std::max<int64_t>(0, std::min(keep, q.n())));
    }
    const int64_t extra = int64_t(c) * 3 * sim.P() / 256;
    uint64_t g = 0x9e3779b97f4a7c15ull * (c + 1);
    for (int64_t i = 0; i < extra && q.n() < 6 * sim.P(); ++i) {
        g = g * 6364136223846793005ull + 1442695040888963407ull;
        q.push(int32_t((g >> 33) % uint64_t(sim.cfg.n_vocab)));
    }
    history.push_back(q);
    if (history.size() > 32) history.erase(history.begin());
    return q;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Reader r{data, size};
    const uint8_t flags = r.u8();
    pf::PrefixConfig c;
    c.recurrent = flags & 1;
    c.page_rows = flags & 2 ? 128 : 64;
    c.snapshot_every = c.recurrent ? 64 * ((flags >> 2) & 3) : 0;
    c.n_vocab = 2 + r.u8() % 48;
    c.page_bytes = 1000;
    c.device_budget = 1000 * (1 + r.u8() % 48);
    const int64_t host = 500 * (2 + int64_t(r.u8()));
    c.host_budget = flags & 16 ? host : 0;
    const int32_t n_pages = 4 + r.u8() % 200, n_slots = 2 + r.u8() % 60;
    const uint8_t snap = r.u8();
    c.snapshot_bytes = c.recurrent ? 500 * (1 + snap % 3) : 0;
    if (c.recurrent && c.snapshot_bytes > c.device_budget) c.device_budget = c.snapshot_bytes;
    if (c.host_budget && c.host_budget < std::max(c.page_bytes, c.snapshot_bytes)) c.host_budget = 0;
    const uint8_t broken_field = r.u8();
    if (flags & 32) switch (broken_field % 6) {  // create must refuse it, naming the field
        case 0: c.device_budget = c.page_bytes - 1; break;
        case 1: c.host_budget = 1 + broken_field; break;
        case 2: c.page_rows = 64 + 1 + broken_field % 63; break;
        case 3: c.snapshot_every = c.recurrent ? 32 : 64; break;
        case 4: c.n_vocab = -int64_t(broken_field % 3); break;
        default: c.snapshot_bytes = c.recurrent ? 0 : 500; break;
        }
    prefix_sim::Sim sim;
    bool refused = false;
    if (!sim.init(c, n_pages, n_slots, kSessions, &refused)) broken(sim.err.c_str());
    if (refused != bool(flags & 32)) broken(refused ? "a valid config refused" : "a broken config accepted");
    if (refused) return 0;
    std::vector<prefix_sim::Prompt> history;
    bool ok = true;
    for (int i = 0; i < kMaxOps && r.more() && ok; ++i) {
        sim.ops = i;
        const uint8_t op = r.u8();
        const size_t s = size_t((op >> 4) % kSessions);
        bool want = false;
        switch (op % 16) {
        case 0:
        case 1:
        case 2:
        case 3: {
            const prefix_sim::Prompt p = prompt(r, sim, history, &want);
            ok = sim.start(s, p, want);
            break;
        }
        case 4: ok = sim.compute(s, op & 128); break;
        case 5: ok = sim.finish(s); break;
        case 6: ok = sim.drop(s); break;
        case 7: ok = sim.fork(s, size_t(r.u8() % kSessions)); break;
        case 8: ok = sim.rollback(s, sim.sess[s].pos - int64_t(r.u8())); break;
        case 9: {
            const uint8_t n = r.u8(), seed = r.u8();
            std::vector<int32_t> more(n % 130);
            for (size_t k = 0; k < more.size(); ++k) more[k] = int32_t((seed * 31 + k * 7) % uint64_t(c.n_vocab));
            ok = sim.extend(s, more);
            break;
        }
        case 10: ok = sim.insert_done(s); break;
        case 11: ok = sim.evict(int64_t(r.u8()) * 250); break;
        case 12: {
            const prefix_sim::Prompt p = prompt(r, sim, history, &want);
            ok = sim.lookup_only(p, want, op & 128);
            break;
        }
        case 13: {
            const uint8_t kind = r.u8(), seed = r.u8();
            const prefix_sim::Prompt p = prompt(r, sim, history, &want);
            ok = sim.bad(kind, p, seed);
            break;
        }
        case 14: ok = sim.evict(c.device_budget); break;
        default: break;
        }
        if (ok) ok = sim.verify();
    }
    if (ok) ok = sim.finish_all();
    if (!ok) broken(sim.err.c_str());
    return 0;
}
