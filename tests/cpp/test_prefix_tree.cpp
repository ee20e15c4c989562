// test_prefix_tree.cpp — the prefix cache's host bookkeeping (cuda/plan/prefix_tree.cpp,
// page_pool.cpp), host only. Hand-written cases with the page ids spelled out: divergence at
// positions 0, 1, 63, 64, 65 and inside a page, a prompt that is a prefix of another (both
// orders), the same prompt twice, snapshots and re-runs, in-flight claims, eviction under a
// tight budget (least recent first), the host tier round trip, the page-table helpers (fork,
// rollback, append with copy-on-write), bad input. Then the property test: random operation
// sequences through the simulated runtime of tests/fuzz/prefix_sim.h (the same one the fuzz
// target drives) against its brute-force reference, in many configurations.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../fuzz/prefix_sim.h"
#include "expect.h"
#include "base/error.h"
#include "plan/page_pool.h"
#include "plan/prefix_tree.h"

namespace {

#define EXPECT_OK(expr) EXPECT((expr) == PF_STATUS_OK, "%s", pf_last_error())

using pf::PagePool;
using pf::PrefixConfig;
using pf::PrefixHit;
using pf::PrefixTree;

constexpr int64_t P = 64;

PrefixConfig config(bool recurrent, int64_t every = 0, int64_t budget_pages = 1000, int64_t host_pages = 0) {
    PrefixConfig c;
    c.page_rows = P;
    c.snapshot_every = every;
    c.recurrent = recurrent;
    c.page_bytes = 100;
    c.snapshot_bytes = recurrent ? 100 : 0;
    c.device_budget = budget_pages * 100;
    c.host_budget = host_pages * 100;
    c.n_vocab = 1000;
    return c;
}

std::vector<int32_t> seq(int64_t n, int32_t salt) {  // distinct-looking tokens
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 7 + salt * 131 + 3) % 997);
    return t;
}

// A session that prefilled `tok` after a lookup (or none): its page table, built the way the
// runtime does it (share the hit, then append with copy-on-write).
struct Sess {
    std::vector<int32_t> table;
    std::vector<int32_t> tok;
};
Sess prefill(PagePool &pool, const std::vector<int32_t> &tok, const PrefixHit *hit) {
    Sess s;
    s.tok = tok;
    int64_t pos = 0;
    if (hit) {
        EXPECT_OK(pf::page_table_share(pool, hit->pages, hit->match, P, &s.table));
        pos = hit->match;
    }
    pf::PageCopy cow;
    std::vector<int64_t> fresh;
    EXPECT_OK(pf::page_table_append(pool, &s.table, pos, int64_t(tok.size()) - pos, P, &cow, &fresh));
    return s;
}

void insert(PrefixTree &t, const Sess &s, pf::InsertResult *ir = nullptr,
            const std::vector<pf::SnapshotRef> &snaps = {}) {
    pf::InsertResult local;
    EXPECT_OK(t.insert(s.tok.data(), int64_t(s.tok.size()), s.table.data(), int64_t(s.table.size()), snaps.data(),
                       int64_t(snaps.size()), ir ? ir : &local));
}

void release(PagePool &pool, Sess &s) { EXPECT_OK(pf::page_table_release(pool, &s.table, nullptr)); }

bool check(const PrefixTree &t) {
    const char *why = "";
    const bool ok = t.check(&why);
    EXPECT(ok, "check: %s", why);
    return ok;
}

// Two prompts that share their first d tokens: the second one's session shares the first one's
// full pages below floor(d / P) and copies the page holding d; the tree ends up with both and a
// branch node at d.
void test_divergence(int64_t d) {
    PagePool pool;
    EXPECT_OK(pool.init(64, "page"));
    std::unique_ptr<PrefixTree> t;
    EXPECT_OK(PrefixTree::create(config(false), &pool, nullptr, &t));
    const std::vector<int32_t> a = seq(200, 1);
    std::vector<int32_t> b(a.begin(), a.begin() + d);
    for (int32_t x : seq(150 - d, 2)) b.push_back(x);
    b[size_t(d)] = (a[size_t(d)] + 1) % 997;  // differs at d
    Sess sa = prefill(pool, a, nullptr);
    insert(*t, sa);
    // held_prefix: the match a lookup of all of b would find, without a lease or a count
    const int64_t lookups = t->stats().lookups;
    EXPECT(t->held_prefix(b.data(), int64_t(b.size())) == d && t->held_prefix(a.data(), 150) == 150 &&
               t->stats().lookups == lookups && t->stats().leases == 0,
           "d=%lld: held_prefix", (long long)d);
    PrefixHit hb;
    EXPECT_OK(t->lookup(b.data(), int64_t(b.size()), int64_t(b.size()), &hb));
    EXPECT(hb.match == d, "d=%lld: match %lld", (long long)d, (long long)hb.match);
    EXPECT(int64_t(hb.pages.size()) == pf::pages_for(d, P) && hb.partial_last == (d % P != 0), "d=%lld: %zu pages",
           (long long)d, hb.pages.size());
    for (size_t k = 0; k < hb.pages.size(); ++k)
        EXPECT(hb.pages[k] == sa.table[k], "d=%lld: page %zu", (long long)d, k);
    Sess sb = prefill(pool, b, &hb);
    for (int64_t k = 0; k < int64_t(sb.table.size()); ++k) {
        const bool shared = k < d / P;  // full pages below the branch point
        EXPECT((sb.table[size_t(k)] == sa.table[size_t(k)]) == shared, "d=%lld: page %lld shared=%d", (long long)d,
               (long long)k, int(shared));
    }
    pf::InsertResult ir;
    insert(*t, sb, &ir);
    EXPECT(ir.new_tokens == 150 - d, "d=%lld: new tokens %lld", (long long)d, (long long)ir.new_tokens);
    EXPECT_OK(t->lease_release(hb.lease, nullptr));
    EXPECT(t->stats().nodes == (d == 0 ? 2 : 3), "d=%lld: %lld nodes", (long long)d, (long long)t->stats().nodes);
    // Each prompt gets its own pages back; a lookup of exactly the shared prefix gets the first
    // prompt's version of the page holding d (the branch node took it at the split).
    for (int which = 0; which < 3; ++which) {
        const Sess &s = which == 1 ? sb : sa;
        const int64_t n = which == 2 ? d : int64_t(s.tok.size());
        PrefixHit h;
        EXPECT_OK(t->lookup(s.tok.data(), n, n, &h));
        EXPECT(h.match == n, "d=%lld: prompt %d matched %lld of %lld", (long long)d, which, (long long)h.match,
               (long long)n);
        for (size_t k = 0; k < h.pages.size(); ++k)
            EXPECT(h.pages[k] == s.table[k], "d=%lld: prompt %d page %zu", (long long)d, which, k);
        EXPECT_OK(t->lease_release(h.lease, nullptr));
    }
    check(*t);
    release(pool, sa);
    release(pool, sb);
    pf::EvictPlan plan;
    EXPECT_OK(t->clear(&plan));
    EXPECT(pool.n_used() == 0, "d=%lld: %d pages held after clear", (long long)d, pool.n_used());
}

void test_prefix_of_another() {
    for (int order = 0; order < 2; ++order) {
        PagePool pool;
        EXPECT_OK(pool.init(64, "page"));
        std::unique_ptr<PrefixTree> t;
        EXPECT_OK(PrefixTree::create(config(false), &pool, nullptr, &t));
        const std::vector<int32_t> a = seq(200, 3);
        const std::vector<int32_t> c(a.begin(), a.begin() + 100);
        Sess sa = prefill(pool, a, nullptr), sc = prefill(pool, c, nullptr);
        const int32_t c0 = sc.table[0];
        if (order == 0) {  // the long one first: the short one adds nothing, splits nothing
            insert(*t, sa);
            pf::InsertResult ir;
            insert(*t, sc, &ir);
            EXPECT(ir.new_tokens == 0 && t->stats().nodes == 1, "a prefix added %lld tokens, %lld nodes",
                   (long long)ir.new_tokens, (long long)t->stats().nodes);
        } else {  // the short one first: the long one extends it, and the short one's partial
                  // last page gives way to the long one's version
            insert(*t, sc);
            release(pool, sc);
            pf::InsertResult ir;
            insert(*t, sa, &ir);
            EXPECT(ir.new_tokens == 100 && t->stats().nodes == 2, "extension: %lld tokens, %lld nodes",
                   (long long)ir.new_tokens, (long long)t->stats().nodes);
            EXPECT(ir.freed.pages.size() == 1, "the duplicate partial page was not released (%zu)",
                   ir.freed.pages.size());
        }
        PrefixHit h;
        EXPECT_OK(t->lookup(c.data(), 100, 100, &h));
        // The tree keeps the pages it had for positions it had (the first insert's), and the
        // page holding 100 is the long prompt's version either way.
        EXPECT(h.match == 100 && h.partial_last && h.pages.size() == 2 &&
                   h.pages[0] == (order == 0 ? sa.table[0] : c0) && h.pages[1] == sa.table[1],
               "order %d: the prefix's pages", order);
        EXPECT_OK(t->lease_release(h.lease, nullptr));
        check(*t);
        release(pool, sa);
        if (order == 0) release(pool, sc);
        pf::EvictPlan plan;
        EXPECT_OK(t->clear(&plan));
        EXPECT(pool.n_used() == 0, "order %d: %d pages held", order, pool.n_used());
    }
}

void test_same_prompt_twice() {
    PagePool pool;
    EXPECT_OK(pool.init(64, "page"));
    std::unique_ptr<PrefixTree> t;
    EXPECT_OK(PrefixTree::create(config(false), &pool, nullptr, &t));
    const std::vector<int32_t> a = seq(130, 4);
    Sess s1 = prefill(pool, a, nullptr), s2 = prefill(pool, a, nullptr);
    insert(*t, s1);
    std::vector<int32_t> before, after, slots;
    t->held_refs(&before, &slots);
    pf::InsertResult ir;
    insert(*t, s2, &ir);
    t->held_refs(&after, &slots);
    EXPECT(ir.new_tokens == 0 && before == after && t->stats().nodes == 1, "the second insert took references");
    for (int32_t id : s2.table) EXPECT(pool.refs(id) == 1, "page %d of the second session is referenced", id);
    release(pool, s1);
    release(pool, s2);
    pf::EvictPlan plan;
    EXPECT_OK(t->clear(&plan));
    EXPECT(pool.n_used() == 0, "%d pages held", pool.n_used());
}

// Snapshots: a prefill plans them every N and at the end; a request that diverges resumes from
// the deepest one below its match and re-runs the rest, and plans none at or below the point
// where it leaves the tree (the re-run rule: its states there are of its own re-run rows).
void test_snapshots() {
    PagePool pool, slots;
    EXPECT_OK(pool.init(64, "page"));
    EXPECT_OK(slots.init(32, "snapshot slot"));
    std::unique_ptr<PrefixTree> t;
    EXPECT_OK(PrefixTree::create(config(true, 64), &pool, &slots, &t));
    const std::vector<int32_t> a = seq(200, 5);
    std::vector<int64_t> plan;
    EXPECT_OK(t->snapshot_plan(a.data(), 200, 0, &plan));
    EXPECT((plan == std::vector<int64_t>{64, 128, 192, 200}), "plan of a fresh prompt: %zu positions", plan.size());
    Sess sa = prefill(pool, a, nullptr);
    std::vector<pf::SnapshotRef> snaps;
    for (int64_t q : plan) {
        int32_t slot = -1;
        EXPECT_OK(slots.alloc(&slot));
        snaps.push_back(pf::SnapshotRef{q, slot});
    }
    pf::InsertResult ir;
    insert(*t, sa, &ir, snaps);
    EXPECT(ir.snapshots_kept.size() == 4, "kept %zu snapshots", ir.snapshots_kept.size());
    for (const pf::SnapshotRef &s : snaps) EXPECT_OK(slots.unref(s.slot, nullptr));
    std::vector<int32_t> b(a.begin(), a.begin() + 100);
    for (int32_t x : seq(60, 6)) b.push_back(x == a[100] ? x + 1 : x);
    PrefixHit h;
    EXPECT_OK(t->lookup(b.data(), 160, 160, &h));
    EXPECT(h.match == 100 && h.resume == 64 && h.snapshot == snaps[0].slot, "match %lld resume %lld slot %d",
           (long long)h.match, (long long)h.resume, h.snapshot);
    EXPECT_OK(t->snapshot_plan(b.data(), 160, h.resume, &plan));
    EXPECT((plan == std::vector<int64_t>{128, 160}), "plan past the divergence: %zu positions", plan.size());
    // Extensions of a from its end snapshot at 200: 60 more tokens run uncut (200 and 260 are
    // within N = 64 of each other: the step end at 256 would save nothing), 100 more keep 256.
    std::vector<int32_t> c(a);
    for (int32_t x : seq(140, 7)) c.push_back(x);
    EXPECT_OK(t->snapshot_plan(c.data(), 260, 200, &plan));
    EXPECT((plan == std::vector<int64_t>{260}), "plan of a short extension: %zu positions", plan.size());
    EXPECT_OK(t->snapshot_plan(c.data(), 300, 200, &plan));
    EXPECT((plan == std::vector<int64_t>{256, 300}), "plan of a longer extension: %zu positions", plan.size());
    EXPECT_OK(t->snapshot_plan(c.data(), 330, 200, &plan));
    EXPECT((plan == std::vector<int64_t>{256, 320, 330}), "plan of 130 more: %zu positions", plan.size());
    // The same prompt again with the last logits wanted: matched to n - 1, resumed at 192.
    PrefixHit h2;
    EXPECT_OK(t->lookup(a.data(), 200, 199, &h2));
    EXPECT(h2.match == 199 && h2.resume == 192, "match %lld resume %lld", (long long)h2.match, (long long)h2.resume);
    const pf::PrefixStats st = t->stats();
    EXPECT(st.matched_tokens == 299 && st.served_tokens == 256 && st.rerun_tokens == 43 && st.prompt_tokens == 360,
           "statistics: matched %lld served %lld rerun %lld", (long long)st.matched_tokens, (long long)st.served_tokens,
           (long long)st.rerun_tokens);
    EXPECT_OK(t->lease_release(h.lease, nullptr));
    EXPECT_OK(t->lease_release(h2.lease, nullptr));
    check(*t);
    release(pool, sa);
    pf::EvictPlan ep;
    EXPECT_OK(t->clear(&ep));
    EXPECT(pool.n_used() == 0 && slots.n_used() == 0, "%d pages, %d slots held", pool.n_used(), slots.n_used());
}

// The re-run rule: b leaves a at 100 and resumes from a's snapshot at 64, so it computes rows
// [64, 160) itself (on a GPU their bits may differ from a's: other steps). Its leaf holds its own
// versions of pages 1 and 2 and its snapshots above 100 (none at or below); a lookup resuming
// in b's leaf gets b's pages from index 1 on, one resuming on a's path gets a's.
void test_rerun_versions() {
    PagePool pool, slots;
    EXPECT_OK(pool.init(64, "page"));
    EXPECT_OK(slots.init(32, "snapshot slot"));
    std::unique_ptr<PrefixTree> t;
    EXPECT_OK(PrefixTree::create(config(true, 64), &pool, &slots, &t));
    auto snaps_at = [&](const std::vector<int64_t> &at) {
        std::vector<pf::SnapshotRef> v;
        for (int64_t q : at) {
            int32_t slot = -1;
            EXPECT_OK(slots.alloc(&slot));
            v.push_back(pf::SnapshotRef{q, slot});
        }
        return v;
    };
    const std::vector<int32_t> a = seq(200, 5);
    Sess sa = prefill(pool, a, nullptr);
    const std::vector<pf::SnapshotRef> sna = snaps_at({64, 128, 192, 200});
    insert(*t, sa, nullptr, sna);
    std::vector<int32_t> b(a.begin(), a.begin() + 100);
    for (int32_t x : seq(60, 6)) b.push_back(x == a[100] ? x + 1 : x);
    PrefixHit hb;
    EXPECT_OK(t->lookup(b.data(), 160, 159, &hb));
    EXPECT(hb.match == 100 && hb.resume == 64, "b: match %lld resume %lld", (long long)hb.match, (long long)hb.resume);
    // the runtime's session: shares [0, R), computes [R, n)
    PrefixHit at_r = hb;
    at_r.pages.resize(size_t(pf::pages_for(hb.resume, P)));
    at_r.match = hb.resume;
    Sess sb = prefill(pool, b, &at_r);
    EXPECT(sb.table[0] == sa.table[0] && sb.table[1] != sa.table[1], "b shares page 0 only");
    std::vector<int64_t> plan;
    EXPECT_OK(t->snapshot_plan(b.data(), 160, hb.resume, &plan));
    EXPECT((plan == std::vector<int64_t>{128, 160}), "b's plan: %zu positions", plan.size());
    const std::vector<pf::SnapshotRef> snb = snaps_at({128, 160});
    pf::InsertResult ir;
    EXPECT_OK(t->insert(b.data(), 160, sb.table.data(), int64_t(sb.table.size()), snb.data(), 2, &ir, hb.resume));
    EXPECT(ir.new_tokens == 60 && ir.snapshots_kept.size() == 2, "b: %lld new tokens, %zu snapshots kept",
           (long long)ir.new_tokens, ir.snapshots_kept.size());
    EXPECT_OK(t->lease_release(hb.lease, nullptr));
    check(*t);
    struct Case {
        std::vector<int32_t> tok;
        int64_t max_match, match, resume;
        std::vector<int32_t> want;  // the pages
    };
    std::vector<int32_t> c(b.begin(), b.end()), d(a.begin(), a.begin() + 130);
    c.push_back(7);
    const std::vector<Case> cases = {
        {c, 160, 160, 160, {sa.table[0], sb.table[1], sb.table[2]}},          // resumes in b's leaf
        {std::vector<int32_t>(b.begin(), b.begin() + 131), 130, 130, 128,     // b's snapshot at 128
         {sa.table[0], sb.table[1], sb.table[2]}},
        {d, 130, 130, 128, {sa.table[0], sa.table[1], sa.table[2]}},          // a's path
        {std::vector<int32_t>(a.begin(), a.begin() + 101), 100, 100, 64,      // the branch point
         {sa.table[0], sa.table[1]}},
    };
    for (size_t i = 0; i < cases.size(); ++i) {
        const Case &k = cases[i];
        PrefixHit h;
        EXPECT_OK(t->lookup(k.tok.data(), int64_t(k.tok.size()), k.max_match, &h));
        EXPECT(h.match == k.match && h.resume == k.resume && h.pages == k.want,
               "case %zu: match %lld resume %lld, %zu pages", i, (long long)h.match, (long long)h.resume,
               h.pages.size());
        EXPECT_OK(t->lease_release(h.lease, nullptr));
    }
    for (const pf::SnapshotRef &r : sna) EXPECT_OK(slots.unref(r.slot, nullptr));
    for (const pf::SnapshotRef &r : snb) EXPECT_OK(slots.unref(r.slot, nullptr));
    check(*t);
    release(pool, sa);
    release(pool, sb);
    pf::EvictPlan ep;
    EXPECT_OK(t->clear(&ep));
    EXPECT(pool.n_used() == 0 && slots.n_used() == 0, "%d pages, %d slots held", pool.n_used(), slots.n_used());
}

void test_in_flight() {
    PagePool pool;
    EXPECT_OK(pool.init(16, "page"));
    std::unique_ptr<PrefixTree> t;
    EXPECT_OK(PrefixTree::create(config(false), &pool, nullptr, &t));
    const std::vector<int32_t> a = seq(200, 7);
    std::vector<int32_t> b(a.begin(), a.begin() + 150);
    b.push_back(a[150] + 1);
    int64_t ta = 0, tb = 0;
    EXPECT_OK(t->fill_begin(a.data(), 200, 0, &ta));
    PrefixHit h;
    EXPECT_OK(t->lookup(b.data(), 151, 151, &h));
    EXPECT(h.match == 0 && h.wait_ticket == ta && h.wait_until == 150, "wait %lld until %lld", (long long)h.wait_ticket,
           (long long)h.wait_until);
    EXPECT(t->fill_begin(b.data(), 151, 0, &tb) == PF_STATUS_INVALID_ARGUMENT &&
               std::strstr(pf_last_error(), "being prefilled") != nullptr,
           "a second claim of the same positions: %s", pf_last_error());
    EXPECT_OK(t->fill_begin(b.data(), 151, 150, &tb));  // only what lies beyond: fine
    EXPECT_OK(t->fill_end(ta));
    EXPECT_OK(t->fill_end(tb));
    EXPECT(t->fill_end(ta) == PF_STATUS_INVALID_ARGUMENT, "a ticket ended twice");
    EXPECT_OK(t->lease_release(h.lease, nullptr));
    check(*t);
}

// A tight budget: the least recently used prompt goes first.
void test_eviction() {
    PagePool pool;
    EXPECT_OK(pool.init(64, "page"));
    std::unique_ptr<PrefixTree> t;
    EXPECT_OK(PrefixTree::create(config(false, 0, 4), &pool, nullptr, &t));
    std::vector<Sess> s;
    for (int i = 0; i < 4; ++i) {
        s.push_back(prefill(pool, seq(128, 10 + i), nullptr));  // two pages each
        insert(*t, s.back());
    }
    for (Sess &x : s) release(pool, x);
    PrefixHit h;  // prompt 0 used again: the most recent now
    EXPECT_OK(t->lookup(s[0].tok.data(), 128, 128, &h));
    EXPECT_OK(t->lease_release(h.lease, nullptr));
    pf::EvictPlan plan;
    EXPECT_OK(t->evict_to_budget(&plan));
    EXPECT(plan.fits && t->stats().device_bytes <= 400 && plan.dropped_nodes.size() == 2,
           "fits %d, %lld bytes, %zu dropped", int(plan.fits), (long long)t->stats().device_bytes,
           plan.dropped_nodes.size());
    EXPECT(plan.freed.pages.size() == 4 && pool.n_used() == 4, "%zu pages freed, %d held", plan.freed.pages.size(),
           pool.n_used());
    for (int i = 0; i < 4; ++i) {
        PrefixHit q;
        EXPECT_OK(t->lookup(s[size_t(i)].tok.data(), 128, 128, &q));
        EXPECT((q.match == 128) == (i == 0 || i == 3), "prompt %d: match %lld", i, (long long)q.match);
        EXPECT_OK(t->lease_release(q.lease, nullptr));
    }
    // A pinned prompt stays even under a target of zero.
    EXPECT_OK(t->lookup(s[3].tok.data(), 128, 128, &h));
    EXPECT_OK(t->evict(0, &plan));
    EXPECT(!plan.fits && t->stats().device_pages == 2, "pinned: fits %d, %lld pages", int(plan.fits),
           (long long)t->stats().device_pages);
    EXPECT_OK(t->lease_release(h.lease, nullptr));
    EXPECT_OK(t->evict(0, &plan));
    EXPECT(plan.fits && pool.n_used() == 0, "unpinned: %d pages held", pool.n_used());
    check(*t);
}

// The host tier makes room only by dropping entries no more recent than the one that moves: an
// entry looked up since it went to the host stays, the colder device entry is dropped instead.
void test_host_lru() {
    PagePool pool;
    EXPECT_OK(pool.init(16, "page"));
    std::unique_ptr<PrefixTree> t;
    EXPECT_OK(PrefixTree::create(config(false, 0, 8, 2), &pool, nullptr, &t));
    Sess b = prefill(pool, seq(128, 40), nullptr), a = prefill(pool, seq(128, 41), nullptr);
    insert(*t, b);
    insert(*t, a);
    release(pool, a);
    release(pool, b);
    pf::EvictPlan plan;
    EXPECT_OK(t->evict(200, &plan));  // b, the older, goes to the host
    EXPECT(plan.page_moves.size() == 2 && plan.dropped_nodes.empty(), "b offloaded: %zu moves", plan.page_moves.size());
    PrefixHit h;
    EXPECT_OK(t->lookup(b.tok.data(), 128, 128, &h));  // b used again (left on the host)
    EXPECT(h.match == 128 && h.needs_restore(), "b on the host: match %lld", (long long)h.match);
    EXPECT_OK(t->lease_release(h.lease, nullptr));
    EXPECT_OK(t->evict(0, &plan));  // a is older than b now: dropped, b stays
    EXPECT(plan.page_moves.empty() && plan.dropped_nodes.size() == 1, "a dropped: %zu moves, %zu dropped",
           plan.page_moves.size(), plan.dropped_nodes.size());
    for (const Sess *s : {&a, &b}) {
        EXPECT_OK(t->lookup(s->tok.data(), 128, 128, &h));
        EXPECT(h.match == (s == &b ? 128 : 0), "after the second evict: match %lld", (long long)h.match);
        EXPECT_OK(t->lease_release(h.lease, nullptr));
    }
    check(*t);
}

// A snapshot nobody resumed from goes to the host tier first; a prefill that took the same one
// again replaces the host copy with its device one.
void test_snapshot_offload_and_replace() {
    PagePool pool, slots;
    EXPECT_OK(pool.init(16, "page"));
    EXPECT_OK(slots.init(8, "snapshot slot"));
    std::unique_ptr<PrefixTree> t;
    EXPECT_OK(PrefixTree::create(config(true, 64, 100, 100), &pool, &slots, &t));
    Sess s = prefill(pool, seq(160, 60), nullptr);
    std::vector<pf::SnapshotRef> snaps;
    for (int64_t q : {64, 128}) {
        int32_t slot = -1;
        EXPECT_OK(slots.alloc(&slot));
        snaps.push_back(pf::SnapshotRef{q, slot});
    }
    insert(*t, s, nullptr, snaps);
    for (const pf::SnapshotRef &r : snaps) EXPECT_OK(slots.unref(r.slot, nullptr));
    PrefixHit h;
    EXPECT_OK(t->lookup(s.tok.data(), 160, 150, &h));  // resumes from 128: the one at 64 ages
    EXPECT(h.resume == 128, "resume %lld", (long long)h.resume);
    EXPECT_OK(t->lease_release(h.lease, nullptr));
    pf::EvictPlan plan;
    EXPECT_OK(t->evict(t->stats().device_bytes - 1, &plan));
    EXPECT(plan.fits && plan.slot_moves.size() == 1 && plan.page_moves.empty() && t->stats().host_snapshots == 1,
           "the snapshot at 64 offloaded alone: %zu slot moves, %zu page moves", plan.slot_moves.size(),
           plan.page_moves.size());
    int32_t slot = -1;
    EXPECT_OK(slots.alloc(&slot));
    pf::InsertResult ir;
    insert(*t, s, &ir, {pf::SnapshotRef{64, slot}});
    EXPECT(ir.snapshots_kept.size() == 1 && ir.freed.host_slots.size() == 1 && t->stats().host_snapshots == 0 &&
               t->stats().device_snapshots == 2,
           "the device snapshot replaces the host copy: %zu kept, %zu host slots freed", ir.snapshots_kept.size(),
           ir.freed.host_slots.size());
    EXPECT_OK(slots.unref(slot, nullptr));
    check(*t);
    release(pool, s);
    EXPECT_OK(t->clear(&plan));
    EXPECT(pool.n_used() == 0 && slots.n_used() == 0, "%d pages, %d slots held", pool.n_used(), slots.n_used());
}

// Destroying the tree drops every reference it and its live leases hold.
void test_destroy_with_lease() {
    PagePool pool, slots;
    EXPECT_OK(pool.init(16, "page"));
    EXPECT_OK(slots.init(4, "snapshot slot"));
    std::unique_ptr<PrefixTree> t;
    EXPECT_OK(PrefixTree::create(config(true, 64, 100, 100), &pool, &slots, &t));
    Sess s = prefill(pool, seq(140, 50), nullptr);
    int32_t slot = -1;
    EXPECT_OK(slots.alloc(&slot));
    insert(*t, s, nullptr, {pf::SnapshotRef{64, slot}});
    EXPECT_OK(slots.unref(slot, nullptr));
    PrefixHit h;
    EXPECT_OK(t->lookup(s.tok.data(), 140, 139, &h));
    EXPECT(h.resume == 64 && h.pages.size() == 3, "hit: resume %lld, %zu pages", (long long)h.resume, h.pages.size());
    t.reset();  // the lease is still live
    for (int32_t id : s.table) EXPECT(pool.refs(id) == 1, "page %d: %d references after the tree", id, pool.refs(id));
    EXPECT(slots.n_used() == 0, "%d slots held after the tree", slots.n_used());
    release(pool, s);
    EXPECT(pool.n_used() == 0, "%d pages held", pool.n_used());
}

// Evicted to the host tier, found there by a lookup, brought back by a restore.
void test_host_round_trip() {
    PagePool pool, slots;
    EXPECT_OK(pool.init(64, "page"));
    EXPECT_OK(slots.init(16, "snapshot slot"));
    std::unique_ptr<PrefixTree> t;
    EXPECT_OK(PrefixTree::create(config(true, 64, 100, 100), &pool, &slots, &t));
    const std::vector<int32_t> a = seq(150, 20);
    Sess s = prefill(pool, a, nullptr);
    int32_t slot = -1;
    EXPECT_OK(slots.alloc(&slot));
    insert(*t, s, nullptr, {pf::SnapshotRef{128, slot}});
    EXPECT_OK(slots.unref(slot, nullptr));
    const std::vector<int32_t> dev_pages = s.table;
    release(pool, s);
    pf::EvictPlan plan;
    EXPECT_OK(t->evict(0, &plan));
    EXPECT(plan.fits && plan.page_moves.size() == 3 && plan.slot_moves.size() == 1 && plan.dropped_nodes.empty(),
           "offload: %zu page moves, %zu slot moves, %zu dropped", plan.page_moves.size(), plan.slot_moves.size(),
           plan.dropped_nodes.size());
    for (size_t k = 0; k < 3; ++k)
        EXPECT(plan.page_moves[k].from == dev_pages[k], "move %zu from %d", k, plan.page_moves[k].from);
    EXPECT(pool.n_used() == 0 && slots.n_used() == 0 && t->stats().host_pages == 3 && t->stats().host_snapshots == 1,
           "after offload: %d device pages, %lld host pages", pool.n_used(), (long long)t->stats().host_pages);
    PrefixHit h;
    EXPECT_OK(t->lookup(a.data(), 150, 149, &h));
    EXPECT(h.match == 149 && h.resume == 128 && h.needs_restore() && h.snapshot_host,
           "host hit: match %lld resume %lld", (long long)h.match, (long long)h.resume);
    for (size_t k = 0; k < 3; ++k) EXPECT(h.pages[k] == plan.page_moves[k].to && h.page_host[k], "host page %zu", k);
    pf::RestorePlan rp;
    EXPECT_OK(t->restore(&h, &rp));
    EXPECT(!h.needs_restore() && rp.page_moves.size() == 3 && rp.slot_moves.size() == 1, "restore: %zu moves",
           rp.page_moves.size());
    for (size_t k = 0; k < 3; ++k)
        EXPECT(rp.page_moves[k].from == plan.page_moves[k].to && rp.page_moves[k].to == h.pages[k], "restore move %zu",
               k);
    EXPECT(t->stats().host_bytes == 0 && t->stats().restored_pages == 3, "host bytes %lld after restore",
           (long long)t->stats().host_bytes);
    check(*t);
    EXPECT_OK(t->lease_release(h.lease, nullptr));
    EXPECT_OK(t->clear(&plan));
    EXPECT(pool.n_used() == 0 && slots.n_used() == 0, "%d pages, %d slots held", pool.n_used(), slots.n_used());
}

// PagePool::hold: a reference on a held id, or on a free one (which leaves the free list: the
// runtime keeps a page an eviction just dropped until its device -> host copy has read it).
void test_hold() {
    PagePool pool;
    EXPECT_OK(pool.init(4, "page"));
    int32_t a = -1, b = -1;
    EXPECT_OK(pool.alloc(&a));
    EXPECT_OK(pool.alloc(&b));
    bool freed = false;
    EXPECT_OK(pool.unref(b, &freed));
    EXPECT(freed && pool.n_free() == 3, "b free again");
    EXPECT_OK(pool.hold(b));  // held once more, off the free list
    EXPECT_OK(pool.hold(a));  // a second reference
    const char *why = "";
    EXPECT(pool.check(&why), "pool after hold: %s", why);
    EXPECT(pool.refs(a) == 2 && pool.refs(b) == 1 && pool.n_free() == 2, "refs %d %d, %d free", pool.refs(a),
           pool.refs(b), pool.n_free());
    for (int k = 0; k < 2; ++k) {  // the free ids are the other two, whatever order alloc takes them
        int32_t id = -1;
        EXPECT_OK(pool.alloc(&id));
        EXPECT(id != a && id != b, "alloc handed out held id %d", id);
    }
    EXPECT(pool.hold(4) == PF_STATUS_INVALID_ARGUMENT, "hold of an id out of range");
    EXPECT_OK(pool.unref(b, &freed));
    EXPECT(freed, "b free after its one reference");
    EXPECT(pool.check(&why), "pool at the end: %s", why);
}

void test_page_tables() {
    PagePool pool;
    EXPECT_OK(pool.init(8, "page"));
    std::vector<int32_t> a, b;
    pf::PageCopy cow;
    std::vector<int64_t> fresh;
    EXPECT_OK(pf::page_table_append(pool, &a, 0, 100, P, &cow, &fresh));
    EXPECT(a.size() == 2 && cow.index == -1 && fresh == (std::vector<int64_t>{0, 1}), "append from 0");
    EXPECT_OK(pf::page_table_fork(pool, a, 100, P, &b, &cow));  // full page shared, partial copied
    EXPECT(b[0] == a[0] && b[1] != a[1] && cow.index == 1 && cow.src == a[1] && cow.dst == b[1] && cow.rows == 36,
           "fork: copy %lld of %lld rows", (long long)cow.index, (long long)cow.rows);
    EXPECT(pool.refs(a[0]) == 2 && pool.refs(a[1]) == 1, "fork references");
    EXPECT_OK(pf::page_table_release(pool, &b, nullptr));
    const std::vector<int32_t> a64(a.begin(), a.begin() + 1);    // a's table seen at position 64
    EXPECT_OK(pf::page_table_fork(pool, a64, 64, P, &b, &cow));  // page-aligned: nothing to copy
    EXPECT(cow.index == -1 && b.size() == 1, "aligned fork");
    std::vector<int32_t> dropped;
    EXPECT_OK(pf::page_table_rollback(pool, &b, 64, 64, P, &dropped, nullptr));
    EXPECT_OK(pf::page_table_append(pool, &b, 64, 1, P, &cow, &fresh));  // a new page, no copy
    EXPECT(cow.index == -1 && fresh == std::vector<int64_t>{1}, "append at a page boundary");
    EXPECT_OK(pf::page_table_rollback(pool, &b, 65, 10, P, &dropped, nullptr));
    EXPECT(b.size() == 1 && dropped.size() == 1, "rollback into the shared first page keeps it");
    EXPECT_OK(pf::page_table_append(pool, &b, 10, 5, P, &cow, &fresh));  // shared: copy first
    EXPECT(cow.index == 0 && cow.src == a[0] && cow.rows == 10 && b[0] != a[0] && pool.refs(a[0]) == 1,
           "append into a shared page copies it");
    std::vector<int32_t> big;
    EXPECT(pf::page_table_append(pool, &big, 0, 64 * 9, P, &cow, &fresh) == PF_STATUS_OUT_OF_MEMORY && big.empty(),
           "an append the pool cannot hold");
    EXPECT(pf::page_table_rollback(pool, &b, 15, 16, P, nullptr, nullptr) == PF_STATUS_INVALID_ARGUMENT &&
               std::strstr(pf_last_error(), "to=16") != nullptr,
           "rollback forward: %s", pf_last_error());
    EXPECT(pf::page_table_append(pool, &b, 200, 1, P, &cow, &fresh) == PF_STATUS_INVALID_ARGUMENT,
           "a table that does not cover its position");
    EXPECT_OK(pf::page_table_release(pool, &a, nullptr));
    EXPECT_OK(pf::page_table_release(pool, &b, nullptr));
    EXPECT(pool.n_used() == 0 && pool.unref(0, nullptr) == PF_STATUS_INVALID_ARGUMENT,
           "all released; unref of a free id");
    const char *why = "";
    EXPECT(pool.check(&why), "%s", why);
}

void expect_refused(pf_status s, const char *what) {
    EXPECT(s == PF_STATUS_INVALID_ARGUMENT && std::strstr(pf_last_error(), what) != nullptr,
           "expected INVALID_ARGUMENT naming %s: %s", what, pf_last_error());
}

void test_bad_input() {
    PagePool pool, slots;
    EXPECT_OK(pool.init(8, "page"));
    EXPECT_OK(slots.init(8, "snapshot slot"));
    std::unique_ptr<PrefixTree> t;
    PrefixConfig c = config(true, 64);
    c.device_budget = 99;  // less than one page
    expect_refused(PrefixTree::create(c, &pool, &slots, &t), "cfg.device_budget");
    c = config(true, 64, 10, 0);
    c.snapshot_bytes = 5000;  // a budget that holds pages but not one snapshot
    expect_refused(PrefixTree::create(c, &pool, &slots, &t), "cfg.device_budget");
    c = config(true, 64, 10, 0);
    c.host_budget = 50;
    expect_refused(PrefixTree::create(c, &pool, &slots, &t), "cfg.host_budget");
    c = config(true, 64);
    c.page_rows = 100;
    expect_refused(PrefixTree::create(c, &pool, &slots, &t), "cfg.page_rows");
    c = config(true, 96);
    expect_refused(PrefixTree::create(c, &pool, &slots, &t), "cfg.snapshot_every");
    expect_refused(PrefixTree::create(config(false, 64), &pool, nullptr, &t), "cfg.snapshot_every");
    expect_refused(PrefixTree::create(config(true, 64), &pool, nullptr, &t), "slots");
    EXPECT(t == nullptr, "a refused create made a tree");
    EXPECT_OK(PrefixTree::create(config(true, 64), &pool, &slots, &t));
    std::vector<int32_t> tok = seq(70, 30);
    PrefixHit h;
    tok[69] = 1000;
    expect_refused(t->lookup(tok.data(), 70, 70, &h), "tokens[69]=1000");
    tok[69] = -3;
    pf::InsertResult ir;
    std::vector<int32_t> table{0, 1};
    expect_refused(t->insert(tok.data(), 70, table.data(), 2, nullptr, 0, &ir), "tokens[69]=-3");
    tok[69] = 5;
    expect_refused(t->insert(tok.data(), 70, table.data(), 2, nullptr, 0, &ir), "pages[0]=0");
    expect_refused(t->lookup(tok.data(), -2, 0, &h), "n=-2");
    expect_refused(t->lease_release(42, nullptr), "lease=42");
    const pf::PrefixStats st = t->stats();
    EXPECT(st.lookups == 0 && st.nodes == 0 && st.leases == 0, "refused calls changed the statistics");
    check(*t);
}

// ---- the property test -----------------------------------------------------------------------

struct Rng {
    uint64_t s;
    uint64_t next() {
        s += 0x9e3779b97f4a7c15ull;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    uint32_t below(uint64_t n) { return n ? uint32_t(next() % n) : 0; }
};

prefix_sim::Prompt gen_prompt(Rng &r, const prefix_sim::Sim &sim, std::vector<prefix_sim::Prompt> &history) {
    const int64_t p = sim.P();
    prefix_sim::Prompt q;
    if (!history.empty() && r.below(10) < 8) {
        q = history[r.below(history.size())];
        int64_t keep = q.n();
        switch (r.below(6)) {
        case 0: keep = r.below(uint64_t(q.n()) + 1); break;
        case 4: keep = q.n() - 1 - int64_t(r.below(2)); break;  // one or two short of a cached prompt
        case 1: keep = std::max<int64_t>(0, (q.n() / p) * p + int64_t(r.below(3)) - 1); break;
        case 2: keep = std::min<int64_t>(q.n(), int64_t(r.below(4))); break;
        default: break;
        }
        q.resize(std::max<int64_t>(0, std::min(keep, q.n())));
    }
    const int64_t extra = r.below(4) == 0 ? 0 : r.below(uint64_t(3 * p));
    for (int64_t i = 0; i < extra && q.n() < 6 * p; ++i) q.push(int32_t(r.below(uint64_t(sim.cfg.n_vocab))));
    history.push_back(q);
    if (history.size() > 48) history.erase(history.begin());
    return q;
}

struct Totals {
    int64_t ops = 0, lookups = 0, matched = 0, rerun = 0, inserts = 0, evicted = 0, offloaded = 0, restored = 0,
            adopted = 0, waits = 0, ooms = 0, bad = 0;
} totals;

bool run_random(uint64_t seed, int n_ops) {
    Rng r{seed};
    PrefixConfig c;
    c.page_rows = 64 * (1 + r.below(2));
    c.recurrent = r.below(2) == 0;
    c.snapshot_every = c.recurrent ? 64 * r.below(3) : 0;
    c.page_bytes = 1000;
    c.snapshot_bytes = c.recurrent ? 500 * (1 + r.below(3)) : 0;
    c.device_budget = 1000 * (2 + r.below(40));
    c.host_budget = r.below(3) == 0 ? 0 : 500 * (3 + r.below(80));
    const int32_t vocabs[] = {2, 3, 5, 50};
    c.n_vocab = vocabs[r.below(4)];
    prefix_sim::Sim sim;
    bool refused = false;
    const int32_t n_pages = int32_t(r.below(3) == 0 ? 12 + r.below(20) : 32 + r.below(160));  // some tight
    if (!sim.init(c, n_pages, int32_t(4 + r.below(48)), 5, &refused) || refused) {
        std::fprintf(stderr, "seed %llu: init: %s\n", (unsigned long long)seed, sim.err.c_str());
        return false;
    }
    std::vector<prefix_sim::Prompt> history;
    for (int i = 0; i < n_ops && sim.err.empty(); ++i) {
        sim.ops = i;
        const size_t s = r.below(sim.sess.size()), s2 = r.below(sim.sess.size());
        auto pick = [&](prefix_sim::Sim::State st) {  // a session in state st, if any
            for (size_t k = 0; k < sim.sess.size(); ++k)
                if (sim.sess[(s + k) % sim.sess.size()].st == st) return (s + k) % sim.sess.size();
            return s;
        };
        bool ok = true;
        switch (r.below(20)) {
        case 0:
        case 1:
        case 2:
        case 3: ok = sim.start(pick(prefix_sim::Sim::FREE), gen_prompt(r, sim, history), r.below(2) == 0); break;
        case 4:
        case 5:
        case 6: ok = sim.compute(pick(prefix_sim::Sim::FILLING), r.below(4) == 0); break;
        case 7:
        case 8:
        case 9: ok = sim.finish(pick(prefix_sim::Sim::COMPUTED)); break;
        case 10: ok = sim.drop(s); break;
        case 11: ok = sim.fork(s, s2); break;
        case 12: ok = sim.rollback(s, r.below(2) ? sim.sess[s].pos - 1 : r.below(uint64_t(sim.sess[s].pos) + 1)); break;
        case 13: {
            std::vector<int32_t> more(r.below(100));
            for (int32_t &t : more) t = int32_t(r.below(uint64_t(c.n_vocab)));
            ok = sim.extend(s, more);
            break;
        }
        case 14: ok = sim.insert_done(s); break;
        case 15:
        case 16: ok = sim.evict(r.below(2) ? c.device_budget : int64_t(r.below(uint64_t(c.device_budget)))); break;
        case 17:
        case 18: ok = sim.lookup_only(gen_prompt(r, sim, history), r.below(2) == 0, r.below(2) == 0); break;
        default: ok = sim.bad(int(r.below(14)), gen_prompt(r, sim, history), uint32_t(r.next())); break;
        }
        if (ok) ok = sim.verify();
        if (!ok) break;
    }
    const pf::PrefixStats st = sim.tree->stats();
    totals.ops += n_ops;
    totals.lookups += st.lookups;
    totals.matched += st.matched_tokens;
    totals.rerun += st.rerun_tokens;
    totals.inserts += sim.n_inserts;
    totals.evicted += st.evicted_pages;
    totals.offloaded += st.offloaded_pages;
    totals.restored += st.restored_pages;
    totals.adopted += st.adopted_pages;
    totals.waits += sim.n_waits;
    totals.ooms += sim.n_ooms;
    totals.bad += sim.n_bad;
    if (sim.err.empty()) sim.finish_all();
    if (!sim.err.empty()) {
        std::fprintf(stderr,
                     "seed %llu (page_rows %lld, recurrent %d, N %lld, vocab %lld, budget %lld, host %lld): %s\n",
                     (unsigned long long)seed, (long long)c.page_rows, int(c.recurrent), (long long)c.snapshot_every,
                     (long long)c.n_vocab, (long long)c.device_budget, (long long)c.host_budget, sim.err.c_str());
        return false;
    }
    return true;
}

}  // namespace

int main(int argc, char **argv) {
    for (int64_t d : {0, 1, 63, 64, 65, 100, 128, 149}) test_divergence(d);
    test_prefix_of_another();
    test_same_prompt_twice();
    test_snapshots();
    test_rerun_versions();
    test_in_flight();
    test_eviction();
    test_host_lru();
    test_host_round_trip();
    test_snapshot_offload_and_replace();
    test_destroy_with_lease();
    test_hold();
    test_page_tables();
    test_bad_input();
    const int seeds = argc > 1 ? std::atoi(argv[1]) : 1000;
    const int ops = argc > 2 ? std::atoi(argv[2]) : 300;
    int bad_seeds = 0;
    for (int s = 1; s <= seeds && bad_seeds < 5; ++s) bad_seeds += run_random(uint64_t(s), ops) ? 0 : 1;
    failures += bad_seeds;
    std::printf("prefix_tree: hand-written cases and %d random sequences of %d operations: %s\n", seeds, ops,
                failures ? "FAILED" : "ok");
    std::printf(
        "  %lld lookups (%lld tokens matched, %lld re-run), %lld inserts, pages evicted %lld / offloaded %lld / "
        "restored %lld / adopted %lld, %lld waits on a claim, %lld out-of-memory retries, %lld bad inputs "
        "refused\n",
        (long long)totals.lookups, (long long)totals.matched, (long long)totals.rerun, (long long)totals.inserts,
        (long long)totals.evicted, (long long)totals.offloaded, (long long)totals.restored, (long long)totals.adopted,
        (long long)totals.waits, (long long)totals.ooms, (long long)totals.bad);
    return failures ? 1 : 0;
}
