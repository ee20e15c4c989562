// sequence.h — one sequence's state and nothing else: its KV rows per attention layer, its conv
// windows and recurrent states per Gated DeltaNet layer, its position and its snapshots of the
// recurrent state, in one allocation from the context's sequence pool. A session owns one; a
// batch item and an executor's step read and write one in place (executor.h StepItem).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention/attention.cuh"  // KvPages
#include "runtime/model.h"

namespace pf {

struct KvPool;

// A snapshot held on the device: the recurrent state (every GDN layer's conv window and state)
// at position pos, in slot `slot` of the sequence's snapshot memory.
struct Snapshot {
    int64_t pos = 0;
    int32_t last_token = -1;  // the greedy token after pos when known (a snapshot at a call's end)
    int32_t slot = 0;
};

struct Sequence {
    const pf_model *model = nullptr;
    uint64_t id = 0;                      // unique in the process: the step graphs' key (a freed
                                          // sequence's address can come back with new memory)
    int32_t capacity = 0;                 // positions its KV rows hold (pf_session_options.max_tokens)
    int32_t kv_dtype = PF_KV_F16;
    int64_t pos = 0;
    int32_t last_token = -1;              // greedy token after the last position (for generate)
    bool broken = false;                  // a device fault mid-step: state unknown until reset
    std::vector<void *> k_cache, v_cache; // per attention layer [capacity][kv_dim] (paged: the
                                          // pool's arrays)
    // Paged KV (runtime/kv_pool.h): the rows live in pages of `pool`; `pages` is the page table of
    // positions [0, pos) (pages_for(pos) ids, one reference each; during a run, those of the
    // run's end: sequence_pages_reserve appends them first) and `table` its device copy, with
    // room for every page of `capacity` positions (in the sequence's allocation).
    KvPool *pool = nullptr;
    std::vector<int32_t> pages;
    int32_t *table = nullptr;
    std::vector<float *> conv, ssm;       // per layer (GDN layers only; nullptr otherwise)
    void *mem = nullptr;                  // the one allocation all of the above lie in (the
    size_t mem_bytes = 0;                 // context's sequence pool)
    // Snapshots (pf_session_options.snapshot_*): every snap_every positions (0: never), at the
    // end of a call, in snap_slots slots of snap_bytes (one allocation), oldest first.
    int64_t snap_every = 0;
    bool snap_at_end = false;
    int32_t snap_slots = 0;
    size_t snap_bytes = 0;
    char *snap_mem = nullptr;
    std::vector<Snapshot> snaps;          // held, ascending positions
};

// The bytes of the state of a sequence of m with `capacity` positions and `snap_slots` snapshot
// slots (the one allocation sequence_alloc makes; what the auto step size weighs). Paged (`pool`
// not null): no KV rows, a page table's room instead.
size_t sequence_bytes(const pf_model *m, int32_t capacity, int32_t kv_dtype, int32_t snap_slots,
                      const KvPool *pool = nullptr);
// The state of one sequence of `capacity` positions in one allocation from the context's
// sequence pool (so that a new session or fork of a size seen before takes no cudaMalloc), its
// KV rows there or, with `pool`, in pages of the pool taken as its positions reach them. On
// failure nothing stays allocated. The recurrent state is not zeroed (sequence_zero).
pf_status sequence_alloc(const pf_model *m, int32_t capacity, int32_t kv_dtype, int32_t snap_slots, Sequence *q,
                         KvPool *pool = nullptr);
// Frees q's allocation and drops its pages.
void sequence_free(pf_context *ctx, Sequence &q);

// Where q's KV rows lie for the attention kernels: contiguous, or its device page table.
KvPages sequence_kv_pages(const Sequence &q);
// The rows of each of q's K / V arrays the kernels may address (the wgmma kernel's maps): its
// capacity, or the pool's rows.
int64_t sequence_kv_rows(const Sequence &q);
// Paged q: pages for positions [q.pos, q.pos + rows) before a run writes them (page_table_append:
// a shared partial page copied first, fresh pages past the table), the device table then
// uploaded, on `stream`. OUT_OF_MEMORY naming the pool when it has too few free pages (nothing
// changes). A no-op for contiguous q.
pf_status sequence_pages_reserve(Sequence &q, int64_t rows, cudaStream_t stream);
// Paged q: drops the pages past position `to` (page_table_rollback from `from`, the position its
// table covers: q.pos, or a reserved run's end); the caller sets q.pos = to. A no-op for
// contiguous q.
pf_status sequence_pages_truncate(Sequence &q, int64_t to, int64_t from);
inline pf_status sequence_pages_truncate(Sequence &q, int64_t to) { return sequence_pages_truncate(q, to, q.pos); }
// Paged q: drops every page (a reset, a restore, the end); the caller sets q.pos = 0. A no-op
// for contiguous q.
void sequence_pages_clear(Sequence &q);
// Zeroes q's conv windows and recurrent states and drops its snapshots (the KV rows past pos are
// never read), asynchronously.
pf_status sequence_zero(Sequence &q, cudaStream_t stream);
// Copies src's state into dst (same model and KV dtype, capacity >= src.pos), asynchronously.
pf_status sequence_copy(Sequence &dst, const Sequence &src, cudaStream_t stream);
// Copies src's state as it stood at position pos into dst (same model and KV dtype, capacity >= pos):
// KV rows [0, pos) and the recurrent state of src's snapshot h at pos (h == nullptr: pos is src's
// position and its own state is copied, or the model has no recurrent state), asynchronously.
// dst's snapshots are dropped. Paged (both of one pool): dst shares src's pages of [0, pos)
// instead of copying rows (a partial last page is copied when dst first writes into it). Both
// must be of one kind (paged on one pool, or contiguous): the caller checks.
pf_status sequence_copy_prefix(Sequence &dst, const Sequence &src, int64_t pos, const Snapshot *h,
                               cudaStream_t stream);

// The device bytes of one snapshot of m's recurrent state (0 for a model without GDN layers).
size_t snapshot_bytes(const pf_model *m);
// Keeps q's recurrent state at its position now (after the work queued on `stream`): into a free
// slot, or the oldest's. Asynchronous.
pf_status snapshot_take(Sequence &q, int32_t last_token, cudaStream_t stream);
// Copies snapshot h back into q's recurrent state (asynchronous); q's position is the caller's.
pf_status snapshot_restore(Sequence &q, const Snapshot &h, cudaStream_t stream);
// Copies q's recurrent state into snapshot memory at `slot` (snapshot_bytes(q.model) device bytes,
// a snapshot's layout; to_slot) or from it back into q, asynchronously: the prefix cache's slots.
pf_status snapshot_copy_slot(Sequence &q, char *slot, bool to_slot, cudaStream_t stream);

// Each GDN layer's (conv window, bytes, recurrent state, bytes) of q, in layer order: the spans a
// snapshot keeps.
template <class F>
void for_each_recurrent(const Sequence &q, F &&f) {
    const Hparams &hp = q.model->hp;
    const size_t conv = size_t((hp.conv_kernel - 1) * hp.conv_dim()) * 4, ssm = size_t(hp.ssm_hv * hp.ssm_dk * hp.ssm_dv) * 4;
    for (size_t il = 0; il < q.conv.size(); ++il)
        if (q.conv[il]) f(static_cast<void *>(q.conv[il]), conv, static_cast<void *>(q.ssm[il]), ssm);
}

}  // namespace pf
