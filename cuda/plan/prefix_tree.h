// prefix_tree.h — the host bookkeeping of the prefix cache (issue 39): a radix tree over token
// ids whose nodes own KV pages and snapshots of the recurrent state, the leases that pin what a
// lookup returned, the in-flight claims of prefixes being prefilled, least-recent-use eviction
// under a device budget with an optional host tier, and the statistics. Host-only and fuzzed
// (tests/fuzz/fuzz_prefix.cpp): pages and snapshot slots are ids of pools the runtime owns
// (plan/page_pool.h); the tree takes and drops references in them and returns the copies the
// runtime must make. One tree per model; not thread-safe (the runtime serialises its calls).
//
// ---- The data -----------------------------------------------------------------------------
// A node is an edge of tokens: positions [start, end) of every prompt that passes through it
// (the root is [0, 0) and has no tokens; every other node has at least one). Its children
// start at `end` and differ in their first token.
//
// Page rule. P = page_rows. The KV rows at position p depend on every token <= p, so two prompts
// that share a prefix of length L have equal rows only below L, and the page holding L (when
// L % P != 0) is a different page per branch. Hence: every node holds a page for each page index
// that overlaps its positions, k in [start / P, ceil(end / P)) (from a lower page_base for a
// re-run leaf: the re-run rule below), and its page k is "its version":
// rows [k P, min((k + 1) P, end)) are valid for its path (rows below `start` too: they belong to
// its ancestors and are the same on every branch). So the page straddling a branch point at b
// (b % P != 0) exists once per child (each child's own version, computed by the prompt that
// made it), and the parent ending at b holds one of them by reference too (a second reference
// to a child's id: the split hands the parent the old child's version; an insert that extends
// a node swaps the node's own partial last page for the new child's when no other child shares
// it, releasing the duplicate). Full pages below floor(b / P) P are shared by every branch.
// A lookup matching L takes page k from the node on its path that holds position
// min((k + 1) P, L) - 1 (without re-run leaves; with them, the deepest holder: below): full
// pages (k < floor(L / P)) by reference, the partial last one (k = floor(L / P) when L % P != 0)
// to copy-on-write (any branch's version is right below L, so matching exactly a branch point
// copies the version the parent holds).
//
// Re-run rule (the exactness of a GPU runtime): a runtime that resumes at R < L recomputes rows
// [R, L) itself, and on a GPU their bits may differ from the tree's versions of them (other step
// shapes); its state at any position past R depends on its own rows. So (1) the pages a lookup
// returns below R are those of the snapshot's history: index k from the deepest node of the path
// up to the one holding the snapshot at R that holds a version of k (the rest of the hit's pages,
// which a runtime does not attach, from the deepest node of the whole path); (2) an insert told
// own_from = R < m (m: where the prompt leaves the tree) gives its new leaf the caller's own
// versions of the pages from index R / P on (its page_base; the ancestors keep theirs), keeps
// none of the caller's snapshots at or below m, does not take the caller's pages for host nodes
// that hold positions past R, and does not swap the parent's partial page; snapshot_plan plans
// nothing at or below m. Each path's pages and snapshots are then one history: the rows a
// request attaches and the state it resumes from were computed by one chain of calls, bitwise
// what a cold run of those calls gives. The price: a request diverging inside an edge resumes
// below the branch point (at most N tokens re-run) instead of at a branch-point snapshot, and
// a re-run leaf holds up to ceil(N / P) + 1 pages that duplicate positions of its ancestors.
//
// Snapshot rule (recurrent models only: qwen35's conv windows + GDN states; a qwen3 tree keeps
// none). A snapshot at position p is the recurrent state after tokens [0, p); the node with
// start < p <= end keeps it (in slot `slot` of the runtime's snapshot pool, or in the host tier).
// A prefill should take one (snapshot_plan) at the prompt's end and at the multiples of
// snapshot_every N past where it leaves the tree that keep its snapshots at most N apart
// (from where it resumed: a multiple is skipped when the snapshots on either side of it are
// within N), so that a later request that diverges anywhere re-runs at most about N tokens
// (fewer at a prompt's end). Every snapshot ends a step of the run. A lookup resumes from the deepest snapshot
// at or below its match (none: position 0, the zero state); the runtime attaches the pages below
// that resume position R and re-runs the tokens [R, match) into pages of its own (the re-run
// rule above).
//
// ---- Ownership ----------------------------------------------------------------------------
// References. Every node holds one reference per page it holds (in the runtime's page pool, or
// in the tree's host-tier pool) and one per snapshot slot; a lease holds one on every page and
// slot it returned, until released. Sessions hold their own (plan/page_pool.h tables). So for every
// device id: pool refs == references of the nodes + of live leases + of the runtime's other
// holders (held_refs gives the first two). The tree never writes a page; a page the tree
// references is read-only to everyone (refs > 1: page_table_append copies it before a write).
//
// Leases. A lookup pins its matched path: until lease_release nothing on it is evicted,
// offloaded or dropped (an insert may still split a pinned node, or bring a pinned host node to
// the device; both keep what the lease returned valid: the lease's own references keep every id
// it returned alive and unchanged).
//
// ---- Tiers and eviction -------------------------------------------------------------------
// Device bytes = page_bytes per distinct device page the nodes hold + snapshot_bytes per device
// slot (a page a session shares counts for the cache). Host bytes = the same over the host tier's
// ids (its pools hold only the tree's and leases' references). Inserts and restores may go past
// the device budget; evict brings it back.
//
// Eviction order: least recent use first. A node's tick is set whenever a lookup or insert walks
// through it; a snapshot's when it is inserted or a lookup resumes from it (so the snapshots
// nobody resumed from age out before the pages around them). Candidates on the device, oldest
// tick first, a snapshot before a node of the same tick: every device snapshot of an unpinned
// node, and every unpinned device node all of whose children (if any) are in the host tier (a
// device leaf: pages are dropped from the leaves up, never from the middle of a path). Each is
// offloaded to the host tier when the tier exists and has room, else dropped (a dropped node
// takes its host-tier subtree with it). Room in the host tier is made by dropping host entries
// (unpinned host leaves and host snapshots) no more recent than the entry that moves, oldest
// first; when that is not enough the entry is dropped instead. Invariant: a host node's children
// are all host nodes (a path is device from the root down to where it turns host). Nodes are
// not merged back after an eviction (a chain of one-child nodes is as correct, and its
// boundaries keep their snapshots).
//
// Copies the runtime makes, in the order given, on the stream that orders every use of the ids:
// an evict plan's device -> host moves (the device id may be free or handed out again right
// after, so the copy must be queued before any later write to it), a restore plan's host ->
// device moves (before the lease's pages are read). Freed ids are reported for the runtime's
// records (a freed device id needs nothing; a freed host id's pinned memory may be reused).
//
// ---- In-flight prefixes -------------------------------------------------------------------
// A request about to prefill positions [from, n) of a prompt claims them (fill_begin) and ends
// the claim after its insert (or on failure, fill_end). A lookup reports the claim that covers
// positions of its prompt past its match (wait_ticket, wait_until): positions [match, wait_until)
// are being computed by that request, so the caller waits for it and looks up again, or (in the
// same batch) orders its own rows after them and computes only [wait_until, n), claiming from
// wait_until (its pages below wait_until then come from that request's table). fill_begin
// refuses a claim that overlaps a live one on the same tokens, so a prefix is never computed
// twice at the same time. A claim holds no references; it only names positions of token
// sequences, and a request only ever learns about positions of its own prompt.
//
// ---- Errors -------------------------------------------------------------------------------
// INVALID_ARGUMENT naming the argument, with nothing changed: a token outside [0, n_vocab), a
// count < 0, a page or slot id the pool does not hold, snapshot positions out of order, an
// unknown lease or ticket, a config whose budget is smaller than one page or one snapshot.
// OUT_OF_MEMORY (nothing changed) when a restore needs more free device ids than the pools
// have: evict (or free sessions) and retry.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "plan/page_pool.h"
#include "prefill.h"

namespace pf {

struct PrefixConfig {
    int64_t page_rows = 0;       // positions per KV page: a positive multiple of 64
    int64_t snapshot_every = 0;  // N: a snapshot every N positions, a multiple of 64; 0 = none
                                 // (must be 0 when !recurrent)
    bool recurrent = false;      // qwen35 (GDN layers): snapshots matter; qwen3: none are kept
    int64_t page_bytes = 0;      // device bytes of one page (every attention layer's K and V), > 0
    int64_t snapshot_bytes = 0;  // bytes of one snapshot (every GDN layer's conv window + state);
                                 // > 0 when recurrent, else 0
    int64_t device_budget = 0;   // bytes the cache may hold on the device after evict; at least
                                 // one page and one snapshot
    int64_t host_budget = 0;     // bytes of the host tier (pinned); 0 = no host tier, else at least
                                 // one page and one snapshot
    int64_t n_vocab = 0;         // token ids lie in [0, n_vocab), > 0
};

// What a lookup returns. The ids stay valid (and their content unchanged) until the lease is
// released: the lease holds a reference on each.
struct PrefixHit {
    int64_t lease = 0;               // release with lease_release (every lookup makes one)
    int64_t match = 0;               // L: the longest cached prefix of the prompt (<= max_match)
    int64_t resume = 0;              // R <= L: the recurrent state is restored at R and tokens
                                     // [R, L) re-run; == L for a model without recurrent state
    std::vector<int32_t> pages;      // [pages_for(L)] the page of each index, in order: those
                                     // below pages_for(R) of R's history, valid below R (what a
                                     // runtime attaches: the re-run rule), the rest valid below L
    std::vector<uint8_t> page_host;  // [pages.size()] 1: a host-tier id (restore before use)
    bool partial_last = false;       // L % page_rows != 0: pages.back() is to copy-on-write (rows
                                     // [floor(L / P) P, L) are valid); every other page is full and
                                     // shared by reference (page_table_share, then the first
                                     // append copies the partial one)
    int32_t snapshot = -1;           // slot of the snapshot at R (-1: none, R = 0 is the zero state
                                     // or the model has no recurrent state)
    bool snapshot_host = false;      // the slot is a host-tier id (restore before use)
    int64_t wait_ticket = 0;         // a live claim computing positions [.., wait_until) of this
    int64_t wait_until = 0;          // prompt past L (0: none): wait for it or start past it
    bool needs_restore() const;      // some page or the snapshot is in the host tier
};

// A snapshot a prefill took: the recurrent state after tokens [0, pos), in device slot `slot`.
struct SnapshotRef {
    int64_t pos = 0;
    int32_t slot = -1;
};

// Ids whose last reference a call dropped (now free in their pool).
struct Released {
    std::vector<int32_t> pages, slots;            // device ids (the runtime's pools)
    std::vector<int32_t> host_pages, host_slots;  // host-tier ids
};

struct InsertResult {
    int64_t new_tokens = 0;                   // positions the tree did not hold before
    std::vector<SnapshotRef> snapshots_kept;  // the caller's snapshots the tree took a reference on
                                              // (the rest it already had)
    int64_t adopted_pages = 0;                // host-tier pages replaced by the caller's device
                                              // pages of the same positions (no copy)
    Released freed;                           // duplicates the tree let go of
    bool blocked = false;                     // nothing added: the prompt leaves the tree below a
                                              // host-tier node holding positions the caller re-ran
                                              // (a runtime's lookup pins and restores its path, so
                                              // only an insert without a lookup meets this)
};

// One copy for the runtime: the page (or snapshot slot) `from` into `to`.
struct Move {
    int32_t from = -1, to = -1;
};

// What left the cache (for the caller's records and the property test).
// moves_before: how many of the plan's page_moves (slot_moves) come before the drop, so that a
// caller replaying the plan in order reads a dropped id's content while it still holds it (a
// host id freed by a drop may be the target of a later move of the same plan).
struct DroppedNode {
    int64_t start = 0, end = 0;  // its positions
    int32_t first_page = -1;     // its page of index start / P (row `start` is its first token's)
    bool host = false;           // the tier of its ids
    size_t moves_before = 0;     // page moves before it
};
struct DroppedSnapshot {
    int64_t pos = 0;
    int32_t slot = -1;
    bool host = false;
    size_t moves_before = 0;     // slot moves before it
};

struct EvictPlan {
    std::vector<Move> page_moves, slot_moves;  // device id -> host id, to copy before reuse
    std::vector<DroppedNode> dropped_nodes;    // children before their parents
    std::vector<DroppedSnapshot> dropped_snapshots;
    Released freed;
    bool fits = true;                          // device bytes <= the target after the plan (false:
                                               // pinned entries hold the rest)
};

struct RestorePlan {
    std::vector<Move> page_moves, slot_moves;  // host id -> device id, to copy before use
    Released freed;
};

struct PrefixStats {
    int64_t lookups = 0;
    int64_t prompt_tokens = 0;   // sum of the prompts' lengths looked up
    int64_t matched_tokens = 0;  // sum of L: positions whose KV came from the cache
    int64_t served_tokens = 0;   // sum of R: positions not computed again at all
    int64_t rerun_tokens = 0;    // sum of L - R: positions re-run for the recurrent state
    int64_t inserted_tokens = 0; // positions inserts added
    int64_t nodes = 0;           // without the root
    int64_t device_pages = 0, device_snapshots = 0, device_bytes = 0;
    int64_t host_pages = 0, host_snapshots = 0, host_bytes = 0;
    int64_t leases = 0, fills = 0;  // live
    int64_t evicted_pages = 0, evicted_snapshots = 0;      // dropped (either tier)
    int64_t offloaded_pages = 0, offloaded_snapshots = 0;  // moved to the host tier
    int64_t restored_pages = 0, restored_snapshots = 0;    // moved back to the device
    int64_t adopted_pages = 0;
};

class PrefixTree {
public:
    // A tree over `pages` (the model's device page pool) and, for a recurrent model, `slots`
    // (its device snapshot slot pool; NULL otherwise). Both must outlive the tree. The host
    // tier's ids are the tree's own: host_budget / page_bytes page ids and host_budget /
    // snapshot_bytes slot ids, at most host_budget bytes of them held at once (the runtime maps
    // an id to pinned memory). INVALID_ARGUMENT naming the config field.
    static pf_status create(const PrefixConfig &cfg, PagePool *pages, PagePool *slots,
                            std::unique_ptr<PrefixTree> *out);
    // Drops every reference the tree and its leases hold (the pools must still exist).
    ~PrefixTree();
    PrefixTree(const PrefixTree &) = delete;
    PrefixTree &operator=(const PrefixTree &) = delete;

    // The longest cached prefix of tokens[0, n), at most max_match long (0 <= max_match <= n;
    // n - 1 when the caller needs the logits of the last position, which the cache does not
    // keep): *hit as described above, with a new lease. Marks the matched path and the snapshot
    // at R as used now; counts the statistics.
    pf_status lookup(const int32_t *tokens, int64_t n, int64_t max_match, PrefixHit *hit);

    // The length of the longest prefix of tokens[0, n) the tree holds, in either tier: no lease,
    // no statistics, nothing marked used (what a caller planning a batch asks before its lookups).
    // The tokens are not checked.
    int64_t held_prefix(const int32_t *tokens, int64_t n) const;

    // Brings every host-tier entry *hit needs (the nodes of its path below L, its snapshot) back
    // to the device: device ids from the pools, *plan the host -> device copies, *hit rewritten
    // with the device ids (the lease's references move to them). OUT_OF_MEMORY when the pools
    // have too few free ids (nothing changes). May take the device bytes past the budget.
    pf_status restore(PrefixHit *hit, RestorePlan *plan);

    // Ends a lease: unpins its path and drops its references (*freed: ids that became free;
    // may be NULL). INVALID_ARGUMENT for an unknown lease.
    pf_status lease_release(int64_t lease, Released *freed);

    // The positions a prefill of tokens[0, n) from `resume` (0 <= resume <= n) should snapshot,
    // ascending, in (max(resume, m), n] (m: where the prompt leaves the tree; at or below it a
    // state would be of re-run rows: the re-run rule): n, and each multiple c of N there unless
    // the position kept before it (resume, or the last multiple kept) is within N of the next
    // one (min(c + N, n)). Empty for a model without recurrent state.
    pf_status snapshot_plan(const int32_t *tokens, int64_t n, int64_t resume, std::vector<int64_t> *out) const;

    // After a prefill of tokens[0, n): `pages` is the session's page table of those positions
    // (n_pages == pages_for(n), ids held in the page pool, any row below n valid), `snaps` its
    // snapshots (positions ascending in (0, n], slots held in the slot pool; none for a model
    // without recurrent state). Adds what the tree lacks: splits the edge where the prompt
    // leaves it (the branch point), adds a leaf for the rest with a reference on each of its
    // pages, keeps each snapshot at a position the path lacks (a host-tier one at the same
    // position is replaced), and brings host nodes of the path back by taking the session's
    // pages in their place. Takes its own references: the caller keeps (and later drops) its
    // own. Never evicts: call evict after.
    // own_from: the position from which the caller computed its rows itself (a runtime: the
    // lookup's resume R); its pages below it are the tree's or copies of them. Where own_from is
    // below the point where the prompt leaves the tree (it re-ran tokens the tree holds), the new
    // leaf holds the caller's pages from page own_from / P on (its own versions: the re-run rule)
    // and the caller's snapshots at or below that point are not kept.
    pf_status insert(const int32_t *tokens, int64_t n, const int32_t *pages, int64_t n_pages,
                     const SnapshotRef *snaps, int64_t n_snaps, InsertResult *out,
                     int64_t own_from = INT64_MAX);

    // Claims positions [from, n) of tokens[0, n) for a prefill in flight (0 <= from <= n):
    // *ticket names it. INVALID_ARGUMENT naming the other ticket when a live claim covers any of
    // these positions of the same tokens.
    pf_status fill_begin(const int32_t *tokens, int64_t n, int64_t from, int64_t *ticket);
    pf_status fill_end(int64_t ticket);  // INVALID_ARGUMENT for an unknown ticket

    // Evicts (see the order above) until the device bytes are at most min(target_bytes, the
    // device budget) or nothing unpinned is left: *plan (replaced) lists the device -> host
    // copies to make, what was dropped and freed, and whether it fits. target_bytes >= 0.
    pf_status evict(int64_t target_bytes, EvictPlan *plan);
    pf_status evict_to_budget(EvictPlan *plan) { return evict(cfg_.device_budget, plan); }

    // Drops every entry of both tiers (*plan as for evict, no moves). INVALID_ARGUMENT while a
    // lease is live. In-flight claims stay.
    pf_status clear(EvictPlan *plan);

    PrefixStats stats() const;
    const PrefixConfig &config() const { return cfg_; }

    // Adds to pages[id] / slots[id] (resized to the pools' capacities) the references the nodes
    // and the live leases hold on each device id: the runtime's own are the rest of the pool's.
    void held_refs(std::vector<int32_t> *pages, std::vector<int32_t> *slots) const;

    // Every invariant: the tree's shape (tokens, positions, children keys, no empty node but the
    // root), each node's page count and tier, host nodes' children in the host tier, snapshots
    // inside their node in order, the reference counts (the tree's own tallies, the pools' counts
    // at least the tree's and leases', the host pools' exactly), pins == the leases holding each
    // node, the byte counts, the host budget, claims that do not overlap. False and a reason.
    bool check(const char **why) const;

    // The host tier's own pools (read-only: for the runtime's mapping of ids and the tests).
    const PagePool &host_page_pool() const { return host_pages_; }
    const PagePool &host_slot_pool() const { return host_slots_; }

private:
    struct Snap {
        int64_t pos = 0;
        int32_t slot = -1;
        bool host = false;
        uint64_t tick = 0;
    };
    struct Node {
        bool live = false;
        int32_t parent = -1;
        int64_t start = 0, end = 0;          // positions [start, end)
        std::vector<int32_t> tokens;         // [end - start]
        std::map<int32_t, int32_t> children; // first token -> node
        std::vector<int32_t> pages;          // page index page_base + i; tier: host
        int64_t page_base = 0;               // start / P, or lower: a leaf whose prompt re-ran
                                             // positions below its start holds its own versions
                                             // of those pages (the re-run rule above)
        bool host = false;
        std::vector<Snap> snaps;             // ascending, start < pos <= end; each its own tier
        uint64_t tick = 0;                   // last use
        int32_t pins = 0;                    // live leases holding it
    };
    struct Lease {
        std::vector<int32_t> nodes;          // pinned, in path order
        int64_t match = 0, resume = 0;
        std::vector<int32_t> pages;          // one reference each (tier: page_host)
        std::vector<uint8_t> page_host;
        int32_t slot = -1;                   // one reference (tier: slot_host)
        bool slot_host = false;
    };
    struct Claim {
        std::vector<int32_t> tokens;
        int64_t from = 0;
    };
    struct Evictor;
    PrefixTree() = default;

    PrefixConfig cfg_;
    PagePool *pages_ = nullptr, *slots_ = nullptr;  // device: the runtime's
    PagePool host_pages_, host_slots_;              // host tier: the tree's own ids
    std::vector<Node> nodes_;                       // [0] the root; dead ones are reused
    std::vector<int32_t> free_nodes_;
    std::map<int32_t, int32_t> dev_page_refs_, dev_slot_refs_;    // id -> nodes holding it
    std::map<int32_t, int32_t> host_page_refs_, host_slot_refs_;
    std::map<int64_t, Lease> leases_;
    std::map<int64_t, Claim> claims_;
    int64_t next_lease_ = 1, next_ticket_ = 1;
    uint64_t clock_ = 0;
    PrefixStats st_;

    // internals (prefix_tree.cpp)
    pf_status check_tokens(const int32_t *tokens, int64_t n, const char *fn) const;
    int64_t walk(const int32_t *tokens, int64_t limit, std::vector<int32_t> *path) const;
    void path_pages(const std::vector<int32_t> &path, int64_t match, int64_t resume, size_t snap_at,
                    std::vector<int32_t> *ids, std::vector<uint8_t> *host) const;
    int32_t page_of(const Node &nd, int64_t k) const { return nd.pages[size_t(k - nd.page_base)]; }
    bool find_snap(const std::vector<int32_t> &path, int64_t pos, int32_t *node, size_t *idx) const;
    void fill_hit(const Lease &l, PrefixHit *hit) const;
    int32_t new_node();
    int32_t split(int32_t node, int64_t at);
    struct Held;  // the pool, the tally and the freed list of one kind (page / slot) and tier
    Held held(bool page, bool host);
    void node_ref(bool page, int32_t id, bool host);
    void node_unref(bool page, int32_t id, bool host, Released *freed);
    void node_ref_page(int32_t id, bool host) { node_ref(true, id, host); }
    void node_unref_page(int32_t id, bool host, Released *freed) { node_unref(true, id, host, freed); }
    void node_ref_slot(int32_t id, bool host) { node_ref(false, id, host); }
    void node_unref_slot(int32_t id, bool host, Released *freed) { node_unref(false, id, host, freed); }
    bool node_alloc(bool page, bool host, int32_t *id);
    void drop_node(int32_t node, EvictPlan *plan);
    void drop_subtree(int32_t node, EvictPlan *plan);
    int64_t device_bytes() const;
    int64_t host_bytes() const;
};

}  // namespace pf
