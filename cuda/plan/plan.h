// plan.h — every choice the engine makes, in one place, resolved once:
//  - the deployment knobs of the environment (PREFILL_GEMM, PREFILL_GRAPH, PREFILL_GEMM_LT,
//    PREFILL_LOG), parsed by one function with one vocabulary, once per process;
//  - the tuning fields of the API (pf_tuning: a session's over its model's over its context's);
//  - the execution plan of a session (ExecPlan), built from both, the session's options and the
//    device when the session is created, and read by the layer loop and the launchers below it.
// Nothing below this file reads the environment. Host-only (no CUDA types): the GGUF fuzz target
// and the CPU tests compile it.
#pragma once

#include <cstddef>
#include <climits>
#include <cstdint>

#include "prefill.h"

namespace pf {

// ------------------------------------------------------------------ environment

enum LogTopic : uint32_t {
    kLogGemm = 1u,  // each per-shape f16-leg GEMM choice the process makes (gemm_lt.cu)
    kLogPlan = 2u,  // each session's resolved execution plan (session.cu)
    kLogRing = 4u,  // each slab-ring step's slabs taken ahead (kernels/gemm/slab_ring.cu)
};

struct EnvKnobs {
    int32_t gemm_leg = PF_GEMM_AUTO;  // PREFILL_GEMM = f16 | f32 | auto: the process default leg
    bool graphs = true;               // PREFILL_GRAPH = 0 turns every session's CUDA graphs off
    bool gemm_lt = true;              // PREFILL_GEMM_LT = 0: cublasGemmEx everywhere (no timing)
    uint32_t log = 0;                 // PREFILL_LOG = gemm,plan,ring | all: LogTopic bits
};

// The knobs, parsed at the first call (thread-safe, once per process). Booleans take 1/0, on/off,
// true/false, yes/no (any case); an empty variable is unset. A bad value prints one warning line
// on stderr naming the variable and keeps the default.
const EnvKnobs &env_knobs();
bool log_enabled(LogTopic topic);

// One value of the vocabulary, for the tests of the parser: 1 on, 0 off, -1 not a boolean.
int parse_bool(const char *v);

// ------------------------------------------------------------------ tuning

// `top`'s non-zero fields over `base`'s.
pf_tuning tuning_over(const pf_tuning &top, const pf_tuning &base);
// Every field in its range: INVALID_ARGUMENT naming `fn` and the field otherwise.
pf_status tuning_check(const pf_tuning &t, const char *fn);
// ON / OFF of a pf_switch field, `dflt` for PF_SWITCH_DEFAULT.
inline bool switch_on(int32_t v, bool dflt) { return v == PF_SWITCH_DEFAULT ? dflt : v == PF_SWITCH_ON; }

// ------------------------------------------------------------------ kernel-level choices

// How the f16 producers (f16_rows.cuh) and the fused q/k RoPE hold a row: in registers where the
// width allows (regs), else staged in shared memory where it fits (stage), else recomputed. Every
// form gives the same bits.
struct RowForm {
    bool regs = true;
    bool stage = true;
};
RowForm row_form(const pf_tuning &t);

// The chunked delta rule's launch choices (gdn_chunk.cu). Rows per pass and the default sub-pass:
constexpr int64_t kGdnPassRows = 8192;
constexpr int64_t kGdnSubpassRows = 2048;
// Under the default sub-pass, a call of kGdnSubpassRows rows (a session's step) chains two
// sub-passes of this many rows instead of running one pass (H200, 16/32 heads: 0.0922 against
// 0.0956 ms for one call of 2048 rows, 0.3678 against 0.3816 for four on a carried state; session
// 46, call A; 1024-row sub-passes are slower from 8192-row calls on).
constexpr int64_t kGdnShortSubpassRows = 1024;
// Chunks of one round of pf_gdn_scan_varlen's chunked path (a varlen call of the internal entry):
// the memory of one pass of kGdnPassRows rows.
constexpr int64_t kGdnVarlenRoundChunks = kGdnPassRows / 64;
enum class GdnStateKernel { Auto, Warp, Warpgroup, WarpgroupPair };
struct GdnChunkPlan {
    GdnStateKernel state = GdnStateKernel::Auto;  // Auto: warpgroup where it runs and v is aligned,
                                                   // its pair form where one wave does not hold it
    int64_t subpass_rows = kGdnSubpassRows;        // chained sub-passes of this many rows; 0: one pass
    int64_t short_subpass_rows = kGdnShortSubpassRows;  // a call of 2 x this .. subpass_rows rows
                                                   // chains sub-passes of this many; 0: off (tuning)
    bool pdl = true;                               // programmatic dependence (compute capability >= 9)
};
GdnChunkPlan gdn_chunk_plan(const pf_tuning &t);

// Rows from which the chunked delta rule runs (the sessions on the fast legs, PF_GDN_SCAN_AUTO).
// Measured (H200, 16/32 heads): chunked 0.087 ms against sequential 0.203 at 512 rows and 0.185
// against 0.798 at 2048 (docs/notes-archive-2026-12.md, 2026-11-30); below 512 not measured, so one 64-row chunk.
constexpr int64_t kGdnChunkMinRows = 64;
// The delta-rule path (PF_GDN_SCAN_SEQUENTIAL or _CHUNKED) for `rows` rows: `path` as asked
// (AUTO: `tuned`, the tuning's gdn_scan, first), chunked only where supported (dk = dv = 128) and,
// under AUTO, from kGdnChunkMinRows rows on a fast leg (exact = the f32 leg: sequential). The one
// rule behind the sessions, pf_gdn_scan and pf_gdn_scan_plan.
int32_t gdn_scan_choose(int32_t path, int32_t tuned, bool exact, int64_t rows, int32_t dk, int32_t dv);

// The prewarm's allocation pieces (gemm.cu): the first piece's target bytes (0: one allocation)
// and a piece whose allocation fails (testing; -1: none).
struct PrewarmPlan {
    size_t first_piece_bytes = size_t(256) << 20;
    int fail_piece = -1;
    bool partial = false;  // a set that does not fit: cache what fits (a model's prewarm)
    // Partial: the weight cached only when everything else fits (the LM head: a prefill asking
    // for the last token's logits runs it as a GEMV on the GGUF blocks, never from the cache).
    const pf_weight *last = nullptr;
    // The cache rule (a model's prewarm; prewarm_plan sets the rows and margin from the tuning,
    // model_prewarm arms it): a unit whose every part the f16 leg can read from its blocks is
    // cached only where the cached GEMM measured more than rule_margin faster at rule_rows rows.
    int64_t rule_rows = 0;     // 0: no rule
    double rule_margin = 0.03;
    int64_t rule_slab_rows = INT64_MAX, rule_gemv_rows = 0;  // the blocks' forms' limits (the tuning's)
    bool rule = false;         // armed: the sessions' route reads uncached block matrices (gemm_blocks)
};
PrewarmPlan prewarm_plan(const pf_tuning &t);

// The f16 leg's per-shape GEMM choice (gemm_lt.cuh).
enum GemmLtMode { kGemmLtOff = 0, kGemmLtOn = 1, kGemmLtForce = 2 };
GemmLtMode gemm_lt_mode(const pf_tuning &t);

// ------------------------------------------------------------------ the execution plan

// What a session runs: every choice of the layer loop and its launchers, fixed at creation.
struct ExecPlan {
    int32_t leg = PF_GEMM_AUTO;  // the session's leg, DEFAULT resolved: PF_GEMM_AUTO, _F32, _F16 or _INT8
                                 // (per matrix: session_leg and route_of_leg, plan/route.h)
    GemmLtMode gemm_lt = kGemmLtOn;
    bool fuse_groups = true;     // one GEMM per prewarmed group of projections sharing an input
    bool f16_producers = true;   // the act16 route where every matrix has its fp16 copy
    bool fuse_qk_rope = true;    // where qk_norm_rope_kv_supported
    bool fuse_conv_norm = true;  // where gdn_conv1d_l2norm_supported
    bool varlen = true;          // a many-sequence step's GDN conv and delta rule in one launch each
    bool graphs = true;          // CUDA graphs (the option and PREFILL_GRAPH)
    RowForm rows;
    int32_t gdn_scan = PF_GDN_SCAN_AUTO;  // a session chunk's delta-rule path (gdn_scan_choose)
    GdnChunkPlan gdn;
    int32_t attn_path = PF_ATTN_AUTO;     // pf_attn_path
    int32_t attn_kernel = PF_ATTN_KERNEL_AUTO;  // resolved by attention_resolved_kernel per call
    int32_t kv_dtype = PF_KV_F16;
    // The f16 leg on a matrix without an fp16 copy reads its GGUF blocks (tuning.gemm_blocks, where
    // the device runs that GEMM: model_exec_plan asks), the weight form F16Blocks (plan/route.h).
    bool gemm_blocks = false;
    // Under gemm_blocks, calls of at least this many rows dequantize the blocks into an fp16 slab
    // and run the cache's GEMM on it (tuning.gemm_blocks_slab_rows resolved: blocks_slab_rows()).
    int64_t blocks_slab_rows = INT64_MAX;
    // Under gemm_blocks, calls of at most this many rows on Q4_K / Q5_K / Q6_K blocks run the GEMV form
    // (tuning.gemm_blocks_gemv_rows resolved: blocks_gemv_rows(); 0: never).
    int64_t blocks_gemv_rows = 0;
    // F16Blocks at the slab rows: slab buffers filled ahead on a stream of their own (tuning
    // gemm_blocks_ring resolved; 0: the slabs in line).
    int32_t blocks_ring = 0;
};

// The rows from which the blocks leg runs per-call fp16 slabs (tuning.gemm_blocks_slab_rows: 0 =
// kBlocksSlabRows, -1 = never: INT64_MAX).
int64_t blocks_slab_rows(const pf_tuning &t);
// The rows up to which the blocks leg runs the GEMV form on Q4_K / Q5_K / Q6_K (tuning.gemm_blocks_gemv_rows:
// 0 = kBlocksGemvRows, -1 = never: 0).
int64_t blocks_gemv_rows(const pf_tuning &t);

// The plan of a session with `leg` (PF_GEMM_DEFAULT = the process default), `tuning` (already
// merged over the model's and the context's) and its options' attention path, KV dtype and graphs.
ExecPlan exec_plan(int32_t leg, const pf_tuning &tuning, int32_t attn_path, int32_t kv_dtype,
                   bool graphs);
// One line describing the plan (PREFILL_LOG=plan).
void exec_plan_describe(const ExecPlan &p, char *buf, size_t size);

// ------------------------------------------------------------------ the leg

// A pf_gemm_leg value where one is asked for (`arg` of `fn`): PF_GEMM_DEFAULT .. PF_GEMM_INT8, or
// without INT8 where the 8-bit leg cannot be asked for (the process default). INVALID_ARGUMENT
// naming the argument otherwise. The one range check of a leg.
pf_status leg_check(int32_t leg, bool int8, const char *fn, const char *arg);
// The process default leg: the pf_gemm_set_default_leg override, else PREFILL_GEMM.
int32_t gemm_default_leg();
pf_status set_gemm_default_leg(int32_t leg);
// `leg` with PF_GEMM_DEFAULT replaced by the process default: done once, where a plan is built
// (exec_plan; a kernel-level projection's entry), so that nothing below sees DEFAULT.
inline int32_t resolve_default_leg(int32_t leg) { return leg == PF_GEMM_DEFAULT ? gemm_default_leg() : leg; }

}  // namespace pf
