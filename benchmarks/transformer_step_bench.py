"""Transformer decoding cost per token: the cached step against recomputing the whole prefix, onnxruntime and PyTorch.

    python benchmarks/transformer_step_bench.py [--lengths 1,10,50,100,200] [--batch 1 --batch 16] [--threads 1]
                                                [--decode-length 200] [--plot cost.png] [--force] [--json]

One seeded, untrained TransformerSeq2Seq (default d_model 64, 2 encoder + 2 decoder layers, 4 heads, d_ff 256,
vocabularies of 40, sources of 20 ids). `t` is the output token being decoded (1 = the first, after BOS): it reads
the prefix BOS + t - 1 tokens. Four ways to compute its log-probs, each timed as one call at that t:
  ort cached      decoder_step.onnx from export_graphs, fed a cache of past_len t - 1 built by stepping it
  ort uncached    an ONNX graph of TransformerSeq2Seq.decode_sequence over the prefix (N, t), last position's
                  log-probs (exported here from PrefixGraph, same weights, same cross keys/values)
  torch cached    model.step with the cache of length t - 1, built by stepping model.step
  torch uncached  model.decode_sequence over the prefix, last position
Every variant's log-probs at every t are checked against torch cached (LOG_PROB_ATOL) before timing. Feeds are built
once per t, outside the timed region. Per t, ROUNDS rounds: in each, every variant in turn runs WARMUP untimed calls
and then its share of --repeats timed calls back to back, as a decode loop would. Figures are the median and the
90th percentile of the --repeats calls.
The cached step's cost grows linearly in t too (it attends over t entries and returns the grown cache, a copy of
layers x N x d_model x t floats each for keys and values), with a slope small next to its fixed matmuls at batch 1;
the uncached graph reruns every layer over t positions (and attends t x t).
Then a forced greedy decode of --decode-length tokens (EOS ignored), total wall time: cached (TokenSteps.step, or
model.step) against uncached (the prefix graph or decode_sequence once per token, prefix growing).
Threads: torch.set_num_threads and onnxruntime's intra_op_num_threads both get --threads, in this one process.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np
import onnx
import onnxruntime as ort
import torch
from bench_outputs import PNG, check_click, publish
from torch import nn

from export.examples import EXAMPLE_BATCH, EXAMPLE_LENGTHS, EXAMPLE_SOURCE_LEN
from export.graphs import dynamic_axes, export_graphs
from runtime.binding import SessionRunner
from runtime.contract import (
    BATCH,
    DECODER_STEP_FILE,
    ENCODER_FILE,
    SOURCE_LEN,
    graph_io,
)
from runtime.defaults import DEFAULT_OPSET
from runtime.sessions import open_session
from runtime.spec import N_SPECIAL_TOKENS, ModelSpec
from runtime.token_steps import TokenSteps
from training.tokens.base import BOS_ID
from training.tokens.transformer import TransformerSeq2Seq

VARIANTS = ("ort cached", "ort uncached", "torch cached", "torch uncached")
PREFIX_FILE = "prefix_decoder.onnx"
PREFIX_LEN = "prefix_len"
PREFIX_INPUTS = {"target_ids": [BATCH, PREFIX_LEN], "cross_keys": [None, BATCH, None, SOURCE_LEN, None],
                 "cross_values": [None, BATCH, None, SOURCE_LEN, None], "source_mask": [BATCH, SOURCE_LEN]}
PREFIX_OUTPUTS = {"log_probs": [BATCH, None]}
EXAMPLE_PREFIX = 4  # >= 2, as export.graphs' example batch and source, so the tracer cannot bake it in
WARMUP = 5  # untimed calls of a variant before each block of timed ones
ROUNDS = 5  # blocks per variant and t
LOG_PROB_ATOL = 1e-4  # float32 over a few layers; a wrong cache or mask is off by far more
Row = dict[str, Any]


class PrefixGraph(nn.Module):
    """The uncached decoder: target_ids (N, t) and the encoder's cross keys/values, mask -> log_probs (N, V) of the
    last position, recomputing every layer over the whole prefix."""

    def __init__(self, model: TransformerSeq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, target_ids: torch.Tensor, cross_keys: torch.Tensor, cross_values: torch.Tensor,
                source_mask: torch.Tensor) -> torch.Tensor:
        state = {"cross_keys": cross_keys, "cross_values": cross_values, "source_mask": source_mask}
        return self.model.decode_sequence(state, target_ids)[:, -1]  # (N, V)


def export_prefix_graph(model: TransformerSeq2Seq, path: Path) -> None:
    """Export PrefixGraph with symbolic batch, prefix and source dims, and check that they stayed symbolic."""
    spec, gen = model.spec, torch.Generator().manual_seed(0)
    source = torch.randint(N_SPECIAL_TOKENS, spec.source_vocab_size, (EXAMPLE_BATCH, EXAMPLE_SOURCE_LEN),
                           generator=gen)  # (N, Ls)
    with torch.no_grad():
        state = model.encode(source, torch.tensor(EXAMPLE_LENGTHS))
    target = torch.randint(N_SPECIAL_TOKENS, spec.target_vocab_size, (EXAMPLE_BATCH, EXAMPLE_PREFIX), generator=gen)
    args = (target, state["cross_keys"], state["cross_values"], state["source_mask"])
    graph = PrefixGraph(model).eval()
    with torch.no_grad():
        out = graph(*args)
    assert out.shape == (EXAMPLE_BATCH, spec.target_vocab_size), out.shape
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about python ints; the dims are checked below
        torch.onnx.export(graph, args, str(path), input_names=list(PREFIX_INPUTS), output_names=list(PREFIX_OUTPUTS),
                          dynamic_axes={**dynamic_axes(PREFIX_INPUTS), **dynamic_axes(PREFIX_OUTPUTS)},
                          opset_version=DEFAULT_OPSET, dynamo=False, do_constant_folding=True)
    saved = onnx.load(str(path)).graph
    for value in [*saved.input, *saved.output]:
        dims = value.type.tensor_type.shape.dim
        declared = {**PREFIX_INPUTS, **PREFIX_OUTPUTS}[value.name]
        fixed = [want for d, want in zip(dims, declared) if isinstance(want, str) and d.HasField("dim_value")]
        assert not fixed, f"{PREFIX_FILE}: {value.name} has fixed dims {fixed}"


class Bench:
    """The model, its three ONNX sessions and one batch's encoder state, with a feed for every variant at any t."""

    def __init__(self, model: TransformerSeq2Seq, out: Path, threads: int, batch: int, source_len: int,
                 lengths: list[int]) -> None:
        self.model, spec = model, model.spec
        sessions = {name: open_session((out / name).read_bytes(), "cpu", threads, name)
                    for name in (ENCODER_FILE, DECODER_STEP_FILE, PREFIX_FILE)}
        io = graph_io(spec)
        self.steps = TokenSteps(spec, *(SessionRunner(sessions[name], list(io[name]["outputs"]), name)
                                        for name in (ENCODER_FILE, DECODER_STEP_FILE)))
        self.step_session, self.prefix_session = sessions[DECODER_STEP_FILE], sessions[PREFIX_FILE]
        self.step_outputs = list(graph_io(spec)[DECODER_STEP_FILE]["outputs"])
        rng = np.random.default_rng(batch)
        source = rng.integers(N_SPECIAL_TOKENS, spec.source_vocab_size, (batch, source_len))  # (N, Ls)
        source_lengths = np.full(batch, source_len)
        self.ort_state = self.steps.encode(source, source_lengths)
        with torch.inference_mode():
            self.torch_state = model.encode(torch.from_numpy(source), torch.from_numpy(source_lengths))
        # prefix (N, max t): BOS then the ORT greedy choices, so every variant reads the same tokens
        keep = {t - 1 for t in lengths}
        self.prefix, self.ort_caches = greedy_ort(self.steps, self.ort_state, batch, max(lengths), keep)
        self.torch_caches = torch_caches(model, self.torch_state, self.prefix, keep)

    def calls(self, t: int) -> dict[str, Callable[[], Any]]:
        """One call per variant decoding token t; every input is built here, outside the timed region."""
        model, prefix = self.model, self.prefix[:, :t].copy()  # (N, t)
        cross = {k: self.ort_state[k] for k in ("cross_keys", "cross_values", "source_mask")}
        step_feed = {"previous_tokens": prefix[:, -1].copy(), **self.ort_caches[t - 1]}
        prefix_feed = {"target_ids": prefix, **cross}
        torch_prefix, torch_previous = torch.from_numpy(prefix), torch.from_numpy(prefix[:, -1].copy())
        torch_cache = self.torch_caches[t - 1]

        def torch_cached() -> torch.Tensor:
            with torch.inference_mode():
                return model.step(torch_previous, torch_cache)[0]

        def torch_uncached() -> torch.Tensor:
            with torch.inference_mode():
                return model.decode_sequence(self.torch_state, torch_prefix)[:, -1]

        return {"ort cached": lambda: self.step_session.run(self.step_outputs, step_feed)[0],
                "ort uncached": lambda: self.prefix_session.run(None, prefix_feed)[0],
                "torch cached": torch_cached, "torch uncached": torch_uncached}


def greedy_ort(steps: TokenSteps, state: dict, batch: int, length: int,
               keep: set[int] = frozenset()) -> tuple[np.ndarray, dict[int, dict]]:
    """Forced greedy decode through the runtime's step: ids (N, length) starting with BOS, and the state before
    each step i in `keep`, whose cache has past_len i."""
    ids, kept = np.full((batch, length), BOS_ID, dtype=np.int64), {}  # (N, T)
    for i in range(length):
        if i in keep:
            kept[i] = {k: np.ascontiguousarray(v) for k, v in state.items()}
        result = steps.step(ids[:, i], state)
        state = result.state
        if i + 1 < length:
            ids[:, i + 1] = result.log_probs.argmax(axis=-1)
    return ids, kept


def torch_caches(model: TransformerSeq2Seq, state: dict, prefix: np.ndarray, keep: set[int]) -> dict[int, dict]:
    """The PyTorch state before each step i in `keep` of a decode forced along `prefix` (N, T)."""
    kept = {}
    with torch.inference_mode():
        for i in range(prefix.shape[1]):
            if i in keep:
                kept[i] = state
            state = model.step(torch.from_numpy(prefix[:, i].copy()), state)[1]
    return kept


def check_agreement(calls: dict[str, Callable[[], Any]], t: int) -> float:
    """Every variant's log-probs at t match torch cached; returns the largest difference."""
    want = calls["torch cached"]().numpy()
    worst = max(float(np.abs(np.asarray(call()) - want).max()) for call in calls.values())
    if worst > LOG_PROB_ATOL:
        raise click.ClickException(f"variants disagree at t={t}: max |diff| {worst:.2e} > {LOG_PROB_ATOL}")
    return worst


def blocks(calls: dict[str, Callable[[], Any]], repeats: int, warmup: int, rounds: int) -> dict[str, list[float]]:
    """Milliseconds of each call: `rounds` rounds in which every variant runs `warmup` untimed calls, then its share
    of `repeats` timed calls back to back, as in a decode loop. (Alternating single calls would charge each variant
    for the caches the one before it evicted: the ORT step then measures about twice its in-loop cost.) The rounds
    spread drift over all variants alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        for name, call in calls.items():
            for _ in range(warmup):
                call()
            for _ in range(repeats // rounds + (r < repeats % rounds)):
                start = time.perf_counter()
                call()
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def per_token_rows(bench: Bench, lengths: list[int], repeats: int, batch: int) -> tuple[list[Row], float]:
    """Median and p90 ms of every variant at every t, and the largest log-prob disagreement seen."""
    rows, worst = [], 0.0
    for t in lengths:
        calls = bench.calls(t)
        worst = max(worst, check_agreement(calls, t))
        for name, ms in blocks(calls, repeats, WARMUP, ROUNDS).items():
            rows.append({"batch": batch, "t": t, "variant": name, "ms": statistics.median(ms),
                         "p90_ms": statistics.quantiles(ms, n=10)[-1]})
    return rows, worst


def greedy_totals(bench: Bench, length: int, repeats: int) -> dict[str, float]:
    """Median total ms of a forced greedy decode of `length` tokens, for every variant."""
    batch, model = bench.prefix.shape[0], bench.model

    def ort_uncached() -> None:
        ids = np.full((batch, length + 1), BOS_ID, dtype=np.int64)  # (N, T + 1)
        cross = {k: bench.ort_state[k] for k in ("cross_keys", "cross_values", "source_mask")}
        for t in range(1, length + 1):
            ids[:, t] = bench.prefix_session.run(None, {"target_ids": ids[:, :t], **cross})[0].argmax(-1)

    def torch_cached() -> None:
        state, previous = bench.torch_state, torch.full((batch,), BOS_ID)
        with torch.inference_mode():
            for _ in range(length):
                log_probs, state, _ = model.step(previous, state)
                previous = log_probs.argmax(-1)

    def torch_uncached() -> None:
        ids = torch.full((batch, length + 1), BOS_ID)  # (N, T + 1)
        with torch.inference_mode():
            for t in range(1, length + 1):
                ids[:, t] = model.decode_sequence(bench.torch_state, ids[:, :t])[:, -1].argmax(-1)

    calls = {"ort cached": lambda: greedy_ort(bench.steps, bench.ort_state, batch, length),
             "ort uncached": ort_uncached, "torch cached": torch_cached, "torch uncached": torch_uncached}
    return {name: statistics.median(ms) for name, ms in blocks(calls, repeats, warmup=1, rounds=1).items()}


def tables(rows: list[Row], totals: dict[int, dict[str, float]], base_t: int, decode_length: int) -> str:
    """The per-token table, its ratios and the greedy totals, per batch size."""
    lines = []
    for batch in sorted(totals):
        at = {(r["t"], r["variant"]): r for r in rows if r["batch"] == batch}
        ts = sorted({t for t, _ in at})
        lines += [f"\nbatch {batch}: ms per token, median (p90)",
                  f"{'t':>5} " + " ".join(f"{v:>19}" for v in VARIANTS)]
        lines += [f"{t:>5} " + " ".join(f"{at[t, v]['ms']:>10.3f} ({at[t, v]['p90_ms']:>6.3f})" for v in VARIANTS)
                  for t in ts]
        heads = [f"ort c/t{base_t}", f"ort u/t{base_t}", f"torch c/t{base_t}", f"torch u/t{base_t}", "ort u/c",
                 "torch u/c", "torch/ort c", "torch/ort u"]
        lines += [f"batch {batch}: ratios of medians", f"{'t':>5} " + " ".join(f"{h:>12}" for h in heads)]
        for t in ts:
            ms = {v: at[t, v]["ms"] for v in VARIANTS}
            ratios = [ms[v] / at[base_t, v]["ms"] for v in VARIANTS] + [
                ms["ort uncached"] / ms["ort cached"], ms["torch uncached"] / ms["torch cached"],
                ms["torch cached"] / ms["ort cached"], ms["torch uncached"] / ms["ort uncached"]]
            lines.append(f"{t:>5} " + " ".join(f"{r:>11.2f}x" for r in ratios))
        tot = totals[batch]
        lines += [f"batch {batch}: forced greedy decode of {decode_length} tokens, total ms (median)",
                  f"{'':>6} {'cached':>10} {'uncached':>10} {'uncached/cached':>16}"]
        for side in ("ort", "torch"):
            c, u = tot[f"{side} cached"], tot[f"{side} uncached"]
            lines.append(f"{side:>6} {c:>10.1f} {u:>10.1f} {u / c:>15.2f}x")
        lines.append(f"{'t/o':>6} {tot['torch cached'] / tot['ort cached']:>9.2f}x "
                     f"{tot['torch uncached'] / tot['ort uncached']:>9.2f}x   (t/o: torch / ort)")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path, setup: str, force: bool) -> None:
    """ms per token against t, one panel per batch size, log-y."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda y, _: f"{y:g}")
    some = FuncFormatter(lambda y, _: f"{y:g}" if f"{y:.0e}"[0] in "25" else "")  # minor ticks: 2s and 5s only
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4.5), squeeze=False)
    styles = {"ort cached": ("C0", "-o"), "ort uncached": ("C0", "--s"), "torch cached": ("C3", "-o"),
              "torch uncached": ("C3", "--s")}
    for ax, batch in zip(axes[0], batches):
        for v in VARIANTS:
            pts = sorted((r["t"], r["ms"]) for r in rows if r["batch"] == batch and r["variant"] == v)
            color, style = styles[v]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=v)
        ax.set(yscale="log", xlabel="t (output token decoded; prefix length)", ylabel="ms per token (median)",
               title=f"batch {batch}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(some)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    fig.suptitle(setup, fontsize=9)
    fig.tight_layout()
    publish(path, force, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def parse_lengths(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        lengths = sorted({int(v) for v in value.split(",")})
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if lengths[0] < 1:
        raise click.BadParameter(f"token indices start at 1, got {lengths[0]}")
    return lengths


@click.command()
@click.option("--lengths", default="1,10,50,100,200", show_default=True, callback=parse_lengths,
              help="Output tokens t to time (comma-separated); t reads a prefix of t ids.")
@click.option("--base-t", type=click.IntRange(min=1), default=10, show_default=True,
              help="The t that the growth ratios divide by (must be in --lengths).")
@click.option("--batch", "batches", type=click.IntRange(min=1), multiple=True, default=(1,), show_default=True,
              help="Batch sizes; repeat for several (e.g. --batch 1 --batch 16).")
@click.option("--d-model", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--layers", type=click.IntRange(min=1), default=2, show_default=True, help="Per stack.")
@click.option("--heads", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--d-ff", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--vocab", type=click.IntRange(min=N_SPECIAL_TOKENS + 1), default=40, show_default=True)
@click.option("--source-len", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--repeats", type=click.IntRange(min=2), default=200, show_default=True, help="Timed calls per t.")
@click.option("--decode-length", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("--decode-repeats", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also draw ms per token against t to FILE.png.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the tables.")
@click.option("--force", is_flag=True, help="Replace an existing --plot file.")
def bench(lengths: list[int], base_t: int, batches: tuple[int, ...], d_model: int, layers: int, heads: int,
          d_ff: int, vocab: int, source_len: int, threads: int, repeats: int, decode_length: int,
          decode_repeats: int, plot_path: Path | None, as_json: bool, force: bool) -> None:
    """Per-token cost of the cached transformer step vs recomputing the prefix, onnxruntime vs PyTorch."""
    check_click(plot_path, "--plot", force, PNG)  # said now, not after the timing
    if base_t not in lengths:
        raise click.BadParameter(f"{base_t} is not among --lengths {lengths}", param_hint="'--base-t'")
    if d_model % heads:
        raise click.BadParameter(f"--d-model {d_model} must be a multiple of --heads {heads}", param_hint="'--heads'")
    spec = ModelSpec(kind="tokens", arch="transformer", d_model=d_model, d_ff=d_ff, n_heads=heads, layers=layers,
                     source_vocab_size=vocab, target_vocab_size=vocab)
    if max(lengths + [decode_length]) > spec.max_positions:
        raise click.BadParameter(f"t and --decode-length must be <= max_positions {spec.max_positions}")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = TransformerSeq2Seq(spec).eval()
    rows, totals, worst = [], {}, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        export_graphs(model, spec, out, DEFAULT_OPSET, "transformer-step-bench")
        export_prefix_graph(model, out / PREFIX_FILE)
        for batch in batches:
            runner = Bench(model, out, threads, batch, source_len, lengths)
            batch_rows, batch_worst = per_token_rows(runner, lengths, repeats, batch)
            rows, worst = rows + batch_rows, max(worst, batch_worst)
            totals[batch] = greedy_totals(runner, decode_length, decode_repeats)
    setup = (f"onnxruntime {ort.__version__}, torch {torch.__version__}, CPU, {threads} thread(s); d_model {d_model}, "
             f"{layers}+{layers} layers, {heads} heads, d_ff {d_ff}, vocab {vocab}, source {source_len} ids")
    if plot_path is not None:
        plot(rows, plot_path, setup, force)
    if as_json:
        click.echo(json.dumps({"setup": {"spec": spec.to_dict(), "onnxruntime": ort.__version__,
                                         "torch": torch.__version__, "threads": threads, "source_len": source_len,
                                         "repeats": repeats, "decode_length": decode_length},
                               "rows": rows, "greedy_total_ms": {str(b): t for b, t in totals.items()},
                               "max_log_prob_diff": worst}, sort_keys=True))
        return
    click.echo(f"{setup}; {repeats} timed calls per t and variant in {ROUNDS} blocks, each after {WARMUP} "
               f"untimed calls; all variants' log-probs agree within {worst:.1e} (atol {LOG_PROB_ATOL})")
    click.echo(tables(rows, totals, base_t, decode_length))


if __name__ == "__main__":
    bench()
