// page_pool.h — the host bookkeeping of paged KV (issue 39): a pool of ids with reference counts,
// and the page-table arithmetic of a sequence (fork, rollback, append). Host-only: no device
// memory is touched here. The runtime owns the memory an id names and carries out the copies
// these functions ask for; the prefix cache (plan/prefix_tree.h) and the sessions share one
// pool of pages per model and hold references in it.
//
// A page is `page_rows` consecutive positions (a multiple of 64, the attention kernels' tile) of
// every attention layer's K and V rows. Page k of a sequence holds positions
// [k * page_rows, (k + 1) * page_rows). A sequence at position `pos` (positions [0, pos) written)
// has a page table of exactly pages_for(pos) = ceil(pos / page_rows) ids, in position order; its
// last page is partial when pos % page_rows != 0. Every id in a table is one reference in the
// pool, held by that table.
//
// Writing rule: a sequence writes rows only into pages it alone references (refs == 1). A page
// with refs > 1 is shared (by a fork, another session or the prefix cache) and read-only: before
// rows are written into it the writer copies it into a fresh page (copy-on-write) and drops its
// reference to the shared one. page_table_append plans exactly that.
//
// The same PagePool class numbers the snapshot slots of the recurrent state (one id = one
// snapshot of every GDN layer's conv window and state): ids with reference counts, nothing else.
#pragma once

#include <cstdint>
#include <vector>

#include "prefill.h"

namespace pf {

// A pool of `capacity` ids 0..capacity-1, each free (refs 0) or held (refs >= 1).
class PagePool {
public:
    // Makes a pool of `capacity` free ids (capacity >= 0; the previous state is dropped).
    // `what` names an id in messages ("page", "snapshot slot"); it must outlive the pool.
    pf_status init(int32_t capacity, const char *what);

    // Takes a free id with refs = 1. OUT_OF_MEMORY when none is free (nothing changes).
    pf_status alloc(int32_t *id);
    // Takes one more reference on a held id. INVALID_ARGUMENT for an id out of range or free.
    pf_status ref(int32_t id);
    // Takes one more reference on id, held or free (a free id leaves the free list: a holder that
    // must keep an id it has just dropped from reuse while a copy still reads it, the prefix
    // cache's device -> host moves). INVALID_ARGUMENT for an id out of range.
    pf_status hold(int32_t id);
    // Drops one reference; the id is free again at zero (*freed = true; freed may be NULL).
    // INVALID_ARGUMENT for an id out of range or free (nothing changes).
    pf_status unref(int32_t id, bool *freed);

    int32_t refs(int32_t id) const { return valid(id) ? refs_[size_t(id)] : 0; }  // 0: free or no id
    bool held(int32_t id) const { return refs(id) > 0; }
    bool valid(int32_t id) const { return id >= 0 && id < capacity(); }
    int32_t capacity() const { return int32_t(refs_.size()); }
    int32_t n_free() const { return int32_t(free_.size()); }
    int32_t n_used() const { return capacity() - n_free(); }
    const char *what() const { return what_; }

    // Invariants: every id is either on the free list once with refs 0 or held with refs >= 1.
    // False and a reason otherwise.
    bool check(const char **why) const;

private:
    std::vector<int32_t> refs_;
    std::vector<int32_t> free_;  // a stack; alloc takes the lowest id first (pushed last)
    const char *what_ = "id";
};

// The pages of positions [0, pos): ceil(pos / page_rows).
inline int64_t pages_for(int64_t pos, int64_t page_rows) { return (pos + page_rows - 1) / page_rows; }

// One copy-on-write the runtime carries out: rows [0, rows) of page `src` (every attention
// layer's K and V, at the same offsets) into page `dst`, which then replaces `src` at `index` of
// the table. Rows past `rows` in dst are never read (they are written before the position
// reaches them).
struct PageCopy {
    int64_t index = -1;  // page index in the table (-1: no copy)
    int32_t src = -1, dst = -1;
    int64_t rows = 0;
};

// The checks every helper below makes of a table before it changes anything: page_rows a
// positive multiple of 64, 0 <= pos, table->size() == pages_for(pos), every id held in the
// pool. INVALID_ARGUMENT naming `fn` and the argument.
pf_status page_table_check(const PagePool &pool, const std::vector<int32_t> &table, int64_t pos,
                           int64_t page_rows, const char *fn);

// A fork of a sequence at `pos`: *dst (replaced) shares every full page of src (one reference
// each) and gets a fresh page for a partial last page, which *cow says to copy (pos % page_rows
// rows from src's last page); cow->index = -1 when pos is page-aligned. On OUT_OF_MEMORY (no
// free page for the copy) nothing changes.
pf_status page_table_fork(PagePool &pool, const std::vector<int32_t> &src, int64_t pos, int64_t page_rows,
                          std::vector<int32_t> *dst, PageCopy *cow);

// Shares `ids` (a page table of positions [0, pos), e.g. a prefix cache hit) into *dst
// (replaced): one reference on each. Its partial last page stays shared: the next append copies
// it. INVALID_ARGUMENT (nothing changes) for a table the checks refuse.
pf_status page_table_share(PagePool &pool, const std::vector<int32_t> &ids, int64_t pos, int64_t page_rows,
                           std::vector<int32_t> *dst);

// A rollback from `pos` to `to` (0 <= to <= pos): drops the pages past the one holding `to`, so
// the table keeps pages_for(to) ids (the page holding position to - 1 stays, partial: the next
// append writes into it, or copies it first if it is shared). *dropped (may be NULL) receives
// the ids whose reference was dropped, *freed (may be NULL) those that became free.
pf_status page_table_rollback(PagePool &pool, std::vector<int32_t> *table, int64_t pos, int64_t to,
                              int64_t page_rows, std::vector<int32_t> *dropped, std::vector<int32_t> *freed);

// What appending rows [pos, pos + rows) needs: a copy-on-write of the partial page holding
// `pos` when it is shared (refs > 1), then a fresh page for every page index the new rows reach
// past the table. Carried out in the table: *cow (the copy to make before writing; index -1 if
// none), *fresh (the page indices that got a fresh page, ascending). The write may then go
// ahead: every page holding a row of [pos, pos + rows) is referenced by this table alone.
// OUT_OF_MEMORY when the pool has fewer free pages than needed (nothing changes).
pf_status page_table_append(PagePool &pool, std::vector<int32_t> *table, int64_t pos, int64_t rows,
                            int64_t page_rows, PageCopy *cow, std::vector<int64_t> *fresh);

// Drops every reference of a table (the sequence ends); the table is left empty.
pf_status page_table_release(PagePool &pool, std::vector<int32_t> *table, std::vector<int32_t> *freed);

}  // namespace pf
