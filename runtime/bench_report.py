"""What `seq2onnx bench` shows of its cells: a progress line per cell, the model in a line, every cell as a table,
the headline (each side at its best thread count), and a latency plot."""
from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import numpy as np

from .defaults import FP32

CPUINFO = Path("/proc/cpuinfo")


def cpu_model() -> tuple[str, set[str]]:
    """This machine's CPU model name and flags, from /proc/cpuinfo ('unknown' and none where there is none): the
    benchmarks print them, since a figure holds for one CPU."""
    info = CPUINFO.read_text() if CPUINFO.exists() else ""
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in info.splitlines() if ":" in line)}
    return fields.get("model name", "unknown"), set(fields.get("flags", "").split())


def best_rows(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (provider, loop, batch, source_len, target_len, beam): each side at its fastest thread count."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in cells:
        if c["torch"] is not None:
            key = (c["provider"], c["loop"], c["batch"], c["source_len"], c["target_len"], c["beam"])
            groups.setdefault(key, []).append(c)
    rows = []
    for (provider, loop, batch, source_len, target_len, beam), group in groups.items():
        ort = min(group, key=lambda c: c["ort"]["median_ms"])
        eager = min(group, key=lambda c: c["torch"]["median_ms"])
        rows.append({"provider": provider, "loop": loop, "batch": batch, "source_len": source_len,
                     "target_len": target_len, "beam": beam, "ort_threads": ort["threads"],
                     "ort_median_ms": ort["ort"]["median_ms"], "torch_threads": eager["threads"],
                     "torch_median_ms": eager["torch"]["median_ms"],
                     "speedup": eager["torch"]["median_ms"] / ort["ort"]["median_ms"]})
    return rows


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _rate(value: float) -> str:
    """A rate in a 9-wide column: 4 significant digits below 1000, whole numbers up to 9 digits (not 1.339e+04)."""
    return f"{value:.4g}" if value < 1e3 else f"{value:.0f}" if value < 1e9 else f"{value:.3e}"


def progress(record: dict[str, Any]) -> str:
    """'ort 1.23 ms (p90 1.4), floor 0.9 ms, torch 20.1 ms: 16.3x' (and a note when token counts differ)."""
    ort, floor = record["ort"], record["floor"]
    line = f"ort {ort['median_ms']:.4g} ms (p90 {ort['p90_ms']:.4g}), floor {floor['median_ms']:.4g} ms"
    if record["torch"] is not None:
        line += f", torch {record['torch']['median_ms']:.4g} ms: {record['speedup']:.2f}x"
        if "torch_search" in record:
            line += f" (torch search {record['torch_search']['median_ms']:.4g} ms)"
        if record["torch"]["tokens"] != ort["tokens"]:
            line += f" (note: torch produced {record['torch']['tokens']} tokens, onnxruntime {ort['tokens']})"
    return line


def describe_model(spec: Any, precision: str = FP32) -> str:
    """'tokens model: gru, hidden 128, dot attention' (or a transformer's d_model and layers), and ', int8 weights'
    (or fp16) where the export was converted."""
    weights = "" if precision == FP32 else f", {precision} weights"
    if spec.is_declared:
        return (f"declared tokens model (its own architecture; vocabularies {spec.source_vocab_size} and "
                f"{spec.target_vocab_size}){weights}")
    body = f"transformer d_model {spec.d_model}, {spec.layers}+{spec.layers} layers" if spec.is_transformer else (
        f"{spec.cell}, hidden {spec.hidden_dim}, {spec.attention} attention")
    return f"{spec.kind} model: {body}{weights}"


def format_table(doc: dict[str, Any]) -> str:
    """Every cell, one line each: onnxruntime, the per-call floor, and PyTorch eager with the ratio. A point
    model's output rate is in points a second."""
    rate = "pts/s" if doc.get("kind") == "points" else "tok/s"
    head = (f"{'provider':<8} {'thr':>3} {'loop':<5} {'batch':>5} {'src':>5} {'tgt':>5} {'beam':>4} | {'ort ms':>8} "
            f"{'p90 ms':>8} {'seq/s':>9} {rate:>9} | {'floor ms':>8} {'calls':>5} | {'torch ms':>8} {'p90 ms':>8} "
            f"{'speed-up':>8}")
    lines = [head, "-" * len(head)]
    for c in doc["cells"]:
        ort, floor, eager = c["ort"], c["floor"], c["torch"] or {}
        speedup = "-" if c["speedup"] is None else f"{c['speedup']:.2f}x"
        lines.append(f"{c['provider']:<8} {c['threads']:>3} {c['loop']:<5} {c['batch']:>5} {c['source_len']:>5} "
                     f"{c['target_len']:>5} {c['beam'] or '-':>4} | {_ms(ort['median_ms']):>8} {_ms(ort['p90_ms']):>8} "
                     f"{_rate(ort['sequences_per_s']):>9} {_rate(ort['tokens_per_s']):>9} | "
                     f"{_ms(floor['median_ms']):>8} {floor['calls']:>5} | {_ms(eager.get('median_ms')):>8} "
                     f"{_ms(eager.get('p90_ms')):>8} {speedup:>8}")
    return "\n".join(lines)


def format_best(rows: list[dict[str, Any]]) -> str:
    """The headline: per cell, PyTorch at its best thread count over onnxruntime at its best."""
    head = (f"{'provider':<8} {'loop':<5} {'batch':>5} {'src':>5} {'tgt':>5} {'beam':>4} | {'ort ms':>8} {'thr':>3} | "
            f"{'torch ms':>8} {'thr':>3} | {'speed-up':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['provider']:<8} {r['loop']:<5} {r['batch']:>5} {r['source_len']:>5} {r['target_len']:>5} "
                     f"{r['beam'] or '-':>4} | {_ms(r['ort_median_ms']):>8} {r['ort_threads']:>3} | "
                     f"{_ms(r['torch_median_ms']):>8} {r['torch_threads']:>3} | {r['speedup']:>7.2f}x")
    return "\n".join(lines)


def plot_latency(cells: list[dict[str, Any]], title: str, f: IO[bytes]) -> None:
    """PNG of median latency (bars up to p90) against batch size: one line per setting, PyTorch dashed."""
    from .plot import require_matplotlib

    require_matplotlib()
    from matplotlib.figure import Figure

    series: dict[tuple, list[dict[str, Any]]] = {}
    for c in cells:
        key = (c["provider"], c["threads"], c["loop"], c["source_len"], c["target_len"], c["beam"])
        series.setdefault(key, []).append(c)
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.subplots()
    for (provider, threads, loop, source_len, target_len, beam), group in series.items():
        group = sorted(group, key=lambda c: c["batch"])
        shape = f"src {source_len} tgt {target_len}" + (f" beam {beam}" if beam else "")
        colour = None  # PyTorch's line takes the colour of onnxruntime's for the same setting
        # the loop is onnxruntime's; PyTorch runs its own decode, timed beside that loop's row
        for side, style, name in (("ort", "-o", f"onnxruntime: {provider} {threads}t {loop} loop"),
                                  ("torch", "--s", f"PyTorch eager: {provider} {threads}t, beside the {loop} loop")):
            if group[0][side] is None:
                continue
            median = np.array([c[side]["median_ms"] for c in group])  # (B,)
            spread = np.array([c[side]["p90_ms"] for c in group]) - median  # (B,)
            drawn = ax.errorbar([c["batch"] for c in group], median, yerr=[np.zeros_like(spread), spread], fmt=style,
                                capsize=3, color=colour, label=f"{name}, {shape}")
            colour = drawn[0].get_color()
    ax.set_xscale("log", base=2)
    batches = sorted({c["batch"] for c in cells})
    ax.set_xticks(batches, [str(b) for b in batches])  # the batch sizes measured, as plain numbers
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("decode latency, ms (median; bar to p90)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small")
    ax.set_title(title, fontsize="medium")
    fig.savefig(f, format="png", dpi=100)
