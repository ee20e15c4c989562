// prefix_sim.h — a simulated runtime over the prefix cache (cuda/plan/prefix_tree.h,
// page_pool.h) with a brute-force reference model, shared by the property test
// (tests/cpp/test_prefix_tree.cpp: random operation sequences) and the fuzz target
// (tests/fuzz/fuzz_prefix.cpp: operation sequences decoded from bytes).
//
// The simulated device: every page id of the pool has page_rows rows, every slot a snapshot;
// a row holds the hash of the token prefix that ends at its position (what the KV at that
// position depends on), a snapshot the position and the hash of the prefix before it. Sessions
// prefill as the runtime would: lookup, restore, share the hit's pages, copy-on-write, write their
// own rows (never into a shared page), snapshot where snapshot_plan says, insert, release. Each
// plan's copies are carried out, freed ids are poisoned.
//
// Lineage (the exactness a GPU runtime needs beyond the prefix hashes): a row's bits depend on
// the calls that computed it, so every row and snapshot also carries the id of the history that
// computed it (a history: its parent and the position it computed from; rows below that position
// are its parent's chain). Sessions run as the runtime does: share the hit's pages below the
// resume position R, compute [R, n) under a new history whose parent is the snapshot's (or, for a
// model without recurrent state, the one of the row before R), insert with own_from = R. Checked
// on every lookup: the rows below R of the returned pages are of the snapshot's history chain
// (the re-run rule of prefix_tree.h); after every operation: each session's rows are of its own.
//
// The reference: the prompts inserted, each with how much of it is still cached (dropped nodes
// truncate the prompts through them), the snapshots the tree kept, the live claims. Checked
// after every operation: the tree's and the pools' invariants; every pool count equals the
// references of the tree, its leases and the sessions (nothing freed while referenced, nothing
// leaked); every session's rows are its own prompt's. Checked on every lookup: the match is the
// longest the reference holds, the rows of the returned pages are the prompt's own (never
// another prefix's), the snapshot is the deepest the reference holds and holds that state, the
// claim reported is the reference's. Failed calls with bad input: INVALID_ARGUMENT naming the
// argument, nothing changed. At the end everything is released and every count is zero.
#pragma once

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "plan/page_pool.h"
#include "plan/prefix_tree.h"

namespace prefix_sim {

constexpr uint64_t kEmptyPrefix = 0x6a09e667f3bcc908ull;  // the hash of no tokens
constexpr uint64_t kPoison = 0xdeaddeaddeaddeadull;       // a freed id's rows

inline uint64_t mix(uint64_t h, int32_t t) {  // splitmix64 of the prefix hash and the next token
    uint64_t z = h ^ (uint64_t(uint32_t(t)) * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// A prompt and the hash of each of its prefixes: h[m] = hash of tok[0, m).
struct Prompt {
    std::vector<int32_t> tok;
    std::vector<uint64_t> h{kEmptyPrefix};
    int64_t n() const { return int64_t(tok.size()); }
    void push(int32_t t) {
        tok.push_back(t);
        h.push_back(mix(h.back(), t));
    }
    void resize(int64_t m) {
        tok.resize(size_t(m));
        h.resize(size_t(m) + 1);
    }
};

inline int64_t lcp(const Prompt &a, const Prompt &b, int64_t limit) {
    int64_t i = 0;
    const int64_t m = std::min({a.n(), b.n(), limit});
    while (i < m && a.tok[size_t(i)] == b.tok[size_t(i)]) ++i;
    return i;
}

struct Sim {
    pf::PrefixConfig cfg;
    pf::PagePool pages, slots;
    std::unique_ptr<pf::PrefixTree> tree;
    // the simulated memory
    std::vector<std::vector<uint64_t>> dev;                 // [page][row]
    std::map<int32_t, std::vector<uint64_t>> host;          // host page -> rows
    std::vector<std::pair<int64_t, uint64_t>> dslot;        // [slot] (pos, prefix hash)
    std::map<int32_t, std::pair<int64_t, uint64_t>> hslot;  // host slot -> (pos, prefix hash)
    // the lineage of the same memory: a history id per row and per snapshot (-1: poison)
    std::vector<std::vector<int64_t>> devh;
    std::map<int32_t, std::vector<int64_t>> hosth;
    std::vector<int64_t> dslot_h;
    std::map<int32_t, int64_t> hslot_h;
    std::vector<std::pair<int64_t, int64_t>> hist_tab{{-1, 0}};  // [id] (parent, from); 0: nothing computed
    // the reference
    struct RefPrompt {
        Prompt p;
        int64_t cached = 0;
    };
    std::vector<RefPrompt> ref;
    std::set<std::pair<int64_t, uint64_t>> ref_snaps;          // (pos, prefix hash) of kept snapshots
    std::map<int64_t, std::pair<Prompt, int64_t>> ref_claims;  // ticket -> (prompt, from)
    int64_t ref_lookups = 0, ref_prompt_tokens = 0, ref_matched = 0, ref_rerun = 0;
    // the sessions
    enum State { FREE, FILLING, COMPUTED, DONE };
    struct Session {
        State st = FREE;
        Prompt p;         // its tokens (FILLING: the prompt it prefills)
        int64_t pos = 0;  // rows written (or shared) in its table
        std::vector<int32_t> table;
        int64_t lease = 0, ticket = 0;
        int64_t hist = 0, own_from = 0;  // the history its rows [own_from, pos) were computed by
        pf::PrefixHit hit;
        std::vector<int64_t> plan;
        std::vector<pf::SnapshotRef> snaps;  // slots it holds
    };
    std::vector<Session> sess;
    std::string err;  // the first violation
    int64_t ops = 0;
    // what the operations ran into (for the record: the test prints the sums)
    int64_t n_waits = 0, n_restores = 0, n_ooms = 0, n_inserts = 0, n_bad = 0, n_blocked = 0;

    int64_t P() const { return cfg.page_rows; }

    bool fail(const char *fmt, ...) __attribute__((format(printf, 2, 3))) {
        if (!err.empty()) return false;
        char buf[512];
        va_list ap;
        va_start(ap, fmt);
        std::vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        err = std::string("op ") + std::to_string(ops) + ": " + buf + " (last error: " + pf_last_error() + ")";
        return false;
    }
#define SIM_EXPECT(cond, ...)                  \
    do {                                       \
        if (!(cond)) return fail(__VA_ARGS__); \
    } while (0)
#define SIM_OK(expr)                                                                      \
    do {                                                                                  \
        const pf_status s_ = (expr);                                                      \
        if (s_ != PF_STATUS_OK) return fail("%s returned %s", #expr, pf_status_name(s_)); \
    } while (0)

    // ---- set-up ----------------------------------------------------------------------------
    // A tree over pools of n_pages pages and n_slots slots. A config create() refuses is not an
    // error of the sim: *refused says so (and the message must name a field).
    bool init(const pf::PrefixConfig &c, int32_t n_pages, int32_t n_slots, int n_sessions, bool *refused) {
        cfg = c;
        *refused = false;
        SIM_OK(pages.init(n_pages, "page"));
        SIM_OK(slots.init(n_slots, "snapshot slot"));
        const pf_status s = pf::PrefixTree::create(cfg, &pages, cfg.recurrent ? &slots : nullptr, &tree);
        if (s != PF_STATUS_OK) {
            SIM_EXPECT(s == PF_STATUS_INVALID_ARGUMENT, "create returned %s", pf_status_name(s));
            SIM_EXPECT(std::strstr(pf_last_error(), "cfg.") != nullptr, "a refused config that names no field");
            *refused = true;
            return true;
        }
        dev.assign(size_t(n_pages), std::vector<uint64_t>(size_t(P()), kPoison));
        dslot.assign(size_t(n_slots), {-1, kPoison});
        devh.assign(size_t(n_pages), std::vector<int64_t>(size_t(P()), -1));
        dslot_h.assign(size_t(n_slots), -1);
        sess.assign(size_t(n_sessions), Session{});
        return true;
    }

    // ---- the memory ------------------------------------------------------------------------
    std::vector<uint64_t> &rows(int32_t id, bool on_host) {
        if (!on_host) return dev[size_t(id)];
        auto it = host.find(id);
        if (it == host.end()) it = host.emplace(id, std::vector<uint64_t>(size_t(P()), kPoison)).first;
        return it->second;
    }
    std::vector<int64_t> &hists(int32_t id, bool on_host) {
        if (!on_host) return devh[size_t(id)];
        auto it = hosth.find(id);
        if (it == hosth.end()) it = hosth.emplace(id, std::vector<int64_t>(size_t(P()), -1)).first;
        return it->second;
    }
    int64_t &slot_hist(int32_t id, bool on_host) {
        if (!on_host) return dslot_h[size_t(id)];
        auto it = hslot_h.find(id);
        if (it == hslot_h.end()) it = hslot_h.emplace(id, int64_t(-1)).first;
        return it->second;
    }
    int64_t new_hist(int64_t parent, int64_t from) {
        hist_tab.push_back({parent, from});
        return int64_t(hist_tab.size()) - 1;
    }
    int64_t hist_at(int64_t h, int64_t r) const {  // the member of h's chain that computed row r
        while (h > 0 && r < hist_tab[size_t(h)].second) h = hist_tab[size_t(h)].first;
        return h;
    }
    std::pair<int64_t, uint64_t> &slot_mem(int32_t id, bool on_host) {
        if (!on_host) return dslot[size_t(id)];
        auto it = hslot.find(id);
        if (it == hslot.end()) it = hslot.emplace(id, std::make_pair(int64_t(-1), kPoison)).first;
        return it->second;
    }
    // Poisons every id of `f` that is free at this point.
    void poison(const pf::Released &f) {
        for (int32_t id : f.pages)
            if (!pages.held(id)) {
                std::fill(dev[size_t(id)].begin(), dev[size_t(id)].end(), kPoison);
                std::fill(devh[size_t(id)].begin(), devh[size_t(id)].end(), -1);
            }
        for (int32_t id : f.slots)
            if (!slots.held(id)) dslot[size_t(id)] = {-1, kPoison}, dslot_h[size_t(id)] = -1;
        for (int32_t id : f.host_pages)
            if (!tree->host_page_pool().held(id)) host.erase(id), hosth.erase(id);
        for (int32_t id : f.host_slots)
            if (!tree->host_slot_pool().held(id)) hslot.erase(id), hslot_h.erase(id);
    }
    void poison_pages(const std::vector<int32_t> &ids) {
        pf::Released r;
        r.pages = ids;
        poison(r);
    }

    // ---- the reference ---------------------------------------------------------------------
    int64_t ref_match(const Prompt &p, int64_t limit) const {
        int64_t best = 0;
        for (const RefPrompt &r : ref) best = std::max(best, lcp(p, r.p, std::min(limit, r.cached)));
        return best;
    }
    int64_t ref_resume(const Prompt &p, int64_t match) const {
        if (!cfg.recurrent) return match;
        for (int64_t q = match; q > 0; --q)
            if (ref_snaps.count({q, p.h[size_t(q)]})) return q;
        return 0;
    }
    void ref_insert(const Prompt &p) {
        if (p.n() == 0) return;
        for (RefPrompt &r : ref)
            if (r.p.tok == p.tok) {
                r.cached = p.n();
                return;
            }
        ref.push_back(RefPrompt{p, p.n()});
    }
    // A node [start, end) whose row `start` holds hash `h` left: the prompts through it end at start.
    bool ref_drop(int64_t start, int64_t end, uint64_t h) {
        bool found = false;
        for (RefPrompt &r : ref)
            if (r.cached > start && r.p.h[size_t(start) + 1] == h) {
                SIM_EXPECT(r.cached <= end, "a dropped node [%lld, %lld) had a cached child left", (long long)start,
                           (long long)end);
                r.cached = start, found = true;
            }
        SIM_EXPECT(found, "a dropped node [%lld, %lld) the reference does not hold", (long long)start, (long long)end);
        ref.erase(std::remove_if(ref.begin(), ref.end(), [](const RefPrompt &r) { return r.cached == 0; }), ref.end());
        return true;
    }

    // Everything the tree, the pools and the sessions must agree on after any operation.
    std::vector<int64_t> digest() const {
        const pf::PrefixStats s = tree->stats();
        std::vector<int64_t> d{s.lookups,
                               s.prompt_tokens,
                               s.matched_tokens,
                               s.served_tokens,
                               s.rerun_tokens,
                               s.inserted_tokens,
                               s.nodes,
                               s.device_pages,
                               s.device_snapshots,
                               s.device_bytes,
                               s.host_pages,
                               s.host_snapshots,
                               s.host_bytes,
                               s.leases,
                               s.fills,
                               s.evicted_pages,
                               s.evicted_snapshots,
                               s.offloaded_pages,
                               s.offloaded_snapshots,
                               s.restored_pages,
                               s.restored_snapshots,
                               s.adopted_pages};
        for (int32_t id = 0; id < pages.capacity(); ++id) d.push_back(pages.refs(id));
        for (int32_t id = 0; id < slots.capacity(); ++id) d.push_back(slots.refs(id));
        for (int32_t id = 0; id < tree->host_page_pool().capacity(); ++id) d.push_back(tree->host_page_pool().refs(id));
        for (int32_t id = 0; id < tree->host_slot_pool().capacity(); ++id) d.push_back(tree->host_slot_pool().refs(id));
        return d;
    }

    bool verify() {
        const char *why = "";
        SIM_EXPECT(tree->check(&why), "tree check: %s", why);
        SIM_EXPECT(pages.check(&why) && slots.check(&why), "pool check: %s", why);
        std::vector<int32_t> hp, hs;
        tree->held_refs(&hp, &hs);
        hp.resize(size_t(pages.capacity()), 0);
        hs.resize(size_t(slots.capacity()), 0);
        for (const Session &s : sess) {
            for (int32_t id : s.table) ++hp[size_t(id)];
            for (const pf::SnapshotRef &r : s.snaps) ++hs[size_t(r.slot)];
        }
        for (int32_t id = 0; id < pages.capacity(); ++id)
            SIM_EXPECT(pages.refs(id) == hp[size_t(id)], "page %d: the pool counts %d references, its holders %d", id,
                       pages.refs(id), hp[size_t(id)]);
        for (int32_t id = 0; id < slots.capacity(); ++id)
            SIM_EXPECT(slots.refs(id) == hs[size_t(id)], "slot %d: the pool counts %d references, its holders %d", id,
                       slots.refs(id), hs[size_t(id)]);
        for (size_t i = 0; i < sess.size(); ++i) {
            const Session &s = sess[i];
            if (s.st == FREE) continue;
            SIM_EXPECT(int64_t(s.table.size()) == pf::pages_for(s.pos, P()), "session %zu: table size", i);
            for (int64_t r = 0; r < s.pos; ++r) {
                SIM_EXPECT(dev[size_t(s.table[size_t(r / P())])][size_t(r % P())] == s.p.h[size_t(r) + 1],
                           "session %zu: row %lld is not its prompt's", i, (long long)r);
                SIM_EXPECT(devh[size_t(s.table[size_t(r / P())])][size_t(r % P())] == hist_at(s.hist, r),
                           "session %zu: row %lld is of another history", i, (long long)r);
            }
            for (const pf::SnapshotRef &r : s.snaps)
                SIM_EXPECT(dslot[size_t(r.slot)] == std::make_pair(r.pos, s.p.h[size_t(r.pos)]) &&
                               dslot_h[size_t(r.slot)] == s.hist,
                           "session %zu: its snapshot at %lld changed", i, (long long)r.pos);
        }
        const pf::PrefixStats st = tree->stats();
        SIM_EXPECT(st.lookups == ref_lookups && st.prompt_tokens == ref_prompt_tokens &&
                       st.matched_tokens == ref_matched && st.rerun_tokens == ref_rerun &&
                       st.served_tokens == ref_matched - ref_rerun,
                   "statistics differ from the reference's counts");
        SIM_EXPECT(st.device_bytes == st.device_pages * cfg.page_bytes + st.device_snapshots * cfg.snapshot_bytes &&
                       st.host_bytes == st.host_pages * cfg.page_bytes + st.host_snapshots * cfg.snapshot_bytes &&
                       st.host_bytes <= cfg.host_budget,
                   "byte counts");
        SIM_EXPECT(st.fills == int64_t(ref_claims.size()), "claims: the tree has %lld, the reference %zu",
                   (long long)st.fills, ref_claims.size());
        return true;
    }

    // ---- a lookup's result against the reference -------------------------------------------
    bool verify_hit(const Prompt &p, int64_t max_match, const pf::PrefixHit &hit) {
        const int64_t L = ref_match(p, max_match);
        SIM_EXPECT(hit.match == L, "lookup matched %lld, the reference holds %lld", (long long)hit.match, (long long)L);
        SIM_EXPECT(int64_t(hit.pages.size()) == pf::pages_for(L, P()) && hit.page_host.size() == hit.pages.size(),
                   "lookup returned %zu pages for a match of %lld", hit.pages.size(), (long long)L);
        SIM_EXPECT(hit.partial_last == (L % P() != 0), "partial_last");
        const int64_t R0 = hit.resume;
        for (int64_t r = 0; r < L; ++r) {
            const size_t k = size_t(r / P());
            if (r >= R0 && int64_t(k) < pf::pages_for(R0, P())) continue;  // R's page: valid below R
            SIM_EXPECT(rows(hit.pages[k], hit.page_host[k] != 0)[size_t(r % P())] == p.h[size_t(r) + 1],
                       "lookup: row %lld of page %d (%s) is not this prompt's", (long long)r, hit.pages[k],
                       hit.page_host[k] ? "host" : "device");
        }
        const int64_t R = ref_resume(p, L);
        SIM_EXPECT(hit.resume == R, "lookup resumes at %lld, the reference at %lld", (long long)hit.resume,
                   (long long)R);
        if (cfg.recurrent && R > 0)
            SIM_EXPECT(
                hit.snapshot >= 0 && slot_mem(hit.snapshot, hit.snapshot_host) == std::make_pair(R, p.h[size_t(R)]),
                "lookup: the snapshot at %lld is not this prompt's state", (long long)R);
        else
            SIM_EXPECT(hit.snapshot == -1, "a snapshot without a resume position");
        // the re-run rule: rows below R of the snapshot's history (qwen3-like: of one history)
        const int64_t ha = attach_hist(hit);
        for (int64_t r = 0; r < R; ++r) {
            const size_t k = size_t(r / P());
            SIM_EXPECT(hists(hit.pages[k], hit.page_host[k] != 0)[size_t(r % P())] == hist_at(ha, r),
                       "lookup: row %lld of page %d is of another history than the resume point's "
                       "(resume %lld, match %lld)", (long long)r, hit.pages[k], (long long)R, (long long)hit.match);
        }
        int64_t want_ticket = 0, want_until = 0;
        for (const auto &kv : ref_claims) {
            const int64_t k = lcp(p, kv.second.first, p.n());
            if (k > std::max(L, kv.second.second) && k > want_until) want_ticket = kv.first, want_until = k;
        }
        SIM_EXPECT(hit.wait_ticket == want_ticket && hit.wait_until == want_until,
                   "lookup reports claim %lld until %lld, the reference %lld until %lld", (long long)hit.wait_ticket,
                   (long long)hit.wait_until, (long long)want_ticket, (long long)want_until);
        return true;
    }

    // The history a session attaching `hit` continues: its snapshot's, or (no recurrent state)
    // the one of the row before the resume position; 0 at position 0.
    int64_t attach_hist(const pf::PrefixHit &hit) {
        const int64_t R = hit.resume;
        if (R == 0) return 0;
        if (cfg.recurrent) return hit.snapshot >= 0 ? slot_hist(hit.snapshot, hit.snapshot_host) : -2;
        const size_t k = size_t((R - 1) / P());
        return hists(hit.pages[k], hit.page_host[k] != 0)[size_t((R - 1) % P())];
    }

    bool do_lookup(const Prompt &p, int64_t max_match, pf::PrefixHit *hit) {
        SIM_OK(tree->lookup(p.tok.data(), p.n(), max_match, hit));
        ref_lookups += 1;
        ref_prompt_tokens += p.n();
        ref_matched += hit->match;
        ref_rerun += hit->match - hit->resume;
        return verify_hit(p, max_match, *hit);
    }

    bool release_lease(int64_t lease) {
        pf::Released f;
        SIM_OK(tree->lease_release(lease, &f));
        poison(f);
        return true;
    }

    // ---- plans ------------------------------------------------------------------------------
    bool apply_evict(const pf::EvictPlan &plan, int64_t goal) {
        size_t pm = 0, sm = 0;
        auto page_moves_to = [&](size_t upto) {
            for (; pm < upto && pm < plan.page_moves.size(); ++pm) {
                rows(plan.page_moves[pm].to, true) = dev[size_t(plan.page_moves[pm].from)];
                hists(plan.page_moves[pm].to, true) = devh[size_t(plan.page_moves[pm].from)];
            }
        };
        auto slot_moves_to = [&](size_t upto) {
            for (; sm < upto && sm < plan.slot_moves.size(); ++sm) {
                slot_mem(plan.slot_moves[sm].to, true) = dslot[size_t(plan.slot_moves[sm].from)];
                slot_hist(plan.slot_moves[sm].to, true) = dslot_h[size_t(plan.slot_moves[sm].from)];
            }
        };
        for (const pf::DroppedNode &d : plan.dropped_nodes) {
            page_moves_to(d.moves_before);
            SIM_EXPECT(d.first_page >= 0 && d.end > d.start, "a dropped node without pages");
            if (!ref_drop(d.start, d.end, rows(d.first_page, d.host)[size_t(d.start % P())])) return false;
        }
        for (const pf::DroppedSnapshot &d : plan.dropped_snapshots) {
            slot_moves_to(d.moves_before);
            const auto content = slot_mem(d.slot, d.host);
            SIM_EXPECT(content.first == d.pos && ref_snaps.erase(content) == 1,
                       "a dropped snapshot at %lld the reference does not hold", (long long)d.pos);
        }
        page_moves_to(plan.page_moves.size());
        slot_moves_to(plan.slot_moves.size());
        poison(plan.freed);
        const pf::PrefixStats st = tree->stats();
        if (plan.fits) {
            SIM_EXPECT(st.device_bytes <= goal, "evict fits but holds %lld bytes > %lld", (long long)st.device_bytes,
                       (long long)goal);
        } else {
            SIM_EXPECT(st.leases > 0 && st.device_bytes > goal, "evict did not fit without a pinned entry");
        }
        return true;
    }

    bool evict(int64_t target) {
        pf::EvictPlan plan;
        SIM_OK(tree->evict(target, &plan));
        return apply_evict(plan, std::min(target, cfg.device_budget));
    }

    bool apply_restore(const pf::RestorePlan &plan) {
        for (const pf::Move &m : plan.page_moves)
            dev[size_t(m.to)] = rows(m.from, true), devh[size_t(m.to)] = hists(m.from, true);
        for (const pf::Move &m : plan.slot_moves)
            dslot[size_t(m.to)] = slot_mem(m.from, true), dslot_h[size_t(m.to)] = slot_hist(m.from, true);
        poison(plan.freed);
        return true;
    }

    // OUT_OF_MEMORY must change nothing; then the sim evicts everything unpinned and tries again.
    template <class Call>
    bool retry_oom(Call &&call, bool *ok) {
        for (int attempt = 0; attempt < 2; ++attempt) {
            const std::vector<int64_t> before = digest();
            const pf_status s = call();
            if (s == PF_STATUS_OK) return *ok = true;
            SIM_EXPECT(s == PF_STATUS_OUT_OF_MEMORY, "a call returned %s", pf_status_name(s));
            SIM_EXPECT(digest() == before, "OUT_OF_MEMORY changed the state");
            ++n_ooms;
            if (attempt == 0 && !evict(0)) return false;
        }
        *ok = false;
        return true;
    }

    // ---- the operations ---------------------------------------------------------------------
    // A request for prompt p in session s (dropped first if busy): lookup (max_match n - 1 when
    // the request wants the last logits), restore, claim, share the hit's pages below the resume
    // position R (the runtime re-runs [R, match) into pages of its own: the re-run rule).
    bool start(size_t s, const Prompt &p, bool want_logits) {
        if (sess[s].st != FREE && !drop(s)) return false;
        Session &S = sess[s];
        const int64_t maxm = want_logits && p.n() > 0 ? p.n() - 1 : p.n();
        pf::PrefixHit hit;
        if (!do_lookup(p, maxm, &hit)) return false;
        if (hit.wait_ticket != 0) {  // computed by another request now: this one waits
            ++n_waits;
            int64_t t = 0;
            const std::vector<int64_t> before = digest();
            SIM_EXPECT(tree->fill_begin(p.tok.data(), p.n(), hit.match, &t) == PF_STATUS_INVALID_ARGUMENT,
                       "a claim over positions another claim holds was accepted");
            SIM_EXPECT(digest() == before, "a refused claim changed the state");
            return release_lease(hit.lease);
        }
        if (hit.needs_restore()) {
            pf::RestorePlan rp;
            bool ok = false;
            if (!retry_oom([&] { return tree->restore(&hit, &rp); }, &ok)) return false;
            if (!ok) return release_lease(hit.lease);  // no room even after evicting: give up
            ++n_restores;
            apply_restore(rp);
            SIM_EXPECT(!hit.needs_restore(), "a restored hit still names host ids");
            if (!verify_hit_restored(p, hit)) return false;
        }
        int64_t ticket = 0;
        SIM_OK(tree->fill_begin(p.tok.data(), p.n(), hit.match, &ticket));
        ref_claims[ticket] = {p, hit.match};
        const int64_t R = hit.resume;
        const std::vector<int32_t> below(hit.pages.begin(), hit.pages.begin() + pf::pages_for(R, P()));
        SIM_OK(pf::page_table_share(pages, below, R, P(), &S.table));
        S.st = FILLING;
        S.p = p;
        S.pos = R;
        S.hist = new_hist(attach_hist(hit), R);
        S.own_from = R;
        S.lease = hit.lease;
        S.ticket = ticket;
        S.hit = hit;
        S.snaps.clear();
        SIM_OK(tree->snapshot_plan(p.tok.data(), p.n(), hit.resume, &S.plan));
        return verify_plan(p, hit.resume, S.plan);
    }

    bool verify_hit_restored(const Prompt &p, const pf::PrefixHit &hit) {
        for (int64_t r = 0; r < hit.match; ++r)
            SIM_EXPECT((r >= hit.resume && r / P() < pf::pages_for(hit.resume, P())) ||
                           dev[size_t(hit.pages[size_t(r / P())])][size_t(r % P())] == p.h[size_t(r) + 1],
                       "restore: row %lld is not this prompt's", (long long)r);
        if (hit.snapshot >= 0)
            SIM_EXPECT(dslot[size_t(hit.snapshot)] == std::make_pair(hit.resume, p.h[size_t(hit.resume)]),
                       "restore: the snapshot is not this prompt's state");
        return true;
    }

    bool verify_plan(const Prompt &p, int64_t resume, const std::vector<int64_t> &plan) {
        if (!cfg.recurrent) {
            SIM_EXPECT(plan.empty(), "snapshots planned for a model without recurrent state");
            return true;
        }
        // Past where the prompt leaves the tree (at or below it a state would be of the
        // session's re-run rows: the re-run rule): the end, and multiples of N that keep the
        // snapshots from the resume point on at most N apart, none of them needless. As
        // properties: q0 = resume < q1 < ... < qk = n, q1 > from, each qi (i < k) a multiple of
        // N; every gap qi+1 - qi <= N except the first, which may be longer only when q1 is
        // the first multiple of N past `from` (or n, none being below n); and no qi (0 < i < k)
        // could go: qi+1 - qi-1 > N.
        const int64_t from = std::max(resume, ref_match(p, p.n())), n = p.n(), N = cfg.snapshot_every;
        if (from >= n) {
            SIM_EXPECT(plan.empty(), "snapshot plan: %zu positions for a prompt the tree holds to its end",
                       plan.size());
            return true;
        }
        SIM_EXPECT(!plan.empty() && plan.back() == n, "snapshot plan: it does not end at n=%lld", (long long)n);
        std::vector<int64_t> q{resume};
        q.insert(q.end(), plan.begin(), plan.end());
        for (size_t i = 1; i < q.size(); ++i) {
            SIM_EXPECT(q[i] > q[i - 1] && q[i] > from, "snapshot plan: position %lld out of order or at or below %lld",
                       (long long)q[i], (long long)from);
            if (i + 1 < q.size())
                SIM_EXPECT(N > 0 && q[i] % N == 0, "snapshot plan: %lld is neither a multiple of N nor n",
                           (long long)q[i]);
            const int64_t first_multiple = N > 0 ? std::min((from / N + 1) * N, n) : n;
            SIM_EXPECT(q[i] - q[i - 1] <= N || (i == 1 && q[1] == first_multiple),
                       "snapshot plan: a gap of %lld > N=%lld before %lld (resume %lld, from %lld)",
                       (long long)(q[i] - q[i - 1]), (long long)N, (long long)q[i], (long long)resume,
                       (long long)from);
            if (i + 1 < q.size())
                SIM_EXPECT(q[i + 1] - q[i - 1] > N, "snapshot plan: %lld is needless (%lld and %lld within N)",
                           (long long)q[i], (long long)q[i - 1], (long long)q[i + 1]);
        }
        return true;
    }

    // A copy-on-write: rows [0, rows) of page src into page dst (the rest poisoned).
    void copy_rows(int32_t src, int32_t dst, int64_t rows) {
        std::vector<uint64_t> &d = dev[size_t(dst)];
        std::fill(d.begin(), d.end(), kPoison);
        std::copy(dev[size_t(src)].begin(), dev[size_t(src)].begin() + rows, d.begin());
        std::vector<int64_t> &dh = devh[size_t(dst)];
        std::fill(dh.begin(), dh.end(), -1);
        std::copy(devh[size_t(src)].begin(), devh[size_t(src)].begin() + rows, dh.begin());
    }

    // Writes rows [from, to) of session S's prompt into its table (its own pages only).
    bool write_rows(Session &S, int64_t from, int64_t to) {
        for (int64_t r = from; r < to; ++r) {
            const int32_t id = S.table[size_t(r / P())];
            SIM_EXPECT(pages.refs(id) == 1, "a write into page %d, which has %d holders", id, pages.refs(id));
            dev[size_t(id)][size_t(r % P())] = S.p.h[size_t(r) + 1];
            devh[size_t(id)][size_t(r % P())] = S.hist;
        }
        return true;
    }

    // Appends rows [S.pos, to) with the copy-on-write page_table_append asks for.
    bool append(Session &S, int64_t to, bool *ok) {
        pf::PageCopy cow;
        std::vector<int64_t> fresh;
        const std::vector<int32_t> before = S.table;
        const int64_t pos = S.pos;
        if (!retry_oom([&] { return pf::page_table_append(pages, &S.table, pos, to - pos, P(), &cow, &fresh); }, ok))
            return false;
        if (!*ok) {
            SIM_EXPECT(S.table == before, "a failed append changed the table");
            return true;
        }
        if (cow.index >= 0) {
            SIM_EXPECT(cow.index == pos / P() && cow.rows == pos % P() && cow.src == before[size_t(cow.index)],
                       "page_table_append: a copy-on-write of the wrong page");
            copy_rows(cow.src, cow.dst, cow.rows);
        }
        for (int64_t k : fresh) {
            std::fill(dev[size_t(S.table[size_t(k)])].begin(), dev[size_t(S.table[size_t(k)])].end(), kPoison);
            std::fill(devh[size_t(S.table[size_t(k)])].begin(), devh[size_t(S.table[size_t(k)])].end(), -1);
        }
        if (!write_rows(S, pos, to)) return false;
        S.pos = to;
        return true;
    }

    // The prefill proper: rows [match, n) and the planned snapshots.
    // `every_page`: the session also snapshots every page boundary, as a runtime that re-ran
    // from the zero state could, whatever the plan says (the tree has some of them already:
    // insert keeps only what it lacks, and replaces host-tier ones).
    bool compute(size_t s, bool every_page = false) {
        Session &S = sess[s];
        if (S.st != FILLING) return true;
        bool ok = false;
        if (!append(S, S.p.n(), &ok)) return false;
        if (!ok) return drop(s);
        std::vector<int64_t> at = S.plan;
        if (every_page && cfg.recurrent) {  // (the states it computed: past its resume position)
            for (int64_t q = (S.own_from / P() + 1) * P(); q <= S.p.n(); q += P()) at.push_back(q);
            std::sort(at.begin(), at.end());
            at.erase(std::unique(at.begin(), at.end()), at.end());
        }
        for (int64_t q : at) {
            int32_t slot = -1;
            if (slots.alloc(&slot) != PF_STATUS_OK) continue;  // fewer snapshots: still correct
            dslot[size_t(slot)] = {q, S.p.h[size_t(q)]};
            dslot_h[size_t(slot)] = S.hist;
            S.snaps.push_back(pf::SnapshotRef{q, slot});
        }
        S.st = COMPUTED;
        return true;
    }

    bool do_insert(Session &S, bool with_snaps) {
        const int64_t n = S.pos;
        const int64_t d = ref_match(S.p, n);
        pf::InsertResult ir;
        const std::vector<pf::SnapshotRef> snaps = with_snaps ? S.snaps : std::vector<pf::SnapshotRef>{};
        SIM_OK(tree->insert(S.p.tok.data(), n, S.table.data(), int64_t(pf::pages_for(n, P())), snaps.data(),
                            int64_t(snaps.size()), &ir, S.own_from));
        if (ir.blocked) {  // a host node on the path holds rows it re-ran: nothing added
            SIM_EXPECT(S.own_from < d && ir.new_tokens == 0 && ir.snapshots_kept.empty(), "a blocked insert");
            ++n_blocked;
            return true;
        }
        SIM_EXPECT(ir.new_tokens == n - d, "insert added %lld tokens, the reference lacked %lld",
                   (long long)ir.new_tokens, (long long)(n - d));
        for (const pf::SnapshotRef &k : ir.snapshots_kept) {
            const bool given = std::any_of(snaps.begin(), snaps.end(), [&](const pf::SnapshotRef &r) {
                return r.pos == k.pos && r.slot == k.slot;
            });
            SIM_EXPECT(given, "insert kept a snapshot it was not given");
            ref_snaps.insert({k.pos, S.p.h[size_t(k.pos)]});
        }
        for (const pf::SnapshotRef &r : snaps) {
            // the re-run rule: a state at or below where the prompt left the tree is not kept
            // when the session re-ran rows there
            const bool rerun = S.own_from < d && r.pos <= d;
            const bool kept = std::any_of(ir.snapshots_kept.begin(), ir.snapshots_kept.end(),
                                          [&](const pf::SnapshotRef &k) { return k.slot == r.slot; });
            SIM_EXPECT(!(rerun && kept), "insert kept a snapshot of re-run rows at %lld", (long long)r.pos);
            SIM_EXPECT(rerun || ref_snaps.count({r.pos, S.p.h[size_t(r.pos)]}) == 1,
                       "insert left out a snapshot the tree lacked");
        }
        Prompt q = S.p;
        q.resize(n);
        ref_insert(q);
        ++n_inserts;
        poison(ir.freed);
        return true;
    }

    // Insert, then let go of the lease, the claim and the session's snapshot slots.
    bool finish(size_t s) {
        Session &S = sess[s];
        if (S.st != COMPUTED) return true;
        if (!do_insert(S, true)) return false;
        if (!release_session_snaps(S)) return false;
        if (!release_lease(S.lease)) return false;
        SIM_OK(tree->fill_end(S.ticket));
        ref_claims.erase(S.ticket);
        S.lease = S.ticket = 0;
        S.st = DONE;
        return true;
    }

    bool release_session_snaps(Session &S) {
        pf::Released f;
        for (const pf::SnapshotRef &r : S.snaps) {
            bool freed = false;
            SIM_OK(slots.unref(r.slot, &freed));
            if (freed) f.slots.push_back(r.slot);
        }
        S.snaps.clear();
        poison(f);
        return true;
    }

    bool drop(size_t s) {
        Session &S = sess[s];
        if (S.lease && !release_lease(S.lease)) return false;
        if (S.ticket) {
            SIM_OK(tree->fill_end(S.ticket));
            ref_claims.erase(S.ticket);
        }
        if (!release_session_snaps(S)) return false;
        std::vector<int32_t> freed;
        SIM_OK(pf::page_table_release(pages, &S.table, &freed));
        poison_pages(freed);
        S = Session{};
        return true;
    }

    bool fork(size_t s, size_t t) {
        if (s == t || sess[s].st != DONE) return true;
        if (sess[t].st != FREE && !drop(t)) return false;
        Session &S = sess[s], &T = sess[t];
        pf::PageCopy cow;
        std::vector<int32_t> table;
        bool ok = false;
        if (!retry_oom([&] { return pf::page_table_fork(pages, S.table, S.pos, P(), &table, &cow); }, &ok))
            return false;
        if (!ok) return true;
        SIM_EXPECT((cow.index >= 0) == (S.pos % P() != 0), "fork: a copy-on-write iff the last page is partial");
        for (int64_t k = 0; k < int64_t(table.size()); ++k)
            SIM_EXPECT(k == cow.index ? table[size_t(k)] != S.table[size_t(k)] : table[size_t(k)] == S.table[size_t(k)],
                       "fork: a full page not shared, or the partial one shared");
        if (cow.index >= 0) {
            SIM_EXPECT(cow.src == S.table[size_t(cow.index)] && cow.rows == S.pos % P(), "fork: the wrong copy");
            copy_rows(cow.src, cow.dst, cow.rows);
        }
        T.st = DONE;
        T.p = S.p;
        T.pos = S.pos;
        T.table = std::move(table);
        T.own_from = S.own_from;  // both continue from here on histories of their own
        T.hist = new_hist(S.hist, S.pos);
        S.hist = new_hist(S.hist, S.pos);
        return true;
    }

    bool rollback(size_t s, int64_t to) {
        Session &S = sess[s];
        if (S.st != DONE) return true;
        to = std::max<int64_t>(0, std::min(to, S.pos));
        std::vector<int32_t> dropped, freed;
        SIM_OK(pf::page_table_rollback(pages, &S.table, S.pos, to, P(), &dropped, &freed));
        SIM_EXPECT(int64_t(S.table.size()) == pf::pages_for(to, P()), "rollback kept %zu pages", S.table.size());
        poison_pages(freed);
        if (to % P() != 0 && pages.refs(S.table.back()) == 1) {  // rows past `to` are no one's now
            std::vector<uint64_t> &last = dev[size_t(S.table.back())];
            std::fill(last.begin() + to % P(), last.end(), kPoison);
            std::vector<int64_t> &lh = devh[size_t(S.table.back())];
            std::fill(lh.begin() + to % P(), lh.end(), -1);
        }
        S.pos = to;
        S.p.resize(to);
        S.hist = new_hist(S.hist, to);  // what it computes next: a history of its own
        S.own_from = std::min(S.own_from, to);
        return true;
    }

    bool extend(size_t s, const std::vector<int32_t> &more) {
        Session &S = sess[s];
        if (S.st != DONE) return true;
        for (int32_t t : more) S.p.push(t);
        bool ok = false;
        if (!append(S, S.p.n(), &ok)) return false;
        if (!ok) S.p.resize(S.pos);
        return true;
    }

    bool insert_done(size_t s) {
        Session &S = sess[s];
        if (S.st != DONE) return true;
        return do_insert(S, false);
    }

    bool lookup_only(const Prompt &p, bool want_logits, bool restore) {
        pf::PrefixHit hit;
        if (!do_lookup(p, want_logits && p.n() > 0 ? p.n() - 1 : p.n(), &hit)) return false;
        if (restore && hit.needs_restore()) {
            pf::RestorePlan rp;
            const std::vector<int64_t> before = digest();
            const pf_status st = tree->restore(&hit, &rp);
            if (st == PF_STATUS_OK) {
                apply_restore(rp);
                if (!verify_hit_restored(p, hit)) return false;
            } else {
                SIM_EXPECT(st == PF_STATUS_OUT_OF_MEMORY && digest() == before, "a failed restore: %s",
                           pf_status_name(st));
            }
        }
        return release_lease(hit.lease);
    }

    // ---- bad input: INVALID_ARGUMENT naming the argument, nothing changed --------------------
    bool expect_refused(pf_status s, const char *what, const std::vector<int64_t> &before) {
        ++n_bad;
        SIM_EXPECT(s == PF_STATUS_INVALID_ARGUMENT, "bad input (%s) returned %s", what, pf_status_name(s));
        SIM_EXPECT(std::strstr(pf_last_error(), what) != nullptr, "the message does not name %s", what);
        SIM_EXPECT(digest() == before, "bad input (%s) changed the state", what);
        return true;
    }

    bool bad(int kind, const Prompt &p, uint32_t r) {
        const std::vector<int64_t> before = digest();
        pf::PrefixHit hit;
        std::vector<int32_t> tok = p.tok;
        if (tok.empty()) tok.push_back(0);
        const int64_t n = int64_t(tok.size());
        std::vector<int32_t> table(size_t(pf::pages_for(n, P())), -1);
        switch (kind % 14) {
        case 0:
            tok[r % tok.size()] = r & 1 ? int32_t(cfg.n_vocab) : -1 - int32_t(r % 5);
            return expect_refused(tree->lookup(tok.data(), n, n, &hit), "tokens[", before);
        case 1: return expect_refused(tree->lookup(tok.data(), -1 - int64_t(r % 3), 0, &hit), "n=", before);
        case 2: return expect_refused(tree->lookup(tok.data(), n, n + 1 + r % 3, &hit), "max_match", before);
        case 3: {
            pf::InsertResult ir;
            return expect_refused(tree->insert(tok.data(), n, table.data(), int64_t(table.size()) + 1, nullptr, 0, &ir),
                                  "n_pages", before);
        }
        case 4: {
            pf::InsertResult ir;  // ids the pool does not hold
            for (int32_t &id : table) id = (r & 1) ? -1 : pages.capacity() + int32_t(r % 7);
            return expect_refused(tree->insert(tok.data(), n, table.data(), int64_t(table.size()), nullptr, 0, &ir),
                                  "pages[", before);
        }
        case 5: {  // snapshots out of (0, n] (or any snapshot for a model without state)
            for (const Session &S : sess)
                if (S.st == DONE && S.pos > 0) {
                    pf::InsertResult ir;
                    const pf::SnapshotRef sn{(r & 1) ? S.pos + 1 : 0, 0};
                    return expect_refused(
                        tree->insert(S.p.tok.data(), S.pos, S.table.data(), int64_t(S.table.size()), &sn, 1, &ir),
                        cfg.recurrent ? "snaps[0].pos" : "n_snaps", before);
                }
            return true;
        }
        case 6: {
            pf::InsertResult ir;
            tok[r % tok.size()] = int32_t(cfg.n_vocab) + int32_t(r % 3);
            return expect_refused(tree->insert(tok.data(), n, table.data(), int64_t(table.size()), nullptr, 0, &ir),
                                  "tokens[", before);
        }
        case 7: return expect_refused(tree->lease_release(1000000 + r, nullptr), "lease=", before);
        case 8: return expect_refused(tree->fill_end(1000000 + r), "ticket=", before);
        case 9: {
            pf::EvictPlan plan;
            return expect_refused(tree->evict(-1 - int64_t(r % 100), &plan), "target_bytes", before);
        }
        case 10: {
            pf::RestorePlan rp;
            hit.lease = 1000000 + r;
            return expect_refused(tree->restore(&hit, &rp), "hit->lease", before);
        }
        case 11: {
            int64_t t = 0;
            if (!ref_claims.empty()) {  // the same positions as a live claim
                const auto &c = ref_claims.begin()->second;
                if (c.second < c.first.n())
                    return expect_refused(tree->fill_begin(c.first.tok.data(), c.first.n(), c.second, &t),
                                          "being prefilled", before);
            }
            return expect_refused(tree->fill_begin(tok.data(), n, n + 1, &t), "from=", before);
        }
        case 12: {
            std::vector<int64_t> out;
            return expect_refused(tree->snapshot_plan(tok.data(), n, n + 1 + r % 5, &out), "resume=", before);
        }
        default: {
            pf::EvictPlan plan;
            if (tree->stats().leases > 0) return expect_refused(tree->clear(&plan), "leases are live", before);
            pf::PageCopy cow;
            std::vector<int64_t> fresh;  // a table whose size does not match its position
            return expect_refused(pf::page_table_append(pages, &table, n + P(), 1, P(), &cow, &fresh), "page table",
                                  before);
        }
        }
    }

    // ---- the end: everything released, every count back to zero -----------------------------
    bool finish_all() {
        for (size_t s = 0; s < sess.size(); ++s)
            if (!drop(s)) return false;
        if (!verify()) return false;
        pf::EvictPlan plan;
        SIM_OK(tree->clear(&plan));
        if (!apply_evict(plan, 0)) return false;
        SIM_EXPECT(ref.empty() && ref_snaps.empty(), "clear left %zu prompts and %zu snapshots in the reference",
                   ref.size(), ref_snaps.size());
        const pf::PrefixStats st = tree->stats();
        SIM_EXPECT(st.nodes == 0 && st.device_bytes == 0 && st.host_bytes == 0, "clear left entries");
        SIM_EXPECT(pages.n_used() == 0 && slots.n_used() == 0 && tree->host_page_pool().n_used() == 0 &&
                       tree->host_slot_pool().n_used() == 0,
                   "ids still held after everything was released: %d pages, %d slots", pages.n_used(), slots.n_used());
        for (const auto &kv : ref_claims) SIM_OK(tree->fill_end(kv.first));
        ref_claims.clear();
        return verify();
    }
#undef SIM_EXPECT
#undef SIM_OK
};

}  // namespace prefix_sim
