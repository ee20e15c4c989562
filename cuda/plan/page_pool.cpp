// page_pool.cpp — ids with reference counts and the page-table helpers (page_pool.h).
#include "plan/page_pool.h"

#include <algorithm>
#include <unordered_set>

#include "base/error.h"

namespace pf {

pf_status PagePool::init(int32_t capacity, const char *what) {
    PF_CHECK_ARG(capacity >= 0, "PagePool::init: capacity=%d < 0", capacity);
    what_ = what ? what : "id";
    refs_.assign(size_t(capacity), 0);
    free_.clear();
    free_.reserve(size_t(capacity));
    for (int32_t id = capacity - 1; id >= 0; --id) free_.push_back(id);
    return PF_STATUS_OK;
}

pf_status PagePool::alloc(int32_t *id) {
    PF_CHECK_ARG(id != nullptr, "PagePool::alloc: id is NULL");
    if (free_.empty()) return fail(PF_STATUS_OUT_OF_MEMORY, "PagePool::alloc: all %d %ss are held", capacity(), what_);
    *id = free_.back();
    free_.pop_back();
    refs_[size_t(*id)] = 1;
    return PF_STATUS_OK;
}

pf_status PagePool::ref(int32_t id) {
    PF_CHECK_ARG(valid(id), "PagePool::ref: %s id=%d outside [0, %d)", what_, id, capacity());
    PF_CHECK_ARG(refs_[size_t(id)] > 0, "PagePool::ref: %s id=%d is free", what_, id);
    ++refs_[size_t(id)];
    return PF_STATUS_OK;
}

pf_status PagePool::hold(int32_t id) {
    PF_CHECK_ARG(valid(id), "PagePool::hold: %s id=%d outside [0, %d)", what_, id, capacity());
    if (refs_[size_t(id)] == 0) free_.erase(std::find(free_.begin(), free_.end(), id));
    ++refs_[size_t(id)];
    return PF_STATUS_OK;
}

pf_status PagePool::unref(int32_t id, bool *freed) {
    PF_CHECK_ARG(valid(id), "PagePool::unref: %s id=%d outside [0, %d)", what_, id, capacity());
    PF_CHECK_ARG(refs_[size_t(id)] > 0, "PagePool::unref: %s id=%d is already free", what_, id);
    const bool now_free = --refs_[size_t(id)] == 0;
    if (now_free) free_.push_back(id);
    if (freed) *freed = now_free;
    return PF_STATUS_OK;
}

bool PagePool::check(const char **why) const {
    std::vector<char> on_free(refs_.size(), 0);
    for (int32_t id : free_) {
        if (!valid(id)) return *why = "a free-list id out of range", false;
        if (on_free[size_t(id)]) return *why = "an id twice on the free list", false;
        on_free[size_t(id)] = 1;
        if (refs_[size_t(id)] != 0) return *why = "a free id with references", false;
    }
    for (size_t id = 0; id < refs_.size(); ++id) {
        if (refs_[id] < 0) return *why = "a negative reference count", false;
        if (refs_[id] == 0 && !on_free[id]) return *why = "an id with no reference missing from the free list", false;
    }
    return true;
}

pf_status page_table_check(const PagePool &pool, const std::vector<int32_t> &table, int64_t pos, int64_t page_rows,
                           const char *fn) {
    PF_CHECK_ARG(page_rows >= 64 && page_rows % 64 == 0, "%s: page_rows=%lld is not a positive multiple of 64", fn,
                 (long long)page_rows);
    PF_CHECK_ARG(pos >= 0, "%s: pos=%lld < 0", fn, (long long)pos);
    PF_CHECK_ARG(int64_t(table.size()) == pages_for(pos, page_rows),
                 "%s: the page table holds %zu pages, position %lld needs %lld", fn, table.size(), (long long)pos,
                 (long long)pages_for(pos, page_rows));
    std::unordered_set<int32_t> seen;
    for (size_t k = 0; k < table.size(); ++k) {
        PF_CHECK_ARG(pool.held(table[k]), "%s: page table[%zu]=%d is not a held %s", fn, k, table[k], pool.what());
        PF_CHECK_ARG(seen.insert(table[k]).second, "%s: page table[%zu]=%d appears twice", fn, k, table[k]);
    }
    return PF_STATUS_OK;
}

pf_status page_table_fork(PagePool &pool, const std::vector<int32_t> &src, int64_t pos, int64_t page_rows,
                          std::vector<int32_t> *dst, PageCopy *cow) {
    PF_CHECK_ARG(dst != nullptr && cow != nullptr, "page_table_fork: dst or cow is NULL");
    PF_TRY(page_table_check(pool, src, pos, page_rows, "page_table_fork"));
    *cow = PageCopy{};
    const int64_t full = pos / page_rows;
    std::vector<int32_t> out(src.begin(), src.begin() + full);
    if (pos % page_rows != 0) {
        int32_t fresh = -1;
        PF_TRY(pool.alloc(&fresh));  // first: on failure no reference was taken
        *cow = PageCopy{full, src[size_t(full)], fresh, pos % page_rows};
        out.push_back(fresh);
    }
    for (int64_t k = 0; k < full; ++k) (void)pool.ref(out[size_t(k)]);  // held: checked above
    *dst = std::move(out);
    return PF_STATUS_OK;
}

pf_status page_table_share(PagePool &pool, const std::vector<int32_t> &ids, int64_t pos, int64_t page_rows,
                           std::vector<int32_t> *dst) {
    PF_CHECK_ARG(dst != nullptr, "page_table_share: dst is NULL");
    PF_TRY(page_table_check(pool, ids, pos, page_rows, "page_table_share"));
    for (int32_t id : ids) (void)pool.ref(id);
    *dst = ids;
    return PF_STATUS_OK;
}

pf_status page_table_rollback(PagePool &pool, std::vector<int32_t> *table, int64_t pos, int64_t to, int64_t page_rows,
                              std::vector<int32_t> *dropped, std::vector<int32_t> *freed) {
    PF_CHECK_ARG(table != nullptr, "page_table_rollback: table is NULL");
    PF_TRY(page_table_check(pool, *table, pos, page_rows, "page_table_rollback"));
    PF_CHECK_ARG(to >= 0 && to <= pos, "page_table_rollback: to=%lld outside [0, pos=%lld]", (long long)to,
                 (long long)pos);
    const size_t keep = size_t(pages_for(to, page_rows));
    for (size_t k = keep; k < table->size(); ++k) {
        bool f = false;
        (void)pool.unref((*table)[k], &f);
        if (dropped) dropped->push_back((*table)[k]);
        if (f && freed) freed->push_back((*table)[k]);
    }
    table->resize(keep);
    return PF_STATUS_OK;
}

pf_status page_table_append(PagePool &pool, std::vector<int32_t> *table, int64_t pos, int64_t rows, int64_t page_rows,
                            PageCopy *cow, std::vector<int64_t> *fresh) {
    PF_CHECK_ARG(table != nullptr && cow != nullptr && fresh != nullptr,
                 "page_table_append: table, cow or fresh is NULL");
    PF_TRY(page_table_check(pool, *table, pos, page_rows, "page_table_append"));
    PF_CHECK_ARG(rows >= 0, "page_table_append: rows=%lld < 0", (long long)rows);
    *cow = PageCopy{};
    fresh->clear();
    if (rows == 0) return PF_STATUS_OK;
    const int64_t have = int64_t(table->size()), want = pages_for(pos + rows, page_rows);
    const bool copy = pos % page_rows != 0 && pool.refs((*table)[size_t(have - 1)]) > 1;
    const int64_t need = (want - have) + (copy ? 1 : 0);
    if (need > pool.n_free())
        return fail(PF_STATUS_OUT_OF_MEMORY,
                    "page_table_append: %lld rows at position %lld need %lld free %ss, "
                    "the pool has %d",
                    (long long)rows, (long long)pos, (long long)need, pool.what(), pool.n_free());
    if (copy) {
        int32_t dst = -1;
        (void)pool.alloc(&dst);
        const int32_t src = (*table)[size_t(have - 1)];
        *cow = PageCopy{have - 1, src, dst, pos % page_rows};
        (void)pool.unref(src, nullptr);  // shared: another holder keeps it
        (*table)[size_t(have - 1)] = dst;
    }
    for (int64_t k = have; k < want; ++k) {
        int32_t id = -1;
        (void)pool.alloc(&id);
        table->push_back(id);
        fresh->push_back(k);
    }
    return PF_STATUS_OK;
}

pf_status page_table_release(PagePool &pool, std::vector<int32_t> *table, std::vector<int32_t> *freed) {
    PF_CHECK_ARG(table != nullptr, "page_table_release: table is NULL");
    std::unordered_set<int32_t> seen;
    for (size_t k = 0; k < table->size(); ++k) {
        PF_CHECK_ARG(pool.held((*table)[k]), "page_table_release: page table[%zu]=%d is not a held %s", k, (*table)[k],
                     pool.what());
        PF_CHECK_ARG(seen.insert((*table)[k]).second, "page_table_release: page table[%zu]=%d appears twice", k,
                     (*table)[k]);
    }
    for (int32_t id : *table) {
        bool f = false;
        (void)pool.unref(id, &f);
        if (f && freed) freed->push_back(id);
    }
    table->clear();
    return PF_STATUS_OK;
}

}  // namespace pf
