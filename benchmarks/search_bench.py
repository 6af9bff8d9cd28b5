"""Search speed before and after issue 22, side by side: the pre-issue-22 strategies (frozen in
tests/support/search_reference.py) against runtime.search, interleaved in every round.

    python benchmarks/search_bench.py [--rounds 15] [--steps 20] [--beam 5] [--json]
    python benchmarks/search_bench.py --profile "gru beam 64"    # cProfile, old then new, of one case

Cases, each at batch 1 and 64 (beam: --beam wide; every sequence runs exactly --steps steps: min = max length):
  overhead beam / greedy   a step that costs ~nothing (a fixed random (V, V) log-prob table indexed by the previous
                           token) carrying the shipped dates GRU's state at its shapes: hidden (1, N, 128) changes,
                           keys (N, 29, 128), memory (N, 29, 256) and source_mask (N, 29) are constant. What is left
                           is the strategy's own Python and numpy cost.
  overhead beam eos        the same with eos allowed (no minimum length): inputs finish at different steps, so
                           finished hypotheses, the stopping rule and dropping inputs are exercised every step
  gru beam                 Seq2Seq.load(artifacts/dates).translate_batch(texts, beam_size, min = max = --steps)
  gru beam natural         the same with the default lengths (max: the spec's target_len, no minimum): it stops
                           at each date's eos, as in use
  transformer beam         the same as gru beam on --transformer (the dates transformer export; skipped when
                           absent), at min(--steps, the spec's max_positions)
Texts are held-out `dates` sources. `old` runs translate_batch with runtime.tokens' beam_search swapped for the
reference for the call (it ignores `constant`). Each round runs every case old then new, or new then old (alternating),
so drift hits both; figures are medians after one warm-up, whose outputs old and new must agree on exactly.
Check `uptime` first: on a shared 2-core machine, compare only figures from the same run.
"""
from __future__ import annotations

import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed copy
from stops import StoppableCommand  # noqa: E402

import runtime.tokens  # noqa: E402
from runtime.model import Seq2Seq  # noqa: E402
from runtime.search import StepResult, beam_search, greedy_search  # noqa: E402
from training.tokens.builtin import DATES_TEST_SEED, generate_dates  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import support.search_reference as reference  # noqa: E402  (tests/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 64)
STATE = {"hidden": ((1, None, 128), 1), "keys": ((None, 29, 128), 0), "memory": ((None, 29, 256), 0),
         "source_mask": ((None, 29), 0)}  # the dates GRU's state: shape (None: batch), batch axis
VOCAB = 15  # the dates target vocabulary
Call = Callable[[], Any]


class TableStep:
    """log-probs = a fixed random (V, V) table's row of the previous token, shifted by a per-input amount read off
    hidden (so inputs decode differently); the state is carried as TokenSteps carries it: the constant entries as
    they came, hidden replaced (by itself)."""

    def __init__(self, batch: int) -> None:
        rng = np.random.default_rng(0)
        logits = rng.normal(size=(VOCAB, VOCAB))
        self.table = (logits - np.log(np.exp(logits).sum(1, keepdims=True))).astype(np.float32)  # (V, V)
        self.state = {name: rng.normal(size=tuple(batch if d is None else d for d in shape)).astype(np.float32)
                      for name, (shape, _) in STATE.items()}
        self.axes = {name: axis for name, (_, axis) in STATE.items()}
        self.constant = frozenset(STATE) - {"hidden"}

    def __call__(self, tokens: np.ndarray, state: dict) -> StepResult:
        shift = (np.abs(state["hidden"][0, :, 0]) * 7).astype(np.int64)  # (N,)
        return StepResult(self.table[(tokens + shift) % VOCAB], {**state, "hidden": state["hidden"]})


@contextlib.contextmanager
def reference_beam() -> Iterator[None]:
    """runtime.tokens.translate drives the reference beam search (dropping what it predates) inside the block."""
    def old(step: Any, state: Any, axes: Any, constant: frozenset = frozenset(), per_input: bool = False,
            between: Any = None, **kw: Any) -> Any:  # the reference predates `constant`, `per_input` (a beam
        # step's per-input state) and `between` (a cancel asked while it expands)
        return reference.beam_search(step, state, axes, **kw)

    saved, runtime.tokens.beam_search = runtime.tokens.beam_search, old
    try:
        yield
    finally:
        runtime.tokens.beam_search = saved


def overhead_cases(beam: int, steps: int) -> dict[str, tuple[Call, Call]]:
    """(old, new) calls of the table-step cases."""
    out = {}
    for batch in BATCHES:
        table = TableStep(batch)
        kw = dict(batch_size=batch, bos_id=1, eos_id=2, max_decoding_length=steps, min_decoding_length=steps)
        args = (table, table.state, table.axes)
        out[f"overhead beam {batch}"] = (lambda a=args, kw=kw: reference.beam_search(*a, beam_size=beam, **kw),
                                         lambda a=args, kw=kw, c=table.constant: beam_search(
                                             *a, beam_size=beam, constant=c, **kw))
        eos = dict(kw, min_decoding_length=0)
        out[f"overhead beam eos {batch}"] = (
            lambda a=args, kw=eos: reference.beam_search(*a, beam_size=beam, **kw),
            lambda a=args, kw=eos, c=table.constant: beam_search(*a, beam_size=beam, constant=c, **kw))
        out[f"overhead greedy {batch}"] = (lambda a=args, kw=kw: reference.greedy_search(*a, **kw),
                                           lambda a=args, kw=kw, c=table.constant: greedy_search(
                                               *a, constant=c, **kw))
    return out


def model_cases(name: str, path: Path, beam: int, steps: int, threads: int) -> dict[str, tuple[Call, Call]]:
    """(old, new) translate_batch calls of one exported model, or none when it is absent."""
    if not (path / "manifest.json").exists():
        click.echo(f"# {name}: {path} not found, skipped", err=True)
        return {}
    model = Seq2Seq.load(path, provider="cpu", threads=threads)
    length = min(steps, model.spec.max_positions) if model.spec.is_transformer else steps
    texts = list(generate_dates(max(BATCHES), DATES_TEST_SEED).sources)
    out = {}
    for batch, natural in ((b, n) for n in (False, True) for b in BATCHES):
        kw = dict(beam_size=beam) if natural else dict(beam_size=beam, min_decoding_length=length,
                                                       max_decoding_length=length)

        def old(texts: list[str] = texts[:batch], kw: dict = kw) -> Any:
            with reference_beam():
                return model.translate_batch(texts, **kw)

        case = f"{name} beam {'natural ' if natural else ''}{batch}"
        out[case] = (old, lambda texts=texts[:batch], kw=kw: model.translate_batch(texts, **kw))
    return out


def same(a: Any, b: Any) -> bool:
    """Whether two decodes agree exactly: hypotheses' or translations' ids/tokens and scores."""
    def flat(x: Any) -> list:
        items = [h for n in x for h in (n if isinstance(n, list) else [n])]
        return [(getattr(h, "ids", getattr(h, "tokens", None)), h.score, h.log_prob) for h in items]
    return flat(a) == flat(b)


def measure(cases: dict[str, tuple[Call, Call]], rounds: int) -> dict[str, dict[str, float]]:
    """Median seconds of old and new per case, interleaved, after a warm-up whose outputs must agree."""
    for name, (old, new) in cases.items():
        if not same(old(), new()):
            raise click.ClickException(f"{name}: old and new decodes differ; the comparison would be meaningless")
    times = {name: {"old": [], "new": []} for name in cases}
    for r in range(rounds):
        for name, (old, new) in cases.items():
            for which, call in (("old", old), ("new", new))[:: 1 if r % 2 == 0 else -1]:
                start = time.perf_counter()
                call()
                times[name][which].append(time.perf_counter() - start)
    return {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}


def profile(call: Call, repeats: int, top: int) -> str:
    """cProfile of `repeats` calls: the `top` functions by internal time."""
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [call() for _ in range(repeats)])
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime").print_stats(top)
    return out.getvalue()


def rows_of(medians: dict[str, dict[str, float]], steps: int) -> list[dict[str, Any]]:
    """One row per case; per-step figures only where every input runs exactly `steps` steps."""
    rows = []
    for name, t in medians.items():
        fixed = "eos" not in name and "natural" not in name
        rows.append({"case": name, "old_ms": t["old"] * 1e3, "new_ms": t["new"] * 1e3, "speedup": t["old"] / t["new"],
                     **{f"{k}_us_per_step": t[k] / steps * 1e6 if fixed else None for k in ("old", "new")}})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a fixed-width table ('-': no per-step figure)."""
    lines = [f"{'case':<26} {'old ms':>9} {'new ms':>9} {'speedup':>8} {'old us/step':>12} {'new us/step':>12}"]
    for r in rows:
        old, new = ("-" if r[k] is None else f"{r[k]:.1f}" for k in ("old_us_per_step", "new_us_per_step"))
        lines.append(f"{r['case']:<26} {r['old_ms']:>9.2f} {r['new_ms']:>9.2f} {r['speedup']:>7.2f}x {old:>12} "
                     f"{new:>12}")
    return "\n".join(lines)


@click.command(cls=StoppableCommand)
@click.option("--rounds", type=click.IntRange(min=1), default=15, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--beam", type=click.IntRange(min=2), default=5, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="onnxruntime intra-op threads for the model cases.")
@click.option("--model", "gru", type=click.Path(path_type=Path), default=ROOT / "artifacts" / "dates")
@click.option("--transformer", type=click.Path(path_type=Path), default=Path("/work/tf/dates-tf"))
@click.option("--profile", "profiled", default=None, help="A case name: print its cProfile, old then new, only.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def bench(rounds: int, steps: int, beam: int, threads: int, gru: Path, transformer: Path, profiled: str | None,
          as_json: bool) -> None:
    """Old vs new search: pure overhead and end to end, batch 1 and 64."""
    cases = {**overhead_cases(beam, steps), **model_cases("gru", gru, beam, steps, threads),
             **model_cases("transformer", transformer, beam, steps, threads)}
    if profiled is not None:
        if profiled not in cases:
            raise click.BadParameter(f"{profiled!r}; cases: {list(cases)}", param_hint="--profile")
        for which, call in zip(("old", "new"), cases[profiled]):
            call()
            click.echo(f"== {profiled}, {which}: {rounds} calls\n{profile(call, rounds, 18)}")
        return
    load = os.getloadavg()
    rows = rows_of(measure(cases, rounds), steps)
    setup = {"rounds": rounds, "steps": steps, "beam": beam, "threads": threads, "load_before": load,
             "load_after": os.getloadavg()}
    if as_json:
        click.echo(json.dumps({"setup": setup, "rows": rows}, sort_keys=True))
        return
    click.echo(f"beam {beam}, {steps} steps (min = max unless 'eos'/'natural'), medians of {rounds} interleaved "
               f"rounds, ort threads {threads}; load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    click.echo(table(rows))


if __name__ == "__main__":
    bench()
