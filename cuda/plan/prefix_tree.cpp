// prefix_tree.cpp — the prefix cache's radix tree, leases, claims and eviction (prefix_tree.h).
#include "plan/prefix_tree.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <tuple>

#include "base/error.h"

namespace pf {

namespace {

// Most ids a host-tier pool numbers: its reference counts live in host vectors.
constexpr int64_t kMaxHostIds = int64_t(1) << 24;

int64_t common_prefix(const int32_t *a, const int32_t *b, int64_t n) {
    int64_t i = 0;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}

}  // namespace

bool PrefixHit::needs_restore() const {
    if (snapshot_host) return true;
    for (uint8_t h : page_host)
        if (h) return true;
    return false;
}

// ---- creation, references, small helpers --------------------------------------------------

pf_status PrefixTree::create(const PrefixConfig &cfg, PagePool *pages, PagePool *slots,
                             std::unique_ptr<PrefixTree> *out) {
    const char *fn = "PrefixTree::create";
    PF_CHECK_ARG(out != nullptr, "%s: out is NULL", fn);
    PF_CHECK_ARG(cfg.page_rows >= 64 && cfg.page_rows % 64 == 0,
                 "%s: cfg.page_rows=%lld is not a positive multiple of 64 (the attention tile)", fn,
                 (long long)cfg.page_rows);
    PF_CHECK_ARG(cfg.snapshot_every >= 0 && cfg.snapshot_every % 64 == 0,
                 "%s: cfg.snapshot_every=%lld is not a multiple of 64 (0 = none)", fn, (long long)cfg.snapshot_every);
    PF_CHECK_ARG(cfg.recurrent || cfg.snapshot_every == 0,
                 "%s: cfg.snapshot_every=%lld but the model has no recurrent state (0)", fn,
                 (long long)cfg.snapshot_every);
    PF_CHECK_ARG(cfg.page_bytes > 0, "%s: cfg.page_bytes=%lld must be > 0", fn, (long long)cfg.page_bytes);
    PF_CHECK_ARG(cfg.recurrent ? cfg.snapshot_bytes > 0 : cfg.snapshot_bytes == 0,
                 "%s: cfg.snapshot_bytes=%lld must be %s", fn, (long long)cfg.snapshot_bytes,
                 cfg.recurrent ? "> 0 for a recurrent model" : "0 for a model without recurrent state");
    PF_CHECK_ARG(cfg.n_vocab > 0 && cfg.n_vocab <= int64_t(INT32_MAX) + 1, "%s: cfg.n_vocab=%lld outside [1, 2^31]", fn,
                 (long long)cfg.n_vocab);
    const int64_t entry = std::max(cfg.page_bytes, cfg.snapshot_bytes);
    PF_CHECK_ARG(cfg.device_budget >= entry,
                 "%s: cfg.device_budget=%lld is smaller than one entry (a page is %lld bytes, a snapshot %lld)", fn,
                 (long long)cfg.device_budget, (long long)cfg.page_bytes, (long long)cfg.snapshot_bytes);
    PF_CHECK_ARG(cfg.host_budget == 0 || cfg.host_budget >= entry,
                 "%s: cfg.host_budget=%lld is smaller than one entry (a page is %lld bytes, a snapshot %lld; 0 = no "
                 "host tier)",
                 fn, (long long)cfg.host_budget, (long long)cfg.page_bytes, (long long)cfg.snapshot_bytes);
    const int64_t host_pages = cfg.host_budget / cfg.page_bytes;
    const int64_t host_slots = cfg.recurrent ? cfg.host_budget / cfg.snapshot_bytes : 0;
    PF_CHECK_ARG(host_pages <= kMaxHostIds && host_slots <= kMaxHostIds,
                 "%s: cfg.host_budget=%lld holds %lld pages and %lld snapshots, more than %lld ids", fn,
                 (long long)cfg.host_budget, (long long)host_pages, (long long)host_slots, (long long)kMaxHostIds);
    PF_CHECK_ARG(pages != nullptr, "%s: pages (the device page pool) is NULL", fn);
    PF_CHECK_ARG(cfg.recurrent == (slots != nullptr), "%s: slots (the snapshot slot pool) must be %s", fn,
                 cfg.recurrent ? "given for a recurrent model" : "NULL for a model without recurrent state");
    std::unique_ptr<PrefixTree> t(new PrefixTree());
    t->cfg_ = cfg;
    t->pages_ = pages;
    t->slots_ = slots;
    PF_TRY(t->host_pages_.init(int32_t(host_pages), "host page"));
    PF_TRY(t->host_slots_.init(int32_t(host_slots), "host snapshot slot"));
    t->nodes_.resize(1);
    t->nodes_[0].live = true;
    *out = std::move(t);
    return PF_STATUS_OK;
}

PrefixTree::~PrefixTree() {
    for (auto &kv : leases_) {
        const Lease &l = kv.second;
        for (size_t i = 0; i < l.pages.size(); ++i)
            (void)(l.page_host[i] ? host_pages_.unref(l.pages[i], nullptr) : pages_->unref(l.pages[i], nullptr));
        if (l.slot >= 0) (void)(l.slot_host ? host_slots_.unref(l.slot, nullptr) : slots_->unref(l.slot, nullptr));
    }
    for (const Node &nd : nodes_) {
        if (!nd.live) continue;
        for (int32_t p : nd.pages) (void)(nd.host ? host_pages_.unref(p, nullptr) : pages_->unref(p, nullptr));
        for (const Snap &s : nd.snaps)
            (void)(s.host ? host_slots_.unref(s.slot, nullptr) : slots_->unref(s.slot, nullptr));
    }
}

struct PrefixTree::Held {
    PagePool &pool;
    std::map<int32_t, int32_t> &tally;        // id -> nodes holding it
    std::vector<int32_t> Released::*freed;    // where an id whose last reference went is listed
};

PrefixTree::Held PrefixTree::held(bool page, bool host) {
    if (page) return host ? Held{host_pages_, host_page_refs_, &Released::host_pages}
                          : Held{*pages_, dev_page_refs_, &Released::pages};
    return host ? Held{host_slots_, host_slot_refs_, &Released::host_slots}
                : Held{*slots_, dev_slot_refs_, &Released::slots};
}

// A node's new reference on a held id (the pool's count and the tree's tally).
void PrefixTree::node_ref(bool page, int32_t id, bool host) {
    const Held h = held(page, host);
    (void)h.pool.ref(id);
    ++h.tally[id];
}

void PrefixTree::node_unref(bool page, int32_t id, bool host, Released *freed) {
    const Held h = held(page, host);
    if (--h.tally[id] == 0) h.tally.erase(id);
    bool f = false;
    (void)h.pool.unref(id, &f);
    if (f && freed) (freed->*h.freed).push_back(id);
}

// A fresh id (refs 1: the node's reference), or false when the pool has none.
bool PrefixTree::node_alloc(bool page, bool host, int32_t *id) {
    const Held h = held(page, host);
    if (h.pool.n_free() == 0) return false;
    (void)h.pool.alloc(id);
    ++h.tally[*id];
    return true;
}

int64_t PrefixTree::device_bytes() const {
    return int64_t(dev_page_refs_.size()) * cfg_.page_bytes + int64_t(dev_slot_refs_.size()) * cfg_.snapshot_bytes;
}

int64_t PrefixTree::host_bytes() const {
    return int64_t(host_pages_.n_used()) * cfg_.page_bytes + int64_t(host_slots_.n_used()) * cfg_.snapshot_bytes;
}

pf_status PrefixTree::check_tokens(const int32_t *tokens, int64_t n, const char *fn) const {
    PF_CHECK_ARG(n >= 0, "%s: n=%lld < 0", fn, (long long)n);
    PF_CHECK_ARG(n == 0 || tokens != nullptr, "%s: tokens is NULL (n=%lld)", fn, (long long)n);
    for (int64_t i = 0; i < n; ++i)
        PF_CHECK_ARG(tokens[i] >= 0 && tokens[i] < cfg_.n_vocab,
                     "%s: tokens[%lld]=%d is outside the vocabulary [0, %lld)", fn, (long long)i, tokens[i],
                     (long long)cfg_.n_vocab);
    return PF_STATUS_OK;
}

int32_t PrefixTree::new_node() {
    int32_t id;
    if (!free_nodes_.empty()) {
        id = free_nodes_.back();
        free_nodes_.pop_back();
    } else {
        id = int32_t(nodes_.size());
        nodes_.emplace_back();
    }
    nodes_[size_t(id)] = Node{};
    nodes_[size_t(id)].live = true;
    return id;
}

// The nodes tokens[0, limit) walks through, in order (the last one possibly matched only in
// part), and the length matched.
int64_t PrefixTree::walk(const int32_t *tokens, int64_t limit, std::vector<int32_t> *path) const {
    path->clear();
    int32_t at = 0;
    int64_t pos = 0;
    while (pos < limit) {
        const Node &nd = nodes_[size_t(at)];
        const auto it = nd.children.find(tokens[pos]);
        if (it == nd.children.end()) break;
        const Node &c = nodes_[size_t(it->second)];
        const int64_t len = c.end - c.start;
        const int64_t k = common_prefix(c.tokens.data(), tokens + pos, std::min(len, limit - pos));
        path->push_back(it->second);
        pos += k;
        if (k < len) break;
        at = it->second;
    }
    return pos;
}

int64_t PrefixTree::held_prefix(const int32_t *tokens, int64_t n) const {
    std::vector<int32_t> path;
    return walk(tokens, n, &path);
}

// The page of each index below `match` along `path` (the page rule): index k from the deepest
// node of the path that holds a version of it, among path[0 .. snap_at] for the pages below the
// resume position (those of the snapshot's history: the re-run rule) and the whole path for the
// rest. Without re-run leaves this is the node holding position min((k + 1) P, match) - 1.
void PrefixTree::path_pages(const std::vector<int32_t> &path, int64_t match, int64_t resume, size_t snap_at,
                            std::vector<int32_t> *ids, std::vector<uint8_t> *host) const {
    const int64_t P = cfg_.page_rows;
    ids->clear();
    host->clear();
    for (int64_t k = 0; k < pages_for(match, P); ++k) {
        size_t i = k < pages_for(resume, P) ? std::min(snap_at, path.size() - 1) : path.size() - 1;
        for (;; --i) {
            const Node &nd = nodes_[size_t(path[i])];
            if (k >= nd.page_base && k < nd.page_base + int64_t(nd.pages.size())) break;
        }
        const Node &nd = nodes_[size_t(path[i])];
        ids->push_back(page_of(nd, k));
        host->push_back(nd.host ? 1 : 0);
    }
}

// The node of `path` holding the snapshot at `pos` and its index, or false.
bool PrefixTree::find_snap(const std::vector<int32_t> &path, int64_t pos, int32_t *node, size_t *idx) const {
    for (int32_t id : path) {
        const Node &nd = nodes_[size_t(id)];
        if (pos <= nd.start || pos > nd.end) continue;
        const auto it =
            std::lower_bound(nd.snaps.begin(), nd.snaps.end(), pos, [](const Snap &s, int64_t p) { return s.pos < p; });
        if (it == nd.snaps.end() || it->pos != pos) return false;
        *node = id;
        *idx = size_t(it - nd.snaps.begin());
        return true;
    }
    return false;
}

void PrefixTree::fill_hit(const Lease &l, PrefixHit *hit) const {
    hit->match = l.match;
    hit->resume = l.resume;
    hit->pages = l.pages;
    hit->page_host = l.page_host;
    hit->partial_last = l.match % cfg_.page_rows != 0;
    hit->snapshot = l.slot;
    hit->snapshot_host = l.slot_host;
}

// Splits node `id` = [s, e) at s < at < e: a new node [s, at) takes its place under its parent
// and `id` becomes [at, e) under it. The page straddling `at` (at % P != 0) is held by both (the
// new node references id's version); snapshots at (s, at] move up; pins and leases follow.
int32_t PrefixTree::split(int32_t id, int64_t at) {
    const int32_t u = new_node();  // first: nodes_ may move
    Node &N = nodes_[size_t(id)];
    Node &U = nodes_[size_t(u)];
    const int64_t P = cfg_.page_rows, cut = at - N.start;
    U.parent = N.parent;
    U.start = N.start;
    U.end = at;
    U.tokens.assign(N.tokens.begin(), N.tokens.begin() + cut);
    N.tokens.erase(N.tokens.begin(), N.tokens.begin() + cut);
    U.host = N.host;
    U.tick = N.tick;
    U.pins = N.pins;
    const int64_t k0 = N.page_base, ku = pages_for(at, P), kn = at / P;
    U.pages.assign(N.pages.begin(), N.pages.begin() + (ku - k0));
    N.pages.erase(N.pages.begin(), N.pages.begin() + (kn - k0));
    U.page_base = k0;
    N.page_base = kn;
    if (ku > kn) node_ref_page(U.pages.back(), U.host);
    const auto mid =
        std::upper_bound(N.snaps.begin(), N.snaps.end(), at, [](int64_t p, const Snap &s) { return p < s.pos; });
    U.snaps.assign(N.snaps.begin(), mid);
    N.snaps.erase(N.snaps.begin(), mid);
    nodes_[size_t(U.parent)].children[U.tokens[0]] = u;
    U.children[N.tokens[0]] = id;
    N.parent = u;
    N.start = at;
    if (U.pins > 0)
        for (auto &kv : leases_) {
            std::vector<int32_t> &v = kv.second.nodes;
            const auto it = std::find(v.begin(), v.end(), id);
            if (it != v.end()) v.insert(it, u);
        }
    return u;
}

// ---- lookup, restore, leases --------------------------------------------------------------

pf_status PrefixTree::lookup(const int32_t *tokens, int64_t n, int64_t max_match, PrefixHit *hit) {
    const char *fn = "PrefixTree::lookup";
    PF_CHECK_ARG(hit != nullptr, "%s: hit is NULL", fn);
    PF_TRY(check_tokens(tokens, n, fn));
    PF_CHECK_ARG(max_match >= 0 && max_match <= n, "%s: max_match=%lld outside [0, n=%lld]", fn, (long long)max_match,
                 (long long)n);
    Lease l;
    l.match = walk(tokens, max_match, &l.nodes);
    int32_t snode = -1;
    size_t sidx = 0, snap_at = l.nodes.empty() ? 0 : l.nodes.size() - 1;
    l.resume = cfg_.recurrent ? 0 : l.match;
    if (cfg_.recurrent)
        for (size_t i = 0; i < l.nodes.size(); ++i) {
            const int32_t id = l.nodes[i];
            for (size_t j = 0; j < nodes_[size_t(id)].snaps.size(); ++j) {
                const Snap &s = nodes_[size_t(id)].snaps[j];
                if (s.pos <= l.match && s.pos > l.resume) l.resume = s.pos, snode = id, sidx = j, snap_at = i;
            }
        }
    path_pages(l.nodes, l.match, l.resume, snap_at, &l.pages, &l.page_host);
    ++clock_;
    for (size_t i = 0; i < l.pages.size(); ++i)
        (void)(l.page_host[i] ? host_pages_.ref(l.pages[i]) : pages_->ref(l.pages[i]));
    if (snode >= 0) {
        Snap &s = nodes_[size_t(snode)].snaps[sidx];
        l.slot = s.slot;
        l.slot_host = s.host;
        (void)(s.host ? host_slots_.ref(s.slot) : slots_->ref(s.slot));
        s.tick = clock_;
    }
    for (int32_t id : l.nodes) {
        nodes_[size_t(id)].tick = clock_;
        ++nodes_[size_t(id)].pins;
    }
    st_.lookups += 1;
    st_.prompt_tokens += n;
    st_.matched_tokens += l.match;
    st_.served_tokens += l.resume;
    st_.rerun_tokens += l.match - l.resume;
    const int64_t id = next_lease_++;
    fill_hit(l, hit);
    hit->lease = id;
    hit->wait_ticket = hit->wait_until = 0;
    for (const auto &kv : claims_) {  // positions past the match another request is computing
        const Claim &c = kv.second;
        const int64_t k = common_prefix(tokens, c.tokens.data(), std::min(n, int64_t(c.tokens.size())));
        if (k > std::max(l.match, c.from) && k > hit->wait_until) hit->wait_ticket = kv.first, hit->wait_until = k;
    }
    leases_.emplace(id, std::move(l));
    return PF_STATUS_OK;
}

pf_status PrefixTree::restore(PrefixHit *hit, RestorePlan *plan) {
    const char *fn = "PrefixTree::restore";
    PF_CHECK_ARG(hit != nullptr && plan != nullptr, "%s: hit or plan is NULL", fn);
    const auto it = leases_.find(hit->lease);
    PF_CHECK_ARG(it != leases_.end(), "%s: hit->lease=%lld is not a live lease", fn, (long long)hit->lease);
    Lease &l = it->second;
    int64_t need_pages = 0;
    for (int32_t id : l.nodes)
        if (nodes_[size_t(id)].start < l.match && nodes_[size_t(id)].host)
            need_pages += int64_t(nodes_[size_t(id)].pages.size());
    int32_t snode = -1;
    size_t sidx = 0;
    const bool have_snap = l.slot >= 0 && find_snap(l.nodes, l.resume, &snode, &sidx);
    const bool need_slot = have_snap && nodes_[size_t(snode)].snaps[sidx].host;
    if (need_pages > pages_->n_free() || (need_slot && slots_->n_free() < 1))
        return fail(PF_STATUS_OUT_OF_MEMORY,
                    "%s: lease %lld needs %lld free pages and %d free snapshot slots, the "
                    "pools have %d and %d: evict and retry",
                    fn, (long long)hit->lease, (long long)need_pages, need_slot ? 1 : 0, pages_->n_free(),
                    slots_ ? slots_->n_free() : 0);
    *plan = RestorePlan{};
    for (int32_t id : l.nodes) {  // path order: a node's parent is on the device before it
        Node &nd = nodes_[size_t(id)];
        if (nd.start >= l.match || !nd.host) continue;
        for (int32_t &p : nd.pages) {
            int32_t d = -1;
            (void)node_alloc(true, false, &d);
            plan->page_moves.push_back(Move{p, d});
            node_unref_page(p, true, &plan->freed);
            p = d;
        }
        nd.host = false;
        st_.restored_pages += int64_t(nd.pages.size());
    }
    if (need_slot) {
        Snap &s = nodes_[size_t(snode)].snaps[sidx];
        int32_t d = -1;
        (void)node_alloc(false, false, &d);
        plan->slot_moves.push_back(Move{s.slot, d});
        node_unref_slot(s.slot, true, &plan->freed);
        s.slot = d;
        s.host = false;
        st_.restored_snapshots += 1;
    }
    // The lease moves its references to what the path holds now (device ids).
    std::vector<int32_t> ids;
    std::vector<uint8_t> host;
    size_t snap_at = l.nodes.empty() ? 0 : l.nodes.size() - 1;
    if (have_snap) snap_at = size_t(std::find(l.nodes.begin(), l.nodes.end(), snode) - l.nodes.begin());
    path_pages(l.nodes, l.match, l.resume, snap_at, &ids, &host);
    for (size_t i = 0; i < ids.size(); ++i) (void)(host[i] ? host_pages_.ref(ids[i]) : pages_->ref(ids[i]));
    for (size_t i = 0; i < l.pages.size(); ++i) {
        bool f = false;
        (void)(l.page_host[i] ? host_pages_.unref(l.pages[i], &f) : pages_->unref(l.pages[i], &f));
        if (f) (l.page_host[i] ? plan->freed.host_pages : plan->freed.pages).push_back(l.pages[i]);
    }
    l.pages = std::move(ids);
    l.page_host = std::move(host);
    if (have_snap) {
        const Snap &s = nodes_[size_t(snode)].snaps[sidx];
        (void)(s.host ? host_slots_.ref(s.slot) : slots_->ref(s.slot));
        bool f = false;
        (void)(l.slot_host ? host_slots_.unref(l.slot, &f) : slots_->unref(l.slot, &f));
        if (f) (l.slot_host ? plan->freed.host_slots : plan->freed.slots).push_back(l.slot);
        l.slot = s.slot;
        l.slot_host = s.host;
    }
    fill_hit(l, hit);
    return PF_STATUS_OK;
}

pf_status PrefixTree::lease_release(int64_t lease, Released *freed) {
    const auto it = leases_.find(lease);
    PF_CHECK_ARG(it != leases_.end(), "PrefixTree::lease_release: lease=%lld is not a live lease", (long long)lease);
    const Lease &l = it->second;
    for (int32_t id : l.nodes) --nodes_[size_t(id)].pins;
    for (size_t i = 0; i < l.pages.size(); ++i) {
        bool f = false;
        (void)(l.page_host[i] ? host_pages_.unref(l.pages[i], &f) : pages_->unref(l.pages[i], &f));
        if (f && freed) (l.page_host[i] ? freed->host_pages : freed->pages).push_back(l.pages[i]);
    }
    if (l.slot >= 0) {
        bool f = false;
        (void)(l.slot_host ? host_slots_.unref(l.slot, &f) : slots_->unref(l.slot, &f));
        if (f && freed) (l.slot_host ? freed->host_slots : freed->slots).push_back(l.slot);
    }
    leases_.erase(it);
    return PF_STATUS_OK;
}

// ---- snapshots to take, insert ------------------------------------------------------------

pf_status PrefixTree::snapshot_plan(const int32_t *tokens, int64_t n, int64_t resume, std::vector<int64_t> *out) const {
    const char *fn = "PrefixTree::snapshot_plan";
    PF_CHECK_ARG(out != nullptr, "%s: out is NULL", fn);
    PF_TRY(check_tokens(tokens, n, fn));
    PF_CHECK_ARG(resume >= 0 && resume <= n, "%s: resume=%lld outside [0, n=%lld]", fn, (long long)resume,
                 (long long)n);
    out->clear();
    if (!cfg_.recurrent || resume == n) return PF_STATUS_OK;
    // The re-run rule: a state at or below m (where the prompt leaves the tree) would be one of
    // the caller's re-run rows [resume, m), not of the tree's versions of them: none is planned
    // there. Above m: the multiples of N that keep the path's snapshots at most N apart, and the
    // prompt's end.
    std::vector<int32_t> path;
    const int64_t from = std::max(resume, walk(tokens, n, &path));
    if (from >= n) return PF_STATUS_OK;
    const int64_t N = cfg_.snapshot_every;
    if (N > 0) {
        // A multiple c is skipped when the snapshot before it (the resume point to begin with)
        // and the next one (the next multiple, or n) are at most N apart without it: a later
        // divergence between them re-runs at most N tokens all the same, and the run saves a
        // step end (a step is a pass over every weight: a 530-token chat turn at 4 000 cut at
        // 4 096 took 14.5 ms against 11.6 uncut, session 44).
        int64_t last = resume;
        for (int64_t p = (from / N + 1) * N; p < n; p += N)
            if (std::min(p + N, n) - last > N) {
                out->push_back(p);
                last = p;
            }
    }
    out->push_back(n);
    return PF_STATUS_OK;
}

pf_status PrefixTree::insert(const int32_t *tokens, int64_t n, const int32_t *pages, int64_t n_pages,
                             const SnapshotRef *snaps, int64_t n_snaps, InsertResult *out, int64_t own_from) {
    const char *fn = "PrefixTree::insert";
    const int64_t P = cfg_.page_rows;
    PF_CHECK_ARG(out != nullptr, "%s: out is NULL", fn);
    PF_TRY(check_tokens(tokens, n, fn));
    PF_CHECK_ARG(n_pages == pages_for(n, P), "%s: n_pages=%lld, but %lld tokens take %lld pages of %lld rows", fn,
                 (long long)n_pages, (long long)n, (long long)pages_for(n, P), (long long)P);
    PF_CHECK_ARG(n_pages == 0 || pages != nullptr, "%s: pages is NULL (n_pages=%lld)", fn, (long long)n_pages);
    {
        std::set<int32_t> seen;
        for (int64_t k = 0; k < n_pages; ++k) {
            PF_CHECK_ARG(pages_->held(pages[k]), "%s: pages[%lld]=%d is not a held page of the pool", fn, (long long)k,
                         pages[k]);
            PF_CHECK_ARG(seen.insert(pages[k]).second, "%s: pages[%lld]=%d appears twice", fn, (long long)k, pages[k]);
        }
    }
    PF_CHECK_ARG(own_from >= 0, "%s: own_from=%lld < 0", fn, (long long)own_from);
    PF_CHECK_ARG(n_snaps >= 0, "%s: n_snaps=%lld < 0", fn, (long long)n_snaps);
    PF_CHECK_ARG(n_snaps == 0 || snaps != nullptr, "%s: snaps is NULL (n_snaps=%lld)", fn, (long long)n_snaps);
    PF_CHECK_ARG(cfg_.recurrent || n_snaps == 0, "%s: n_snaps=%lld, but the model has no recurrent state", fn,
                 (long long)n_snaps);
    {
        std::set<int32_t> seen;
        for (int64_t j = 0; j < n_snaps; ++j) {
            PF_CHECK_ARG(snaps[j].pos > (j ? snaps[j - 1].pos : 0) && snaps[j].pos <= n,
                         "%s: snaps[%lld].pos=%lld: positions must ascend within (0, n=%lld]", fn, (long long)j,
                         (long long)snaps[j].pos, (long long)n);
            PF_CHECK_ARG(slots_->held(snaps[j].slot), "%s: snaps[%lld].slot=%d is not a held snapshot slot", fn,
                         (long long)j, snaps[j].slot);
            PF_CHECK_ARG(seen.insert(snaps[j].slot).second, "%s: snaps[%lld].slot=%d appears twice", fn, (long long)j,
                         snaps[j].slot);
        }
    }
    *out = InsertResult{};
    {
        // The re-run rule: a host-tier node holding positions the caller re-ran cannot take the
        // caller's pages (its versions and snapshots are another history's), so a new leaf under
        // it would hang a device node under a host one: nothing is added.
        std::vector<int32_t> pre;
        const int64_t m = walk(tokens, n, &pre);
        if (own_from < m && m < n && !pre.empty() && nodes_[size_t(pre.back())].host) {
            out->blocked = true;
            return PF_STATUS_OK;
        }
    }
    ++clock_;
    // Walk; split the edge the prompt leaves inside (the branch point).
    std::vector<int32_t> path;
    int32_t at = 0;
    int64_t pos = 0;
    while (pos < n) {
        const auto it = nodes_[size_t(at)].children.find(tokens[pos]);
        if (it == nodes_[size_t(at)].children.end()) break;
        const int32_t c = it->second;
        const int64_t len = nodes_[size_t(c)].end - nodes_[size_t(c)].start;
        const int64_t k = common_prefix(nodes_[size_t(c)].tokens.data(), tokens + pos, std::min(len, n - pos));
        if (k == len) {
            path.push_back(c);
            at = c;
            pos += k;
            continue;
        }
        if (pos + k == n) {  // the prompt ends inside the edge: nothing to split
            path.push_back(c);
            pos = n;
            break;
        }
        at = split(c, pos + k);
        path.push_back(at);
        pos += k;
        break;
    }
    // Host nodes the prompt covers come back to the device on the session's pages.
    for (int32_t id : path) {
        Node &nd = nodes_[size_t(id)];
        if (!nd.host) continue;
        if (nd.end > n || nd.end > own_from) break;  // the caller's rows there are its own (and the
                                                     // nodes below are host too)
        for (size_t j = 0; j < nd.pages.size(); ++j) {
            const int32_t mine = pages[size_t(nd.page_base) + j];
            node_ref_page(mine, false);
            node_unref_page(nd.pages[j], true, &out->freed);
            nd.pages[j] = mine;
        }
        nd.host = false;
        out->adopted_pages += int64_t(nd.pages.size());
    }
    st_.adopted_pages += out->adopted_pages;
    if (pos < n) {  // a new leaf [pos, n) under `at`
        const int32_t leaf = new_node();
        Node &lf = nodes_[size_t(leaf)];
        lf.parent = at;
        lf.start = pos;
        lf.end = n;
        lf.tokens.assign(tokens + pos, tokens + n);
        // the re-run rule: the caller's own versions from the page holding own_from on
        lf.page_base = std::min(pos, own_from) / P;
        lf.pages.assign(pages + lf.page_base, pages + n_pages);
        for (int32_t p : lf.pages) node_ref_page(p, false);
        nodes_[size_t(at)].children[tokens[pos]] = leaf;
        path.push_back(leaf);
        out->new_tokens = n - pos;
        st_.inserted_tokens += n - pos;
        // The parent's partial last page: take the new child's version when no other child
        // shares the parent's (its own copy is then a duplicate).
        // (Only when the caller's rows below pos are the parent's: it did not re-run them.)
        Node &pa = nodes_[size_t(at)];
        const int32_t mine = pa.pages.empty() ? -1 : pa.pages.back(), theirs = page_of(lf, pos / P);
        if (at != 0 && pos % P != 0 && !pa.host && mine != theirs && own_from >= pos) {
            bool shared = false;
            for (const auto &ch : pa.children)
                shared |= ch.second != leaf && !nodes_[size_t(ch.second)].host &&
                          page_of(nodes_[size_t(ch.second)], pos / P) == mine;
            if (!shared) {
                node_ref_page(theirs, false);
                node_unref_page(mine, false, &out->freed);
                pa.pages.back() = theirs;
            }
        }
    }
    for (int32_t id : path) nodes_[size_t(id)].tick = clock_;
    for (int64_t j = 0; j < n_snaps; ++j) {
        const int64_t p = snaps[j].pos;
        if (own_from < pos && p <= pos) continue;  // the re-run rule: not a state of the tree's rows
        Node *nd = nullptr;
        for (int32_t id : path)
            if (p > nodes_[size_t(id)].start && p <= nodes_[size_t(id)].end) nd = &nodes_[size_t(id)];
        const auto it =
            std::lower_bound(nd->snaps.begin(), nd->snaps.end(), p, [](const Snap &s, int64_t q) { return s.pos < q; });
        if (it != nd->snaps.end() && it->pos == p) {
            if (!it->host) continue;  // the tree has it
            // a host-tier copy: the caller's device one replaces it
            node_unref_slot(it->slot, true, &out->freed);
            *it = Snap{p, snaps[j].slot, false, clock_};
        } else {
            nd->snaps.insert(it, Snap{p, snaps[j].slot, false, clock_});
        }
        node_ref_slot(snaps[j].slot, false);
        out->snapshots_kept.push_back(snaps[j]);
    }
    return PF_STATUS_OK;
}

// ---- in-flight claims ---------------------------------------------------------------------

pf_status PrefixTree::fill_begin(const int32_t *tokens, int64_t n, int64_t from, int64_t *ticket) {
    const char *fn = "PrefixTree::fill_begin";
    PF_CHECK_ARG(ticket != nullptr, "%s: ticket is NULL", fn);
    PF_TRY(check_tokens(tokens, n, fn));
    PF_CHECK_ARG(from >= 0 && from <= n, "%s: from=%lld outside [0, n=%lld]", fn, (long long)from, (long long)n);
    for (const auto &kv : claims_) {
        const Claim &c = kv.second;
        const int64_t k = common_prefix(tokens, c.tokens.data(), std::min(n, int64_t(c.tokens.size())));
        PF_CHECK_ARG(k <= std::max(from, c.from),
                     "%s: tokens[%lld, %lld) are being prefilled by ticket %lld: wait for it, or begin at %lld", fn,
                     (long long)std::max(from, c.from), (long long)k, (long long)kv.first, (long long)k);
    }
    Claim c;
    c.tokens.assign(tokens, tokens + n);
    c.from = from;
    *ticket = next_ticket_++;
    claims_.emplace(*ticket, std::move(c));
    return PF_STATUS_OK;
}

pf_status PrefixTree::fill_end(int64_t ticket) {
    PF_CHECK_ARG(claims_.erase(ticket) == 1, "PrefixTree::fill_end: ticket=%lld is not a live claim",
                 (long long)ticket);
    return PF_STATUS_OK;
}

// ---- eviction -----------------------------------------------------------------------------

// Removes a node without children: its references go, the drop is recorded.
void PrefixTree::drop_node(int32_t id, EvictPlan *plan) {
    Node &nd = nodes_[size_t(id)];
    plan->dropped_nodes.push_back(
        DroppedNode{nd.start, nd.end, nd.pages.empty() ? -1 : page_of(nd, nd.start / cfg_.page_rows), nd.host,
                    plan->page_moves.size()});
    for (const Snap &s : nd.snaps) {
        plan->dropped_snapshots.push_back(DroppedSnapshot{s.pos, s.slot, s.host, plan->slot_moves.size()});
        node_unref_slot(s.slot, s.host, &plan->freed);
    }
    for (int32_t p : nd.pages) node_unref_page(p, nd.host, &plan->freed);
    st_.evicted_pages += int64_t(nd.pages.size());
    st_.evicted_snapshots += int64_t(nd.snaps.size());
    nodes_[size_t(nd.parent)].children.erase(nd.tokens[0]);
    nd = Node{};
    free_nodes_.push_back(id);
}

// Removes a node and everything below it, children first.
void PrefixTree::drop_subtree(int32_t id, EvictPlan *plan) {
    std::vector<int32_t> order{id};
    for (size_t i = 0; i < order.size(); ++i)
        for (const auto &ch : nodes_[size_t(order[i])].children) order.push_back(ch.second);
    for (size_t i = order.size(); i-- > 0;) drop_node(order[i], plan);
}

// One eviction: two queues of candidates (device, host), oldest tick first, a snapshot before
// a node of the same tick; an entry is checked again when it comes out (the tree changes).
struct PrefixTree::Evictor {
    struct Item {
        uint64_t tick;
        int kind;  // 0 a snapshot, 1 a node
        int32_t node;
        int64_t pos;
        bool operator>(const Item &o) const {
            return std::tie(tick, kind, node, pos) > std::tie(o.tick, o.kind, o.node, o.pos);
        }
    };
    using Queue = std::priority_queue<Item, std::vector<Item>, std::greater<Item>>;
    PrefixTree &t;
    EvictPlan *plan;
    Queue dev, host;

    Node &nd(int32_t id) { return t.nodes_[size_t(id)]; }
    bool dev_node(int32_t id) {
        if (id == 0 || !nd(id).live || nd(id).host || nd(id).pins > 0) return false;
        for (const auto &ch : nd(id).children)
            if (!nd(ch.second).host) return false;
        return true;
    }
    bool host_node(int32_t id) {
        return id != 0 && nd(id).live && nd(id).host && nd(id).pins == 0 && nd(id).children.empty();
    }
    Snap *snap(const Item &it, bool want_host) {
        if (!nd(it.node).live || nd(it.node).pins > 0) return nullptr;
        for (Snap &s : nd(it.node).snaps)
            if (s.pos == it.pos) return s.host == want_host ? &s : nullptr;
        return nullptr;
    }
    bool valid(const Item &it, bool want_host) {
        if (it.kind == 0) return snap(it, want_host) != nullptr;
        return want_host ? host_node(it.node) : dev_node(it.node);
    }
    void push_node(int32_t id) {
        if (dev_node(id)) dev.push(Item{nd(id).tick, 1, id, 0});
        if (host_node(id)) host.push(Item{nd(id).tick, 1, id, 0});
    }
    void push_snaps(int32_t id) {
        if (!nd(id).live || nd(id).pins > 0) return;
        for (const Snap &s : nd(id).snaps) (s.host ? host : dev).push(Item{s.tick, 0, id, s.pos});
    }
    void drop_snap(int32_t id, int64_t pos) {
        std::vector<Snap> &v = nd(id).snaps;
        for (size_t j = 0; j < v.size(); ++j)
            if (v[j].pos == pos) {
                plan->dropped_snapshots.push_back(DroppedSnapshot{pos, v[j].slot, v[j].host, plan->slot_moves.size()});
                t.node_unref_slot(v[j].slot, v[j].host, &plan->freed);
                v.erase(v.begin() + std::ptrdiff_t(j));
                t.st_.evicted_snapshots += 1;
                return;
            }
    }
    // Room for `bytes` more in the host tier, dropping host entries no more recent than `tick`.
    bool make_room(int64_t bytes, uint64_t tick) {
        if (t.cfg_.host_budget == 0 || bytes > t.cfg_.host_budget) return false;
        while (t.host_bytes() + bytes > t.cfg_.host_budget) {
            if (host.empty()) return false;
            const Item it = host.top();
            if (!valid(it, true)) {
                host.pop();
                continue;
            }
            if (it.tick > tick) return false;
            host.pop();
            if (it.kind == 0) {
                drop_snap(it.node, it.pos);
            } else {
                const int32_t parent = nd(it.node).parent;
                t.drop_node(it.node, plan);
                push_node(parent);
            }
        }
        return true;
    }
    void offload_node(int32_t id) {
        Node &n = nd(id);
        for (int32_t &p : n.pages) {
            int32_t h = -1;
            (void)t.node_alloc(true, true, &h);  // room made: the ids are there
            plan->page_moves.push_back(Move{p, h});
            t.node_unref_page(p, false, &plan->freed);
            p = h;
        }
        for (Snap &s : n.snaps) {
            if (s.host) continue;
            int32_t h = -1;
            (void)t.node_alloc(false, true, &h);
            plan->slot_moves.push_back(Move{s.slot, h});
            t.node_unref_slot(s.slot, false, &plan->freed);
            s.slot = h;
            s.host = true;
            t.st_.offloaded_snapshots += 1;
        }
        n.host = true;
        t.st_.offloaded_pages += int64_t(n.pages.size());
        push_node(id);
        push_snaps(id);
        push_node(n.parent);
    }
    void offload_snap(int32_t id, int64_t pos) {
        for (Snap &s : nd(id).snaps)
            if (s.pos == pos) {
                int32_t h = -1;
                (void)t.node_alloc(false, true, &h);
                plan->slot_moves.push_back(Move{s.slot, h});
                t.node_unref_slot(s.slot, false, &plan->freed);
                s.slot = h;
                s.host = true;
                t.st_.offloaded_snapshots += 1;
                host.push(Item{s.tick, 0, id, pos});
                return;
            }
    }
    void run(int64_t goal) {
        for (int32_t id = 1; id < int32_t(t.nodes_.size()); ++id) {
            push_node(id);
            push_snaps(id);
        }
        while (t.device_bytes() > goal && !dev.empty()) {
            const Item it = dev.top();
            dev.pop();
            if (!valid(it, false)) continue;
            if (it.kind == 0) {
                const bool room = make_room(t.cfg_.snapshot_bytes, it.tick);
                if (!valid(it, false)) continue;  // making room dropped its (host) node
                if (room)
                    offload_snap(it.node, it.pos);
                else
                    drop_snap(it.node, it.pos);
                continue;
            }
            int64_t bytes = int64_t(nd(it.node).pages.size()) * t.cfg_.page_bytes;
            for (const Snap &s : nd(it.node).snaps) bytes += s.host ? 0 : t.cfg_.snapshot_bytes;
            if (make_room(bytes, it.tick)) {
                offload_node(it.node);
            } else {
                const int32_t parent = nd(it.node).parent;
                t.drop_subtree(it.node, plan);
                push_node(parent);
            }
        }
    }
};

pf_status PrefixTree::evict(int64_t target_bytes, EvictPlan *plan) {
    PF_CHECK_ARG(plan != nullptr, "PrefixTree::evict: plan is NULL");
    PF_CHECK_ARG(target_bytes >= 0, "PrefixTree::evict: target_bytes=%lld < 0", (long long)target_bytes);
    *plan = EvictPlan{};
    const int64_t goal = std::min(target_bytes, cfg_.device_budget);
    Evictor{*this, plan, {}, {}}.run(goal);
    plan->fits = device_bytes() <= goal;
    return PF_STATUS_OK;
}

pf_status PrefixTree::clear(EvictPlan *plan) {
    PF_CHECK_ARG(plan != nullptr, "PrefixTree::clear: plan is NULL");
    PF_CHECK_ARG(leases_.empty(), "PrefixTree::clear: %zu leases are live: release them first", leases_.size());
    *plan = EvictPlan{};
    std::vector<int32_t> top;
    for (const auto &ch : nodes_[0].children) top.push_back(ch.second);
    for (int32_t id : top) drop_subtree(id, plan);
    return PF_STATUS_OK;
}

// ---- statistics and invariants ------------------------------------------------------------

PrefixStats PrefixTree::stats() const {
    PrefixStats s = st_;
    s.nodes = int64_t(nodes_.size() - free_nodes_.size()) - 1;
    s.device_pages = int64_t(dev_page_refs_.size());
    s.device_snapshots = int64_t(dev_slot_refs_.size());
    s.device_bytes = device_bytes();
    s.host_pages = host_pages_.n_used();
    s.host_snapshots = host_slots_.n_used();
    s.host_bytes = host_bytes();
    s.leases = int64_t(leases_.size());
    s.fills = int64_t(claims_.size());
    return s;
}

void PrefixTree::held_refs(std::vector<int32_t> *pages, std::vector<int32_t> *slots) const {
    if (pages && pages->size() < size_t(pages_->capacity())) pages->resize(size_t(pages_->capacity()), 0);
    if (slots && slots_ && slots->size() < size_t(slots_->capacity())) slots->resize(size_t(slots_->capacity()), 0);
    for (const Node &nd : nodes_) {
        if (!nd.live) continue;
        if (pages && !nd.host)
            for (int32_t p : nd.pages) ++(*pages)[size_t(p)];
        if (slots)
            for (const Snap &s : nd.snaps)
                if (!s.host) ++(*slots)[size_t(s.slot)];
    }
    for (const auto &kv : leases_) {
        const Lease &l = kv.second;
        if (pages)
            for (size_t i = 0; i < l.pages.size(); ++i)
                if (!l.page_host[i]) ++(*pages)[size_t(l.pages[i])];
        if (slots && l.slot >= 0 && !l.slot_host) ++(*slots)[size_t(l.slot)];
    }
}

bool PrefixTree::check(const char **why) const {
    const int64_t P = cfg_.page_rows;
    const Node &root = nodes_[0];
    if (!root.live || root.start != 0 || root.end != 0 || !root.tokens.empty() || !root.pages.empty() ||
        !root.snaps.empty() || root.host)
        return *why = "the root is not an empty device node at 0", false;
    std::map<int32_t, int32_t> dp, ds, hp, hs;  // the nodes' references, counted again
    std::vector<int32_t> pins(nodes_.size(), 0);
    for (const auto &kv : leases_)
        for (int32_t id : kv.second.nodes) {
            if (id <= 0 || size_t(id) >= nodes_.size() || !nodes_[size_t(id)].live)
                return *why = "a lease pins a dead node", false;
            ++pins[size_t(id)];
        }
    size_t live = 0;
    for (size_t id = 0; id < nodes_.size(); ++id) {
        const Node &nd = nodes_[id];
        if (!nd.live) continue;
        ++live;
        for (const auto &ch : nd.children) {
            if (ch.second <= 0 || size_t(ch.second) >= nodes_.size()) return *why = "a child id out of range", false;
            const Node &c = nodes_[size_t(ch.second)];
            if (!c.live || c.parent != int32_t(id)) return *why = "a child that does not name its parent", false;
            if (c.tokens.empty() || c.tokens[0] != ch.first) return *why = "a child under the wrong first token", false;
            if (c.start != nd.end) return *why = "a child that does not start where its parent ends", false;
            if (nd.host && !c.host) return *why = "a device node under a host node", false;
            if (id != 0 && c.tick > nd.tick) return *why = "a child used more recently than its parent", false;
        }
        if (id == 0) continue;
        if (nd.parent < 0 || size_t(nd.parent) >= nodes_.size() || !nodes_[size_t(nd.parent)].live)
            return *why = "a node without a live parent", false;
        if (nd.end <= nd.start || int64_t(nd.tokens.size()) != nd.end - nd.start)
            return *why = "a node without tokens, or tokens that do not fill its positions", false;
        for (int32_t tok : nd.tokens)
            if (tok < 0 || tok >= cfg_.n_vocab) return *why = "a token outside the vocabulary", false;
        const auto pit = nodes_[size_t(nd.parent)].children.find(nd.tokens[0]);
        if (pit == nodes_[size_t(nd.parent)].children.end() || pit->second != int32_t(id))
            return *why = "a node its parent does not list", false;
        if (nd.page_base < 0 || nd.page_base > nd.start / P ||
            int64_t(nd.pages.size()) != pages_for(nd.end, P) - nd.page_base)
            return *why = "a node whose pages do not cover its positions", false;
        std::set<int32_t> own;
        for (int32_t p : nd.pages) {
            if (!own.insert(p).second) return *why = "a page twice in one node", false;
            if (!(nd.host ? host_pages_.held(p) : pages_->held(p)))
                return *why = "a node holds a page its pool has free", false;
            ++(nd.host ? hp : dp)[p];
        }
        int64_t last = nd.start;
        for (const Snap &s : nd.snaps) {
            if (!cfg_.recurrent) return *why = "a snapshot in a tree without recurrent state", false;
            if (s.pos <= last || s.pos > nd.end) return *why = "snapshots out of order or outside their node", false;
            last = s.pos;
            if (!(s.host ? host_slots_.held(s.slot) : slots_->held(s.slot)))
                return *why = "a node holds a free slot", false;
            if (s.tick > nd.tick) return *why = "a snapshot used more recently than its node", false;
            ++(s.host ? hs : ds)[s.slot];
        }
        if (nd.pins != pins[id]) return *why = "pins differ from the leases holding the node", false;
    }
    if (live + free_nodes_.size() != nodes_.size()) return *why = "the free node list does not match", false;
    for (int32_t id : free_nodes_)
        if (id <= 0 || size_t(id) >= nodes_.size() || nodes_[size_t(id)].live)
            return *why = "a live node on the free list", false;
    size_t reach = 0;  // every live node hangs from the root
    std::vector<int32_t> stack{0};
    while (!stack.empty()) {
        const int32_t id = stack.back();
        stack.pop_back();
        if (++reach > live) return *why = "a cycle in the tree", false;
        for (const auto &ch : nodes_[size_t(id)].children) stack.push_back(ch.second);
    }
    if (reach != live) return *why = "a live node the root does not reach", false;
    for (const auto &s : ds)
        if (s.second != 1) return *why = "a snapshot slot held by two snapshots", false;
    for (const auto &s : hs)
        if (s.second != 1) return *why = "a host snapshot slot held by two snapshots", false;
    if (dp != dev_page_refs_ || ds != dev_slot_refs_ || hp != host_page_refs_ || hs != host_slot_refs_)
        return *why = "the reference tallies differ from the nodes", false;
    // Pools: the device pools hold at least the tree's and the leases' references; the host
    // pools exactly those.
    std::map<int32_t, int32_t> ldp, lds, lhp, lhs;
    for (const auto &kv : leases_) {
        const Lease &l = kv.second;
        if (l.resume < 0 || l.resume > l.match || int64_t(l.pages.size()) != pages_for(l.match, P) ||
            l.page_host.size() != l.pages.size())
            return *why = "a lease's match, resume or pages are inconsistent", false;
        if ((l.slot >= 0) != (l.resume > 0 && cfg_.recurrent))
            return *why = "a lease's snapshot does not match its resume", false;
        for (size_t i = 0; i < l.pages.size(); ++i) ++(l.page_host[i] ? lhp : ldp)[l.pages[i]];
        if (l.slot >= 0) ++(l.slot_host ? lhs : lds)[l.slot];
    }
    for (const auto &kv : dp)
        if (pages_->refs(kv.first) < kv.second + (ldp.count(kv.first) ? ldp[kv.first] : 0))
            return *why = "a device page with fewer references than the tree and leases hold", false;
    for (const auto &kv : ldp)
        if (pages_->refs(kv.first) < kv.second) return *why = "a leased device page with too few references", false;
    for (const auto &kv : ds)
        if (slots_->refs(kv.first) < kv.second + (lds.count(kv.first) ? lds[kv.first] : 0))
            return *why = "a device slot with fewer references than the tree and leases hold", false;
    for (const auto &kv : lds)
        if (slots_->refs(kv.first) < kv.second) return *why = "a leased device slot with too few references", false;
    for (int32_t id = 0; id < host_pages_.capacity(); ++id) {
        const int32_t want = (hp.count(id) ? hp[id] : 0) + (lhp.count(id) ? lhp[id] : 0);
        if (host_pages_.refs(id) != want) return *why = "a host page's references differ from its holders", false;
    }
    for (int32_t id = 0; id < host_slots_.capacity(); ++id) {
        const int32_t want = (hs.count(id) ? hs[id] : 0) + (lhs.count(id) ? lhs[id] : 0);
        if (host_slots_.refs(id) != want) return *why = "a host slot's references differ from its holders", false;
    }
    if (!host_pages_.check(why) || !host_slots_.check(why) || !pages_->check(why) || (slots_ && !slots_->check(why)))
        return false;
    if (host_bytes() > cfg_.host_budget) return *why = "the host tier holds more than its budget", false;
    for (auto a = claims_.begin(); a != claims_.end(); ++a)
        for (auto b = std::next(a); b != claims_.end(); ++b) {
            const Claim &x = a->second, &y = b->second;
            const int64_t k =
                common_prefix(x.tokens.data(), y.tokens.data(), int64_t(std::min(x.tokens.size(), y.tokens.size())));
            if (k > std::max(x.from, y.from)) return *why = "two claims cover the same positions", false;
        }
    return true;
}

}  // namespace pf
