// plan.cpp — the environment's deployment knobs (one parser), the tuning fields and the
// execution plan (plan.h).
#include "plan/plan.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "base/error.h"
#include "plan/defaults.h"

namespace pf {
namespace {

std::string lower(const char *v) {
    std::string s(v);
    for (char &c : s) c = char(std::tolower((unsigned char)c));
    return s;
}

void warn(const char *name, const char *value, const char *expected, const char *meaning) {
    std::fprintf(stderr, "libprefill: warning: %s=\"%.64s\" is not %s; %s\n", name, value, expected,
                 meaning);
}

// The value of an environment variable, nullptr when unset or empty.
const char *env(const char *name) {
    const char *v = std::getenv(name);
    return v && *v ? v : nullptr;
}

bool env_bool(const char *name, bool dflt) {
    const char *v = env(name);
    if (!v) return dflt;
    const int b = parse_bool(v);
    if (b < 0) {
        warn(name, v, "a boolean (1/0, on/off, true/false, yes/no)", dflt ? "keeping on" : "keeping off");
        return dflt;
    }
    return b == 1;
}

EnvKnobs read_env() {
    EnvKnobs k;
    if (const char *v = env("PREFILL_GEMM")) {
        const std::string s = lower(v);
        if (s == "f16") k.gemm_leg = PF_GEMM_F16;
        else if (s == "f32") k.gemm_leg = PF_GEMM_F32;
        else if (s == "auto") k.gemm_leg = PF_GEMM_AUTO;
        else if (s == "int8")
            std::fprintf(stderr, "libprefill: warning: PREFILL_GEMM=int8: the 8-bit leg is opt-in per "
                                 "model or session (gemm_leg), never the process default; using auto\n");
        else
            warn("PREFILL_GEMM", v, "one of f16|f32|auto", "using auto");
    }
    k.graphs = env_bool("PREFILL_GRAPH", true);
    k.gemm_lt = env_bool("PREFILL_GEMM_LT", true);
    if (const char *v = env("PREFILL_LOG")) {
        const std::string s = lower(v);
        size_t at = 0;
        bool bad = false;
        while (at <= s.size()) {
            const size_t end = std::min(s.find(',', at), s.size());
            const std::string item = s.substr(at, end - at);
            if (item == "gemm") k.log |= kLogGemm;
            else if (item == "plan") k.log |= kLogPlan;
            else if (item == "ring") k.log |= kLogRing;
            else if (item == "all" || parse_bool(item.c_str()) == 1) k.log |= kLogGemm | kLogPlan | kLogRing;
            else if (!item.empty() && parse_bool(item.c_str()) != 0) bad = true;
            at = end + 1;
        }
        if (bad) warn("PREFILL_LOG", v, "a list of gemm, plan, ring, all", "ignoring the unknown items");
    }
    return k;
}

std::once_flag g_env_once;
EnvKnobs g_env;
std::atomic<int32_t> g_override_leg{PF_GEMM_DEFAULT};  // PF_GEMM_DEFAULT = no override

}  // namespace

int parse_bool(const char *v) {
    if (!v) return -1;
    const std::string s = lower(v);
    if (s == "1" || s == "on" || s == "true" || s == "yes") return 1;
    if (s == "0" || s == "off" || s == "false" || s == "no") return 0;
    return -1;
}

const EnvKnobs &env_knobs() {
    std::call_once(g_env_once, [] { g_env = read_env(); });
    return g_env;
}

bool log_enabled(LogTopic topic) { return (env_knobs().log & topic) != 0; }

int32_t gemm_default_leg() {
    const int32_t o = g_override_leg.load();
    return o != PF_GEMM_DEFAULT ? o : env_knobs().gemm_leg;
}

pf_status leg_check(int32_t leg, bool int8, const char *fn, const char *arg) {
    const int32_t hi = int8 ? PF_GEMM_INT8 : PF_GEMM_F16;
    PF_CHECK_ARG(leg >= PF_GEMM_DEFAULT && leg <= hi, "%s: %s=%d is not a pf_gemm_leg (%d..%d%s)", fn, arg, int(leg),
                 int(PF_GEMM_DEFAULT), int(hi),
                 int8 ? "" : "; the 8-bit leg is opt-in per model or session, never the process default");
    return PF_STATUS_OK;
}

pf_status set_gemm_default_leg(int32_t leg) {
    PF_TRY(leg_check(leg, false, "pf_gemm_set_default_leg", "leg"));
    (void)env_knobs();  // a bad PREFILL_GEMM still warns once
    g_override_leg.store(leg);
    return PF_STATUS_OK;
}

// ------------------------------------------------------------------ tuning

pf_tuning tuning_over(const pf_tuning &top, const pf_tuning &base) {
    pf_tuning t = base;
    auto over = [](auto &dst, auto v) {
        if (v != 0) dst = v;
    };
    over(t.gemm_lt, top.gemm_lt);
    over(t.fuse_groups, top.fuse_groups);
    over(t.f16_producers, top.f16_producers);
    over(t.row_form, top.row_form);
    over(t.fuse_qk_rope, top.fuse_qk_rope);
    over(t.fuse_conv_norm, top.fuse_conv_norm);
    over(t.gdn_scan, top.gdn_scan);
    over(t.gdn_state, top.gdn_state);
    over(t.gdn_subpass_rows, top.gdn_subpass_rows);
    over(t.gdn_pdl, top.gdn_pdl);
    over(t.attn_kernel, top.attn_kernel);
    over(t.prewarm_fail_piece, top.prewarm_fail_piece);
    over(t.prewarm_piece_bytes, top.prewarm_piece_bytes);
    over(t.varlen, top.varlen);
    over(t.gemm_blocks, top.gemm_blocks);
    over(t.gemm_blocks_slab_rows, top.gemm_blocks_slab_rows);
    over(t.gemm_blocks_gemv_rows, top.gemm_blocks_gemv_rows);
    over(t.prewarm_cache_rows, top.prewarm_cache_rows);
    over(t.prewarm_cache_margin, top.prewarm_cache_margin);
    over(t.gemm_blocks_ring, top.gemm_blocks_ring);
    return t;
}

pf_status tuning_check(const pf_tuning &t, const char *fn) {
    auto in = [](int32_t v, int32_t hi) { return v >= 0 && v <= hi; };
    PF_CHECK_ARG(in(t.gemm_lt, PF_GEMM_LT_FORCE), "%s: tuning.gemm_lt=%d is not a pf_gemm_lt_mode", fn,
                 t.gemm_lt);
    const struct { int32_t v; const char *name; } switches[] = {
        {t.fuse_groups, "fuse_groups"}, {t.f16_producers, "f16_producers"}, {t.fuse_qk_rope, "fuse_qk_rope"},
        {t.fuse_conv_norm, "fuse_conv_norm"}, {t.gdn_pdl, "gdn_pdl"}, {t.varlen, "varlen"},
        {t.gemm_blocks, "gemm_blocks"}};
    for (const auto &s : switches)
        PF_CHECK_ARG(in(s.v, PF_SWITCH_OFF), "%s: tuning.%s=%d is not a pf_switch (0 default, 1 on, 2 off)",
                     fn, s.name, s.v);
    PF_CHECK_ARG(in(t.row_form, PF_ROW_FORM_RECOMPUTE), "%s: tuning.row_form=%d is not a pf_row_form", fn,
                 t.row_form);
    PF_CHECK_ARG(in(t.gdn_scan, PF_GDN_SCAN_CHUNKED), "%s: tuning.gdn_scan=%d is not a pf_gdn_scan_path", fn,
                 t.gdn_scan);
    PF_CHECK_ARG(in(t.gdn_state, PF_GDN_STATE_WARPGROUP_PAIR), "%s: tuning.gdn_state=%d is not a "
                 "pf_gdn_state_kernel", fn, t.gdn_state);
    PF_CHECK_ARG(t.gdn_subpass_rows == -1 || (t.gdn_subpass_rows >= 0 && t.gdn_subpass_rows % 64 == 0 &&
                                              t.gdn_subpass_rows <= kGdnPassRows),
                 "%s: tuning.gdn_subpass_rows=%d (0 default, -1 one pass, else a multiple of 64 up to "
                 "%lld)", fn, t.gdn_subpass_rows, (long long)kGdnPassRows);
    PF_CHECK_ARG(in(t.attn_kernel, PF_ATTN_KERNEL_WGMMA), "%s: tuning.attn_kernel=%d is not a pf_attn_kernel",
                 fn, t.attn_kernel);
    PF_CHECK_ARG(t.gemm_blocks_slab_rows == -1 || t.gemm_blocks_slab_rows == 0 || t.gemm_blocks_slab_rows >= 2,
                 "%s: tuning.gemm_blocks_slab_rows=%d (0 default, -1 never, else rows >= 2)", fn,
                 t.gemm_blocks_slab_rows);
    PF_CHECK_ARG(t.gemm_blocks_gemv_rows >= -1 && t.gemm_blocks_gemv_rows <= kBlocksGemvMaxRows,
                 "%s: tuning.gemm_blocks_gemv_rows=%d (0 default, -1 never, else rows 1..%d)", fn,
                 t.gemm_blocks_gemv_rows, kBlocksGemvMaxRows);
    PF_CHECK_ARG(t.prewarm_cache_rows >= -1 && t.prewarm_cache_rows <= kPrewarmCacheMaxRows,
                 "%s: tuning.prewarm_cache_rows=%d (0 default, -1 no rule, else rows 1..%d)", fn,
                 t.prewarm_cache_rows, int(kPrewarmCacheMaxRows));
    PF_CHECK_ARG(t.prewarm_cache_margin >= 0 && t.prewarm_cache_margin <= kPrewarmCacheMaxMargin,
                 "%s: tuning.prewarm_cache_margin=%d (0 default, else percent 1..%d)", fn,
                 t.prewarm_cache_margin, int(kPrewarmCacheMaxMargin));
    PF_CHECK_ARG(t.gemm_blocks_ring == -1 || t.gemm_blocks_ring == 0 ||
                     (t.gemm_blocks_ring >= 2 && t.gemm_blocks_ring <= kBlocksRingMax),
                 "%s: tuning.gemm_blocks_ring=%d (0 default, -1 off, else buffers 2..%d)", fn, t.gemm_blocks_ring,
                 int(kBlocksRingMax));
    PF_CHECK_ARG(t.prewarm_fail_piece >= 0, "%s: tuning.prewarm_fail_piece=%d must be >= 0", fn,
                 t.prewarm_fail_piece);
    PF_CHECK_ARG(t.prewarm_piece_bytes >= -1, "%s: tuning.prewarm_piece_bytes=%lld (0 default, -1 one "
                 "allocation, else bytes)", fn, (long long)t.prewarm_piece_bytes);
    return PF_STATUS_OK;
}

RowForm row_form(const pf_tuning &t) {
    RowForm f;
    f.regs = t.row_form == PF_ROW_FORM_AUTO;
    f.stage = t.row_form != PF_ROW_FORM_RECOMPUTE;
    return f;
}

GdnChunkPlan gdn_chunk_plan(const pf_tuning &t) {
    GdnChunkPlan p;
    p.state = t.gdn_state == PF_GDN_STATE_WARP        ? GdnStateKernel::Warp
              : t.gdn_state == PF_GDN_STATE_WARPGROUP ? GdnStateKernel::Warpgroup
              : t.gdn_state == PF_GDN_STATE_WARPGROUP_PAIR ? GdnStateKernel::WarpgroupPair
                                                      : GdnStateKernel::Auto;
    p.subpass_rows = t.gdn_subpass_rows == 0 ? kGdnSubpassRows : t.gdn_subpass_rows < 0 ? 0 : t.gdn_subpass_rows;
    p.short_subpass_rows = t.gdn_subpass_rows == 0 ? kGdnShortSubpassRows : 0;  // a named size is that size
    p.pdl = switch_on(t.gdn_pdl, true);
    return p;
}

int32_t gdn_scan_choose(int32_t path, int32_t tuned, bool exact, int64_t rows, int32_t dk, int32_t dv) {
    const bool supported = dk == 128 && dv == 128;  // gdn_chunk_supported
    if (path == PF_GDN_SCAN_AUTO) path = tuned;
    if (path == PF_GDN_SCAN_SEQUENTIAL) return PF_GDN_SCAN_SEQUENTIAL;
    if (path == PF_GDN_SCAN_CHUNKED) return supported ? PF_GDN_SCAN_CHUNKED : PF_GDN_SCAN_SEQUENTIAL;
    return supported && !exact && rows >= kGdnChunkMinRows ? PF_GDN_SCAN_CHUNKED : PF_GDN_SCAN_SEQUENTIAL;
}

PrewarmPlan prewarm_plan(const pf_tuning &t) {
    PrewarmPlan p;
    if (t.prewarm_piece_bytes < 0) p.first_piece_bytes = 0;
    else if (t.prewarm_piece_bytes > 0) p.first_piece_bytes = size_t(t.prewarm_piece_bytes);
    p.fail_piece = t.prewarm_fail_piece > 0 ? t.prewarm_fail_piece - 1 : -1;
    p.rule_rows = t.prewarm_cache_rows == 0 ? kDefaultStepRows : t.prewarm_cache_rows < 0 ? 0 : t.prewarm_cache_rows;
    p.rule_margin = (t.prewarm_cache_margin == 0 ? kPrewarmCacheMargin : t.prewarm_cache_margin) / 100.0;
    p.rule_slab_rows = blocks_slab_rows(t);
    p.rule_gemv_rows = blocks_gemv_rows(t);
    return p;
}

GemmLtMode gemm_lt_mode(const pf_tuning &t) {
    switch (t.gemm_lt) {
        case PF_GEMM_LT_ON: return kGemmLtOn;
        case PF_GEMM_LT_OFF: return kGemmLtOff;
        case PF_GEMM_LT_FORCE: return kGemmLtForce;
        default: return env_knobs().gemm_lt ? kGemmLtOn : kGemmLtOff;
    }
}

// ------------------------------------------------------------------ the execution plan

int64_t blocks_slab_rows(const pf_tuning &t) {
    return t.gemm_blocks_slab_rows == 0 ? kBlocksSlabRows : t.gemm_blocks_slab_rows < 0 ? INT64_MAX
                                                                                       : t.gemm_blocks_slab_rows;
}

int64_t blocks_gemv_rows(const pf_tuning &t) {
    return t.gemm_blocks_gemv_rows == 0 ? kBlocksGemvRows : t.gemm_blocks_gemv_rows < 0 ? 0 : t.gemm_blocks_gemv_rows;
}

ExecPlan exec_plan(int32_t leg, const pf_tuning &t, int32_t attn_path, int32_t kv_dtype, bool graphs) {
    ExecPlan p;
    p.leg = resolve_default_leg(leg);
    p.gemm_lt = gemm_lt_mode(t);
    p.fuse_groups = switch_on(t.fuse_groups, true);
    p.f16_producers = switch_on(t.f16_producers, true);
    p.fuse_qk_rope = switch_on(t.fuse_qk_rope, true);
    p.fuse_conv_norm = switch_on(t.fuse_conv_norm, true);
    p.varlen = switch_on(t.varlen, true);
    p.gemm_blocks = switch_on(t.gemm_blocks, true);  // sessions: on (kernel-level calls: off, api_gemm.cu)
    p.blocks_ring = t.gemm_blocks_ring > 0 ? t.gemm_blocks_ring : t.gemm_blocks_ring < 0 ? 0 : kBlocksRingDefault;
    p.blocks_slab_rows = blocks_slab_rows(t);
    p.blocks_gemv_rows = blocks_gemv_rows(t);
    p.graphs = graphs && env_knobs().graphs;
    p.rows = row_form(t);
    p.gdn_scan = t.gdn_scan;
    p.gdn = gdn_chunk_plan(t);
    p.attn_path = attn_path;
    p.attn_kernel = t.attn_kernel;
    p.kv_dtype = kv_dtype;
    return p;
}

void exec_plan_describe(const ExecPlan &p, char *buf, size_t size) {
    static const char *legs[] = {"default", "auto", "f32", "f16", "int8"};
    static const char *scans[] = {"auto", "sequential", "chunked"};
    static const char *states[] = {"auto", "warp", "warpgroup", "warpgroup_pair"};
    static const char *attn[] = {"auto", "cublas", "flash"};
    static const char *kern[] = {"auto", "mma", "wgmma"};
    std::snprintf(buf, size,
                  "leg=%s gemm_lt=%s fuse_groups=%d f16_producers=%d qk_rope=%d conv_norm=%d graphs=%d "
                  "rows=%s gdn_scan=%s gdn_state=%s subpass=%lld pdl=%d varlen=%d attn=%s kernel=%s kv=%s "
                  "blocks=%d slab_rows=%lld gemv_rows=%lld",
                  legs[std::clamp(p.leg, 0, 4)],
                  p.gemm_lt == kGemmLtOff ? "off" : p.gemm_lt == kGemmLtForce ? "force" : "on",
                  int(p.fuse_groups), int(p.f16_producers), int(p.fuse_qk_rope), int(p.fuse_conv_norm),
                  int(p.graphs), p.rows.regs ? "regs" : p.rows.stage ? "staged" : "recompute",
                  scans[std::clamp(p.gdn_scan, 0, 2)], states[int(p.gdn.state)],
                  (long long)p.gdn.subpass_rows, int(p.gdn.pdl), int(p.varlen), attn[std::clamp(p.attn_path, 0, 2)],
                  kern[std::clamp(p.attn_kernel, 0, 2)], p.kv_dtype == PF_KV_F32 ? "f32" : "f16",
                  int(p.gemm_blocks), (long long)(p.blocks_slab_rows == INT64_MAX ? -1 : p.blocks_slab_rows),
                  (long long)p.blocks_gemv_rows);
}

}  // namespace pf
