// executor.h — the executor: what runs the rows of one or many sequences through the layers
// (forward.cu) in steps of at most `step_rows` rows. It owns one device workspace, laid out once
// by a StepLayout, the CUDA graphs of the steps it has seen, and the GEMM plan of its shapes; the
// sequences (sequence.h) own only their state. A session has its own executor for
// pf_session_prefill; a batch (the many-sequence API) shares one among its items.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/context.h"
#include "kernels/gemm/slab_ring.cuh"
#include "plan/plan.h"
#include "runtime/model.h"

namespace pf {

class GemmPlan;  // gemm_lt.cuh
struct Sequence;  // sequence.h

// Every width of a step's scratch, derived once from (model, step rows), and the workspace layout
// built from them: the allocation, the auto step size and the GEMM plan all read it.
struct StepLayout {
    int64_t step_rows = 0; // rows per step
    int64_t lm_rows = 0;   // LM-head rows per pass: [lm_rows][n_vocab] logits
    int64_t d = 0;         // n_embd: x, h
    int64_t w_a = 0;       // the widest projection group's side-by-side outputs (Q|K|V, GDN in, gate|up)
    int64_t w_b = 0;       // the GDN conv output (0 for qwen3)
    int64_t w_o = 0;       // the mixer output
    int64_t w_gate = 0;    // GDN gates beta, g: [rows][Hv] each
    int64_t k16 = 0;       // the widest projection input (the f16 leg's fp16 rows)
    int64_t max_items = 0; // sequences per step: their positions on the device
    int64_t ids = 0;       // token ids held on the device (a call's, at their offsets)
    size_t gdn_ws = 0;     // the chunked delta rule's workspace (one pass of step_rows; with several
                           // items, all chunks of a step in one varlen pass)
    int64_t tab = 0;       // int64 slots of a step's varlen tables (VarlenStep), 0 for one item
    // Byte offsets in the workspace (256-byte aligned), and its size.
    size_t off_x = 0, off_h = 0, off_a = 0, off_b = 0, off_o = 0, off_beta = 0, off_g = 0, off_h16 = 0,
           off_inv16 = 0, off_logits = 0, off_xg = 0, off_gdn = 0, off_ids = 0, off_vals = 0, off_argmax = 0,
           off_tab = 0;
    size_t bytes = 0;
    // The bytes that depend on step_rows (what the auto step size weighs against the free memory).
    size_t row_bytes = 0;
};
// n_gdn: the model's GDN layers (the varlen tables hold a pointer per layer and item).
StepLayout step_layout(const Hparams &hp, int64_t step_rows, int64_t max_items, int64_t ids, int64_t n_gdn = 0);

// A session's step rows when its options leave them 0 (chunk_tokens): `base` (plan/defaults.h:
// kDefaultStepRows, or kBlocksStepRows for a plan that reads layer matrices from their blocks),
// capped at `cap`, halved down to 256 while the layout's row bytes would take more than a quarter
// of the device memory free after `state_bytes` (KV caches and states). streaming (a model with
// matrices its prewarm left to stream): the step may take all the free memory after the state and
// the streaming scratch instead.
pf_status auto_step_rows(const pf_context *ctx, const Hparams &hp, int32_t cap, size_t state_bytes, bool streaming,
                         int32_t base, int32_t *out);

// One sequence's rows in a step: rows [row0, row0 + rows) of the step, at position pos.
struct StepItem {
    Sequence *seq = nullptr;
    int64_t row0 = 0, rows = 0, pos = 0;
};

// A many-sequence step's GDN work as one launch per layer and kind (tuning.varlen): the items'
// rows and per-layer state pointers in device tables (e->tab, int64 slots; uploaded before the
// step when they changed, read by the graphed launches). Offsets in slots; pointer tables are
// [n_gdn][n] (layer slot gi's n entries at off + gi * n).
struct VarlenGroup {
    int32_t n = 0;               // its items
    int64_t row0 = 0, rows = 0;  // [n] each
    int64_t chunk0 = 0;          // [n + 1] (the chunked group)
    int64_t state = 0;           // [n_gdn][n] float * (the GDN states)
    std::vector<int64_t> host_rows;
};
struct VarlenStep {
    bool on = false;
    int64_t max_rows = 0;            // of any item
    VarlenGroup all;                 // every item, in row order: the conv (state = the windows)
    VarlenGroup chunked, sequential; // the delta rule's two paths (gdn_scan_choose per item)
};

// The CUDA graphs of one step shape (forward.cu "graphs"), valid while the key holds.
struct StepGraph {
    int64_t rows = 0;
    std::vector<std::pair<uint64_t, int64_t>> items;  // (Sequence::id, rows) in row order
    bool attn = false;  // attention inside (the whole step one graph)
    bool act16 = false, f16_rows = false;
    const void *scratch[3] = {nullptr, nullptr, nullptr};  // the projection scratch the launches use
    uint64_t weight_forms = 0;  // pf_context::weight_forms at capture (the weights' caches and routes)
    std::vector<cudaGraphExec_t> segs;
    uint64_t used = 0;  // the executor's step count at its last replay (the least recent goes first)
};

struct Executor {
    const pf_model *model = nullptr;
    pf_context *ctx = nullptr;
    ExecPlan plan;
    StepLayout L;
    int64_t capacity = 0;      // the most positions of a sequence it serves (cuBLAS attention sizing)
    bool paged_kv = false;     // sized for paged sequences too (the model had a KV pool when made:
                               // the cuBLAS path's gathered rows)
    void *ws = nullptr;        // the workspace (L.bytes), one allocation
    // Views into ws.
    float *x = nullptr, *h = nullptr, *a = nullptr, *b = nullptr, *o = nullptr, *beta = nullptr, *g = nullptr;
    __half *h16 = nullptr;
    float *inv16 = nullptr, *logits = nullptr;
    float *xg = nullptr;       // [lm_rows][d]: rows gathered for the LM head (the items' last rows)
    void *gdn_ws = nullptr;
    int32_t *ids = nullptr;    // [L.ids]: the call's token ids at their offsets
    int64_t *vals = nullptr;   // [1 + L.max_items]: the step's ids offset, then each item's position
    int32_t *argmax = nullptr; // [L.max_items]
    // The cuBLAS attention path's workspace (sized for capacity), its own allocation.
    void *attn_ws = nullptr;
    size_t attn_ws_bytes = 0;
    // The projection scratch (gemm.cuh ProjEnv): grown at creation for the legs and caches of then.
    Scratch w32, w16, x16;
    std::unique_ptr<GemmPlan> gemm_plan;  // the f16 leg's cuBLASLt choices; empty: GemmEx
    // CUDA graphs per step shape; a shape is captured when it comes back (seen).
    std::vector<StepGraph> graphs;
    std::vector<std::vector<std::pair<uint64_t, int64_t>>> seen;
    int32_t sharers = 1;       // sessions running on it (pf_session_fork shares one): the graph
                               // and seen-shape limits scale with them (forward.cu step_graph)
    uint64_t steps = 0;        // steps run (the graphs' recency)
    bool graph_off = false;    // a capture failed: eager from then on
    // Per call (executor_begin): whether every matrix's route takes fp16 rows (its fp16 cache, or
    // its int8 copy on the 8-bit leg) and, from that and the plan, the act16 route.
    bool act16 = false, f16_rows = false;
    bool attn_in_graph = false;
    // Varlen tables (tuning.varlen, steps of several items): the layer's slot among the GDN
    // layers (-1: attention), the step's groups, its tables on the host (the last uploaded kept).
    std::vector<int32_t> gdn_slot;
    int64_t n_gdn = 0;
    int64_t *tab = nullptr;
    VarlenStep vstep;
    bool vstep_exact = false;  // the leg the groups were made for (gdn_scan_choose's exact)
    std::vector<int64_t> tab_host, tab_dev_copy;
    // Steps of several items: each item's q/k RoPE + KV write and flash attention run on one of
    // these streams (forked from and joined to the context's stream by events; a step graph
    // captures the branches), so that the items' small launches run side by side.
    std::vector<cudaStream_t> side;
    std::vector<cudaEvent_t> side_ev;  // [0]: the fork; [1 + j]: side stream j's join
    // The blocks leg's slabs dequantized ahead (plan.blocks_ring buffers; kernels/gemm/slab_ring.cuh):
    // the step's slab GEMMs listed at creation; run by steps of the slab rows that are one capture.
    SlabRing ring;

    ~Executor();
};

// An executor for steps of `step_rows` rows (<= capacity when one sequence), sequences of up to
// `capacity` positions, up to `max_items` sequences per step and `ids` token ids per call, running
// `plan`. Sizes and allocates everything now (a step allocates nothing); on the f16 leg it also
// fixes the GEMM plan of its shapes (gemm_lt.cuh; synchronizes).
pf_status executor_create(const pf_model *m, const ExecPlan &plan, int64_t step_rows, int64_t capacity,
                          int64_t max_items, int64_t ids, Executor **out);
void executor_destroy(Executor *e);

// The call's token ids into e->ids at offset `off` (one copy; a pageable source may wait for the
// stream: once per call).
pf_status executor_upload_ids(Executor *e, const int32_t *tokens, int64_t n, int64_t off);
// Per call: the act16 route and whether every route takes fp16 rows (the copies may change
// between calls).
void executor_begin(Executor *e);
// One step: `items` (row order, rows summing to at most L.step_rows) at their positions, their ids at
// e->ids + ids_off. Runs every layer; the residual stream of the step's rows is left in e->x.
pf_status executor_step(Executor *e, const std::vector<StepItem> &items, int64_t ids_off);
// Logits of the n residual-stream rows at x (n <= L.lm_rows, [n][n_embd]: step rows of e->x, or
// rows gathered into e->xg) into e->logits: final norm, LM head.
pf_status executor_lm_head(Executor *e, const float *x, int64_t n);

}  // namespace pf
