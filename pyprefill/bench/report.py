"""Results as Markdown tables, JSON files and a plot. Pure functions of the result rows (no
device, no library), so the tests feed them synthetic rows."""
from __future__ import annotations

import json
from pathlib import Path


def _f(x, fmt: str = "{:.1f}") -> str:
    return "" if x is None else fmt.format(x)


def kernels_table(rows: list[dict]) -> str:
    lines = ["Kernels. Ours: host clock around a batch of calls + Context.synchronize() (the "
             "library's stream), per-call median of the batches; torch/FLA: CUDA events. Inputs "
             "random, rotated past 2x L2 (sets). ratio = peer time / our time (> 1: ours faster).",
             "",
             "| op | T | impl | median ms | std ms | TF/s | GB/s | ratio vs peer | sets | note |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['T']} | {r['impl']} | {r['median_ms']:.4f} | "
                     f"{_f(r.get('std_ms'), '{:.4f}')} | {_f(r.get('tflops'))} | "
                     f"{_f(r.get('gbps'))} | "
                     f"{_f(r.get('ratio_vs_peer'), '{:.2f}')} | {_f(r.get('sets'), '{}')} | "
                     f"{r.get('note', '')} |")
    return "\n".join(lines)


def model_table(rows: list[dict], peak_tflops: float | None = None) -> str:
    lines = ["Whole-model prefill (wall clock incl. logits to host, median of the repeats). "
             f"Roofline = measured torch fp16 peak ({_f(peak_tflops)} TF/s) / (2 x non-embedding "
             "params). Prewarm % copy: its bytes read + written over its wall time, against the "
             "device-to-device copy measured in the same run. Device GiB: what the context holds "
             "(weights, caches, sessions, scratch); weights GiB: the GGUF's matrices on the device; "
             "fp16 cache GiB: their fp16 copies (0 where the f16 leg reads the blocks).", "",
             "| model | impl | T | median ms | tok/s | ± std | vs HF | roofline tok/s | "
             "% roofline | load ms | prewarm ms | prewarm % copy | device GiB | weights GiB | "
             "fp16 cache GiB | error |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    gib = lambda b: _f(b / 2**30 if b is not None else None, "{:.2f}")  # noqa: E731
    for r in rows:
        mem = r.get("allocated_bytes") or r.get("peak_bytes")
        lines.append(
            f"| {r['model']} | {r['impl']} | {r['T']} | {_f(r.get('median_ms'), '{:.2f}')} | "
            f"{_f(r.get('tok_s'), '{:.0f}')} | {_f(r.get('tok_s_std'), '{:.0f}')} | "
            f"{_f(r.get('ratio_vs_hf'), '{:.2f}')} | {_f(r.get('roofline_tok_s'), '{:.0f}')} | "
            f"{_f(r.get('pct_roofline'))} | {_f(r.get('load_ms'), '{:.0f}')} | "
            f"{_f(r.get('prewarm_ms'), '{:.1f}')} | {_f(r.get('prewarm_pct_copy'), '{:.0f}')} | "
            f"{gib(mem)} | {gib(r.get('weight_bytes'))} | "
            f"{gib(r.get('f16_bytes'))} | "
            f"{r.get('error', '')} |")
    return "\n".join(lines)


def _rate(r: dict) -> str:
    if r.get("tok_s") is None:
        return f"error: {r.get('error', '?')}"
    return f"{r['tok_s']:.2f} ± {r.get('tok_s_std', 0.0):.2f}"


def llama_table(rows: list[dict]) -> str:
    """llama-bench's layout: one line per (our leg, prompt length), test "pp<T>" (decode rows:
    "tg<N> @ d<T>"), t/s ± std; the HF peer's t/s and ours / HF alongside when the rows hold a
    peer (prefill rows)."""
    ours = [r for r in rows if r["impl"].startswith("ours")]
    peers = {(r["model"], r["T"]): r for r in rows if not r["impl"].startswith("ours")}
    head = ["model", "size", "params", "backend", "test", "t/s"]
    align = ["---", "---:", "---:", "---", "---:", "---:"]
    if peers:
        name = next(iter(peers.values()))["impl"]
        head += [f"{name} t/s", "ours / HF"]
        align += ["---:", "---:"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    for r in ours:
        decode = r.get("decode_tokens")   # llama-bench's "tg<N> @ d<depth>": N steps after T tokens
        cells = [r["model"], _f(r.get("size_bytes") and r["size_bytes"] / 2**30, "{:.2f} GiB"),
                 _f(r.get("params") and r["params"] / 1e9, "{:.2f} B"),
                 f"CUDA pyprefill {r['impl'].removeprefix('ours ')}",
                 f"tg{decode} @ d{r['T']}" if decode else f"pp{r['T']}", _rate(r)]
        if peers:
            p = None if decode else peers.get((r["model"], r["T"]))
            cells += [_rate(p) if p else "", _f(r.get("ratio_vs_hf"), "{:.2f}")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(out: str | None, name: str, data: dict, table: str) -> None:
    """bench_<name>.json (everything, every repeat) and bench_<name>.md under `out`."""
    if not out:
        return
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"bench_{name}.json").write_text(json.dumps(data, indent=1, default=str))
    (d / f"bench_{name}.md").write_text(table + "\n")


def plot(rows: list[dict], path: str, rec) -> bool:
    """tok/s against prompt length, ours (each leg) and each peer, one panel per model (the
    roofline dotted when the rows carry it). Needs
    matplotlib (the `plot` extra): without it, one skipped line. True when a file was written."""
    series: dict[str, dict[str, list]] = {}
    for r in rows:
        if r.get("tok_s") is not None and "model" in r:
            series.setdefault(r["model"], {}).setdefault(r["impl"], []).append((r["T"], r["tok_s"]))
    if not series:
        rec.skip("plot", "no whole-model rows to draw")
        return False
    mpl = rec.optional("matplotlib", "plot")
    if mpl is None:
        return False
    mpl.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter
    fig, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 4), squeeze=False)
    roofs = {r["model"]: r["roofline_tok_s"] for r in rows if r.get("roofline_tok_s")}
    for ax, (model, impls) in zip(axes[0], series.items()):
        if model in roofs:
            ax.axhline(roofs[model], linestyle=":", color="gray", label="roofline")
        for impl, points in impls.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                    linestyle="-" if impl.startswith("ours") else "--", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({p[0] for pts in impls.values() for p in pts}))
        ax.get_xaxis().set_major_formatter(ScalarFormatter())
        ax.set(title=model, xlabel="prompt tokens", ylabel="prefill tokens/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    rec.say(f"-- plot: {path}")
    return True
