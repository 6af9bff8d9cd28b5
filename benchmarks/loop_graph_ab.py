"""One loop graph of two exports of the same checkpoint, timed side by side: before and after a change to how the
graphs are written (interleaved calls in one process, medians), after checking that they decode the same.

    git worktree add /tmp/before <commit> && (cd /tmp/before && seq2onnx export CKPT --out /tmp/a)
    seq2onnx export CKPT --out /tmp/b
    python benchmarks/loop_graph_ab.py /tmp/a /tmp/b --graph fast_beam --batch 1 --beam 5 [--steps 20]

--graph: fast_greedy, wide_greedy, fold_greedy, fast_beam, wide_beam, fold_beam, fold_few_beam (a transformer's
one-call graphs, encoder inside) or greedy_loop (every export's traced loop: each export's own encoder runs first,
untimed). --after-graph: AFTER's graph where a change moved the work to another file of the same family (the folded
body left fast_greedy's If for fold_greedy.onnx: --graph fast_greedy --after-graph fold_greedy). Token sources are
random ids of --source-len tokens (some rows shorter), and decoding runs exactly --steps tokens (min = max length;
--free: min length 0, rows end at their eos); point sources are random (batch, --source-len, F) and decode --steps
points.
Prints each side's time (the mean of its sessions' medians: --sessions a side, made after one untimed session in
blocks of before, after, after, before and the mirror, every one warmed, their calls interleaved), the ratio after /
before (< 1: the change is faster) and the spread of each side's session medians; 1 intra-op thread. Denormals are
flushed where the runtime flushes them: calls of more than one row (batch x beam).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable

import click
import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stops import StoppableCommand  # noqa: E402

from runtime.contract import ENCODER_FILE, FAST_FILES, GREEDY_FILE  # noqa: E402
from runtime.denormals import flushing  # noqa: E402
from runtime.errors import Seq2OnnxError  # noqa: E402
from runtime.infer_tokens import MAX_BATCH  # noqa: E402
from runtime.manifest import read_manifest  # noqa: E402
from runtime.optional_graphs import fold_tokens  # noqa: E402
from runtime.sessions import open_session, read_graph  # noqa: E402
from runtime.spec import N_SPECIAL_TOKENS  # noqa: E402
from runtime.token_steps import MAX_GRAPH_BEAM  # noqa: E402
from runtime.vocab import EOS  # noqa: E402

ABBA = (0, 1, 1, 0, 1, 0, 0, 1)  # the order sessions are made in: before, after, after, before, then the mirror
GRAPHS = {"fast_greedy": FAST_FILES["greedy"], "wide_greedy": FAST_FILES["wide_greedy"],
          "fold_greedy": FAST_FILES["fold_greedy"], "fast_beam": FAST_FILES["beam"],
          "wide_beam": FAST_FILES["wide_beam"], "fold_beam": FAST_FILES["fold_beam"],
          "fold_few_beam": FAST_FILES["fold_few_beam"], "greedy_loop": GREEDY_FILE}


def why_missing(name: str) -> str:
    """Why an export may lack a one-call graph, for the refusal."""
    if name == FAST_FILES["fold_few_beam"]:
        return (" (fold_few_beam.onnx is written where folded graphs are, by exports since it was added: "
                "runtime.contract.FAST_FILES)")
    if name in (FAST_FILES["fold_greedy"], FAST_FILES["fold_beam"]):
        return (" (folded graphs are written only for float32 and int8 transformers whose sources fold: "
                "runtime.optional_graphs.folds)")
    if name in FAST_FILES.values():
        return " (fast graphs are written only for float32 and int8 transformer exports)"
    return ""


def family(graph: str) -> str:
    """Graphs of one family take the same inputs: the one-call greedy graphs, the beam graphs, the traced loop."""
    return "greedy_loop" if graph == "greedy_loop" else graph.rsplit("_", 1)[1]


def session(model_dir: Path, graphs: dict, name: str) -> ort.InferenceSession:
    """A session of a graph the manifest lists, its sha256 checked (an altered file: IntegrityError, one line)."""
    return open_session(read_graph(model_dir, name, graphs[name]["sha256"]), "cpu", 1, name)


def sources(spec, batch: int, length: int, seed: int) -> dict[str, np.ndarray]:
    """A batch of random sources: token ids (the last row full length, the others 5 to `length`) or points."""
    rng = np.random.default_rng(seed)
    if spec.kind == "points":
        return {"source": rng.standard_normal((batch, length, spec.n_features)).astype(np.float32),
                "source_mask": np.ones((batch, 1, length), bool)}
    lengths = rng.integers(min(5, length), length + 1, batch)
    lengths[-1] = length
    ids = np.zeros((batch, length), np.int64)
    for row, n in enumerate(lengths):
        ids[row, :n - 1] = rng.integers(N_SPECIAL_TOKENS, spec.source_vocab_size, n - 1)  # no special
        ids[row, n - 1] = EOS
    return {"source_ids": ids, "source_lengths": lengths.astype(np.int64)}


def feed(encoder: ort.InferenceSession | None, loop: ort.InferenceSession, src: dict, steps: int, free: bool,
         beam: int) -> dict[str, np.ndarray]:
    """The loop graph's inputs: the sources (a fast graph) or the export's own encoder's outputs, and the options."""
    values = dict(src)
    if encoder is not None:
        values.update(zip([o.name for o in encoder.get_outputs()],
                          encoder.run(None, {i.name: src[i.name] for i in encoder.get_inputs()})))
    values.update(max_length=np.array(steps), min_length=np.array(0 if free else steps), target_len=np.array(steps),
                  beam_size=np.array(beam), num_hypotheses=np.array(1), length_penalty=np.array(1.0))
    return {i.name: values[i.name] for i in loop.get_inputs()}


@click.command(cls=StoppableCommand, help="Time one loop graph of two exports of the same checkpoint side by side (BEFORE and AFTER a "
                    "change to how graphs are written), after checking that both decode the same ids.")
@click.argument("before", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("after", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--graph", type=click.Choice(sorted(GRAPHS)), required=True)
@click.option("--after-graph", type=click.Choice(sorted(GRAPHS)),
              help="AFTER's graph, of --graph's family (default: --graph).")
@click.option("--batch", type=click.IntRange(1, MAX_BATCH), default=1, show_default=True, help="Inputs per call.")
@click.option("--beam", type=click.IntRange(1, MAX_GRAPH_BEAM), default=5, show_default=True,
              help="Beam size (beam graphs; the runtime runs wider beams without them).")
@click.option("--steps", type=click.IntRange(1), default=20, show_default=True,
              help="Output tokens (points) per input: min = max length unless --free.")
@click.option("--source-len", type=click.IntRange(1), default=13, show_default=True,
              help="Source tokens (points) of the longest input; the others 5 or more.")
@click.option("--free", is_flag=True, help="Min length 0: rows end at their eos (tokens).")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True, help="Rounds, each its own medians.")
@click.option("--calls", type=click.IntRange(0), default=0,
              help="Timed calls per side per round (0: ~1 s), shared by its sessions.")
@click.option("--sessions", type=click.IntRange(1), default=8, show_default=True,
              help="Sessions a side (1: one a side, as before; odd counts above 1 round up to even): a side's time "
                   "is the mean of its sessions' medians.")
def main(before: Path, after: Path, graph: str, after_graph: str | None, batch: int, beam: int, steps: int,
         source_len: int, free: bool, rounds: int, calls: int, sessions: int) -> None:
    after_graph = after_graph or graph
    if batch * (beam if "beam" in graph else 1) > 1:  # as the runtime runs a decode of more than one row
        flushing().__enter__()  # denormals flushed on this thread for the rest of the process (runtime.denormals)
    if family(after_graph) != family(graph):
        raise click.UsageError(f"--after-graph {after_graph} does not take --graph {graph}'s inputs; pick one of "
                               f"{', '.join(g for g in sorted(GRAPHS) if family(g) == family(graph))}")
    try:
        manifests = [read_manifest(d) for d in (before, after)]
    except Seq2OnnxError as exc:  # not an export, or an altered one: its one line, not a traceback
        raise click.ClickException(str(exc)) from None
    specs = [m.spec for m in manifests]
    if specs[0] != specs[1]:
        fields = [f.name for f in dataclasses.fields(specs[0])]
        differ = ", ".join(f"{n} {getattr(specs[0], n)!r} vs {getattr(specs[1], n)!r}" for n in fields
                           if getattr(specs[0], n) != getattr(specs[1], n))
        raise click.UsageError(f"{before} and {after} are exports of different models: {differ}")
    limit = specs[0].max_positions if specs[0].is_transformer else None
    if limit is not None and max(source_len, steps) > limit:
        raise click.UsageError(f"--source-len {source_len} and --steps {steps} must be at most this transformer's "
                               f"max_positions {limit}")
    names = (GRAPHS[graph], GRAPHS[after_graph])
    for d, m, name in zip((before, after), manifests, names):
        if name not in m.graphs:
            raise click.UsageError(f"{d} has no {name}{why_missing(name)}")
    src = sources(specs[0], batch, source_len, seed=0)
    folded = [g for g in (graph, after_graph) if g.startswith("fold_")]
    if folded and batch * source_len > fold_tokens(specs[0]):
        click.echo(f"note: the runtime sends {folded[0]} calls of at most {fold_tokens(specs[0])} source tokens in "
                   f"all; this one has {batch} x {source_len} = {batch * source_len}")
    sides = (0, 1)  # by side, not by path: the same export given twice is a control (two sessions, two lists)
    try:
        # Several sessions a side, made in ABBA then BAAB blocks after an untimed first one: on the 2-core EPYC two
        # sessions of one file ran up to ~10% apart, each keeping its speed through a run (in one process the first
        # ran slowest and later ones tended to be faster), so one session a side read the same export against itself
        # as 0.98-1.06. With 8 a side the control read 0.993-0.996, but a pair of exports still read ~1% apart
        # depending on which was "after": under ~2%, time both ways.
        per_side = 1 if sessions == 1 else sessions + sessions % 2
        created = (ABBA * per_side)[:2 * per_side]
        session(before, manifests[0].graphs, names[0])  # a process's first session ran slowest: made, not timed
        made = [session((before, after)[i], manifests[i].graphs, names[i]) for i in created]
        loops = [made[created.index(i)] for i in sides]
        encoders = [session(d, m.graphs, ENCODER_FILE) if graph == "greedy_loop" else None
                    for d, m in zip((before, after), manifests)]
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    feeds = [feed(encoders[i], loops[i], src, steps, free, beam) for i in sides]
    outs = [loops[i].run(None, feeds[i]) for i in sides]
    for a, b in zip(*outs):
        if a.dtype.kind in "iub" and not np.array_equal(a, b):
            why = ("not the same model, or two graphs that round differently (an int8 export's folded and plain "
                   "bodies can pick other ids)" if names[0] != names[1] else "not the same model?")
            raise click.ClickException(f"the two exports decode different ids ({', '.join(dict.fromkeys(names))}): "
                                       f"{why}")
    diff = max((float(np.max(np.abs(a - b))) for a, b in zip(*outs)
                if a.dtype.kind == "f" and a.size and np.isfinite(a).all()), default=0.0)
    start = time.perf_counter()
    loops[0].run(None, feeds[0])
    asked, calls = calls, calls or max(5, int(1.0 / max(time.perf_counter() - start, 1e-6)))
    per_session = -(-calls // per_side)  # each session's share of a side's calls, rounded up
    for j, made_session in enumerate(made):  # every session's first, slower call (1.3-2x), untimed
        made_session.run(None, feeds[created[j]])
    against = f" against {names[1]}" if names[1] != names[0] else ""
    click.echo(f"{graph} ({names[0]}{against}), batch {batch}, {steps} steps{' (free)' if free else ''}"
               f"{f', beam {beam}' if 'beam' in graph else ''}; same ids, max float diff {diff:.2e}; "
               f"{per_session * per_side} interleaved calls per side per round, {per_session} each in {per_side} "
               f"session{'s' if per_side > 1 else ''} a side"
               f"{f' (--calls {asked} rounded up)' if asked and per_session * per_side != asked else ''}")
    for r in range(rounds):
        times = interleaved([lambda j=j: made[j].run(None, feeds[created[j]]) for j in range(len(created))],
                            per_session)
        medians = [[float(np.median(t)) * 1e3 for j, t in enumerate(times) if created[j] == i] for i in sides]
        b, a = (float(np.mean(m)) for m in medians)
        spread = " | ".join(f"{min(m):.3f}-{max(m):.3f}" for m in medians)
        click.echo(f"round {r + 1}: before {b:.3f} ms, after {a:.3f} ms, after / before {a / b:.3f} (sessions' "
                   f"medians {spread} ms)")


def interleaved(runs: list[Callable[[], object]], calls: int) -> list[list[float]]:
    """`calls` timed calls of each run, in turn, the order reversed every other turn (A B, B A, ...) so that no run
    always goes first or last. Seconds per call, one list per run (by position, so the same export given twice
    still gets two sessions and two lists)."""
    times: list[list[float]] = [[] for _ in runs]
    order = list(range(len(runs)))
    for turn in range(calls):
        for i in (order if turn % 2 == 0 else order[::-1]):
            t = time.perf_counter()
            runs[i]()
            times[i].append(time.perf_counter() - t)
    return times


if __name__ == "__main__":
    main()
