"""What bounds a transformer's batch-1 decode on onnxruntime's CPU kernels, beside CTranslate2 on the same weights.

    python benchmarks/transformer_floor.py --checkpoint CKPT [--source TEXT] [--beams 1,5] [--lengths 1,2,5,10,20]
                                           [--repeats 150] [--rows 5] [--steps 20] [--kernel-repeats 200]

CKPT is a `seq2onnx train --arch transformer` checkpoint. It is exported (float32, `export_model`) and converted for
CTranslate2 (benchmarks/ct2_convert.py) in a temporary directory. The source is --source, or else the first held-out
`dates` source of ct2_bench.SOURCE_TOKENS tokens (as ct2_bench.py times). Two parts, both at batch 1 and 1 thread:

1. The fixed part of a call and the cost of a further step, per engine. The source is decoded to exactly T tokens
   (min = max = T) for every T of --lengths by three decoders: `api` (Seq2Seq.translate_batch, text in and out),
   `runs` (a bare replay of the onnxruntime runs that very call made, as benchmarks/api_overhead.py replays them)
   and `ct2` (Translator.translate_batch on the source's tokens). Every decoder of a beam size runs in every round,
   in reverse order every other round; a sample is the third of three calls in a row (the model in cache, as a
   service under load runs it); figures are medians over --repeats rounds. `fixed` is the median at T = 1 (the
   encoder, the call's set-up and one step: --lengths must hold 1), `a further step` the least-squares slope of the
   medians over the lengths from 2 up.

2. The kernels of a greedy step: the body of the loop graph that decodes the source greedily (fold_greedy.onnx for a
   short source), as onnxruntime optimizes it when it loads it, counted by kind; and what the kernels of each
   measured kind cost on this CPU, each in a bare ONNX Loop of --steps iterations at the model's sizes, at 1 row and
   at --rows rows: every weight product of the body (its weight a constant, so MLAS prepacks it, as in the body;
   nine independent products of the same rows by one weight, their outputs concatenated: a dependent chain, as in
   the body, read up to ~0.2 us less a product at 1 row in a scratch comparison), the self-attention kernel
   (com.microsoft Attention over a cache that grows a step an iteration; its rows are inputs of one token, each
   with a cache of its own), LayerNormalization, Add, Softmax and Relu over (rows, d_model), and an iteration of
   the Loop itself. A kernel's cost is (time with 9 of them - time with 1) / 8 / iterations, and an iteration's
   (time of 2 x --steps iterations - time of --steps) / --steps (neither holds the run's own cost), medians of
   --kernel-repeats interleaved runs; a cost below zero is noise (too few runs) and counts as 0. The step at those
   costs (the measured kinds only) is printed beside the step measured in part 1; the rest is the
   kernels not measured (named) and what a bare chain does not pay (the whole model's weights passing through the
   caches every step).

On a CPU whose products at 1 row cost nearly what they cost at 4-5 (MLAS's one-row kernel is bound by the latency
of its two accumulator chains, not by arithmetic), a beam of 5 costs little more a step than greedy: the ratio
printed as `rows / 1 row` shows it.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import ctranslate2
import numpy as np
import onnx
import onnxruntime as ort
from api_overhead import recorded_calls, replay
from ct2_bench import SOURCE_TOKENS, held_out, int_list, machine
from ct2_convert import ConversionError, checkpoint_spec, convert, source_tokens
from onnx import TensorProto, helper, numpy_helper
from stops import StoppableCommand

from export.api import export_model
from runtime.contract import VOCAB_FILES
from runtime.errors import InputError
from runtime.model import Seq2Seq
from runtime.sessions import session_options
from runtime.spec import ModelSpec
from runtime.tokens import check_texts, encode_sources
from runtime.vocab import Vocabulary
from training.checkpoint import CheckpointError

DECODERS = ("api", "runs", "ct2")
CHAIN = 9  # kernels of a kind in the long chain (the short one has 1)
PRODUCTS = {"MatMul", "Gemm", "FusedMatMul"}
MEASURED = PRODUCTS | {"Attention", "LayerNormalization", "Add", "Softmax", "Relu"}
Key = tuple[str, int]  # (decoder, tokens)


# --- part 1: a call split into its fixed part and a further step ------------------------------------------------

def split_decoders(model: Seq2Seq, translator: Any, text: str, beam: int,
                   lengths: list[int]) -> dict[Key, Callable[[], Any]]:
    """Each decoder at each length, as a call; every one is checked to decode exactly that many tokens."""
    tokens = source_tokens([text], model.vocabularies["source"], model.spec)
    calls: dict[Key, Callable[[], Any]] = {}
    for n in lengths:
        options = dict(beam_size=beam, min_decoding_length=n, max_decoding_length=n)

        def api(options: dict[str, int] = options) -> Any:
            return model.translate_batch([text], **options)

        def ct2(options: dict[str, int] = options) -> Any:
            return translator.translate_batch(tokens, **options)

        ours, theirs = len(api()[0][0].ids), len(ct2()[0].hypotheses[0])
        if ours != n or theirs != n:
            raise click.ClickException(f"beam {beam}: asked for exactly {n} tokens, seq2onnx decoded {ours} and "
                                       f"CTranslate2 {theirs}")
        calls["api", n], calls["runs", n], calls["ct2", n] = api, replay(recorded_calls(api)), ct2
    return calls


def time_rounds(calls: dict[Key, Callable[[], Any]], repeats: int) -> dict[Key, list[float]]:
    """Seconds of each call over `repeats` rounds, every call in every round (reversed every other round); a
    sample is the third of three calls in a row."""
    times: dict[Key, list[float]] = {key: [] for key in calls}
    order = list(calls)
    for r in range(repeats):
        for key in order if r % 2 == 0 else order[::-1]:
            call = calls[key]
            call()
            call()
            start = time.perf_counter()
            call()
            times[key].append(time.perf_counter() - start)
    return times


def fixed_and_step(lengths: list[int], medians: list[float]) -> tuple[float, float]:
    """(the median at T = 1, the least-squares slope of the medians over lengths >= 2)."""
    pairs = [(n, m) for n, m in zip(lengths, medians, strict=True) if n >= 2]
    slope = float(np.polyfit([n for n, _ in pairs], [m for _, m in pairs], 1)[0])
    return medians[lengths.index(1)], slope


def split_table(beam: int, lengths: list[int], times: dict[Key, list[float]], repeats: int) -> tuple[str, float]:
    """Part 1's table for one beam size, and the bare runs' further step (us)."""
    medians = {key: statistics.median(t) * 1e6 for key, t in times.items()}
    lines = [f"beam {beam}, batch 1: the source decoded to exactly T tokens; medians of {plural(repeats, 'round')} "
             "(us)",
             "| T | api | runs | ct2 | api / ct2 | runs / ct2 |", "|---" * 6 + "|"]
    for n in lengths:
        a, r, c = (medians[d, n] for d in DECODERS)
        lines.append(f"| {n} | {a:.0f} | {r:.0f} | {c:.0f} | {a / c:.2f} | {r / c:.2f} |")
    split = {d: fixed_and_step(lengths, [medians[d, n] for n in lengths]) for d in DECODERS}
    for label, i in (("fixed (T = 1)", 0), ("a further step (slope, T >= 2)", 1)):
        a, r, c = (split[d][i] for d in DECODERS)
        lines.append(f"| {label} | {a:.1f} | {r:.1f} | {c:.1f} | {a / c:.2f} | {r / c:.2f} |")
    return "\n".join(lines), split["runs"][1]


# --- part 2: the greedy step's kernels ----------------------------------------------------------------------------

def optimized_body(graph: Path, scratch: Path) -> onnx.GraphProto:
    """The first Loop body of `graph` as onnxruntime optimizes it (the runtime's session settings, 1 thread)."""
    options = session_options(1)
    options.optimized_model_filepath = str(scratch / f"optimized-{graph.name}")
    ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath)
    for node in optimized.graph.node:
        if node.op_type == "Loop":
            return next(a.g for a in node.attribute if a.name == "body")
    raise click.ClickException(f"{graph.name} holds no Loop: not a loop graph")


def census(body: onnx.GraphProto, outer: onnx.GraphProto) -> tuple[Counter, list[tuple[int, int]]]:
    """(the body's kernels by kind, the (K, N) of every product whose weight is a constant, in order)."""
    weights = {t.name: tuple(t.dims) for g in (body, outer) for t in g.initializer}
    shapes = []
    for node in body.node:
        if node.op_type in PRODUCTS and node.input[1] in weights and len(weights[node.input[1]]) == 2:
            k, n = weights[node.input[1]]
            transposed = any(a.name == "transB" and a.i for a in node.attribute)
            shapes.append((n, k) if transposed else (k, n))
    return Counter(node.op_type for node in body.node), shapes


def _loop_session(nodes: list, initializers: list, carried: dict[str, list]) -> Any:
    """A Loop of `n` iterations whose body runs `nodes`, reading `<name>_in` and writing `<name>_out` for every
    carried value; the graph's inputs are `n` and the carried values' first values."""
    nodes = nodes + [helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    body = helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])]
        + [helper.make_tensor_value_info(f"{c}_in", TensorProto.FLOAT, None) for c in carried],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])]
        + [helper.make_tensor_value_info(f"{c}_out", TensorProto.FLOAT, None) for c in carried], initializers)
    loop = helper.make_node("Loop", ["n", "", *carried], [f"{c}_last" for c in carried], body=body)
    graph = helper.make_graph(
        [loop], "chain",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])]
        + [helper.make_tensor_value_info(c, TensorProto.FLOAT, shape) for c, shape in carried.items()],
        [helper.make_tensor_value_info(f"{c}_last", TensorProto.FLOAT, None) for c in carried])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return ort.InferenceSession(model.SerializeToString(), session_options(1, arena=False),
                                providers=["CPUExecutionProvider"],  # products of one input by one weight stay apart
                                disabled_optimizers=["CommonSubexpressionElimination"])


def chain(kind: str, count: int, rows: int, spec: ModelSpec, shape: tuple[int, int] | None,
          rng: np.random.Generator) -> tuple[Any, dict[str, np.ndarray]]:
    """A session running `count` kernels of `kind` an iteration, and its feed (without `n`)."""
    e = spec.d_model
    inits: list = []
    nodes: list = []
    if kind == "product":  # independent products of the carried row(s) by one weight (in cache), concatenated
        k, n = shape
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n)) * 0.1).astype(np.float32), "w"))
        nodes = [helper.make_node("MatMul", ["x_in", "w"], [f"y{j}"]) for j in range(count)]
        nodes += [helper.make_node("Concat", [f"y{j}" for j in range(count)], ["all_out"], axis=0),
                  helper.make_node("Identity", ["x_in"], ["x_out"])]
        feed = {"x": (rng.standard_normal((rows, k)) * 0.1).astype(np.float32),
                "all": np.zeros((count * rows, n), np.float32)}  # (count rows, N)
        return _loop_session(nodes, inits, {"x": [rows, k], "all": [count * rows, n]}), feed
    if kind == "Attention":  # a chain through `count` self-attentions, each over a cache of its own
        x = "x_in"
        for j in range(count):
            inits += [numpy_helper.from_array((rng.standard_normal((e, 3 * e)) * 0.1).astype(np.float32), f"w{j}"),
                      numpy_helper.from_array(np.zeros(3 * e, np.float32), f"b{j}")]
            nodes.append(helper.make_node("Attention", [x, f"w{j}", f"b{j}", "", f"past{j}_in"],
                                          [f"a{j}", f"past{j}_out"], domain="com.microsoft", num_heads=spec.n_heads))
            x = f"a{j}"
        nodes.append(helper.make_node("Identity", [x], ["x_out"]))
        carried = {"x": [rows, 1, e], **{f"past{j}": [2, rows, spec.n_heads, None, e // spec.n_heads]
                                         for j in range(count)}}
        feed = {"x": (rng.standard_normal((rows, 1, e)) * 0.1).astype(np.float32),
                **{f"past{j}": np.zeros((2, rows, spec.n_heads, 0, e // spec.n_heads), np.float32)
                   for j in range(count)}}
        return _loop_session(nodes, inits, carried), feed
    x = "x_in"  # a chain of `count` elementwise or row-wise kernels
    if kind == "LayerNormalization":
        inits += [numpy_helper.from_array(np.ones(e, np.float32), "g"), numpy_helper.from_array(np.zeros(e, np.float32), "b")]
    for j in range(count):
        inputs = {"LayerNormalization": [x, "g", "b"], "Add": [x, x]}.get(kind, [x])
        nodes.append(helper.make_node(kind, inputs, [f"y{j}"], **({"axis": -1} if kind != "Relu" and kind != "Add" else {})))
        x = f"y{j}"
    nodes.append(helper.make_node("Identity", [x], ["x_out"]))
    feed = {"x": (rng.standard_normal((rows, e)) * 0.1).astype(np.float32)}
    return _loop_session(nodes, inits, {"x": [rows, e]}), feed


def kernel_costs(spec: ModelSpec, shapes: list[tuple[int, int]], rows: list[int], steps: int,
                 repeats: int) -> dict[tuple[str, int], float]:
    """Microseconds a kernel of each kind ("product KxN", "Attention", ...; "Loop iteration") at each row count."""
    rng = np.random.default_rng(0)
    kinds = [(f"product {k}x{n}", "product", (k, n)) for k, n in dict.fromkeys(shapes)]
    kinds += [(kind, kind, None) for kind in ("Attention", "LayerNormalization", "Add", "Softmax", "Relu")]
    n = {"n": np.array(steps, np.int64)}
    sessions = {}
    for name, kind, shape in kinds:
        for r in rows:
            for count in (1, CHAIN):
                session, feed = chain(kind, count, r, spec, shape, rng)
                sessions[name, r, count] = session, {**n, **feed}
    for r in rows:  # an empty iteration, run for `steps` (count 1) and for twice as many (count 2)
        session = _loop_session([helper.make_node("Identity", ["x_in"], ["x_out"])], [], {"x": [r, spec.d_model]})
        for count in (1, 2):
            sessions["Loop iteration", r, count] = session, {"n": np.array(count * steps, np.int64),
                                                             "x": np.zeros((r, spec.d_model), np.float32)}
    times: dict[tuple[str, int, int], list[float]] = {key: [] for key in sessions}
    order = list(sessions)
    for i in range(repeats):
        for key in order if i % 2 == 0 else order[::-1]:
            session, feed = sessions[key]
            session.run(None, feed)
            start = time.perf_counter()
            session.run(None, feed)
            times[key].append(time.perf_counter() - start)
    median = {key: statistics.median(t) for key, t in times.items()}
    costs = {(name, r): (median[name, r, CHAIN] - median[name, r, 1]) / (CHAIN - 1) / steps * 1e6
             for name, _, _ in kinds for r in rows}
    costs.update({("Loop iteration", r): (median["Loop iteration", r, 2] - median["Loop iteration", r, 1]) / steps
                  * 1e6 for r in rows})
    return costs


def step_estimate(kinds: Counter, shapes: list[tuple[int, int]], costs: dict[tuple[str, int], float]) -> tuple[float, Counter]:
    """The step at 1 row at the measured costs (its products, attention, norms, adds, softmaxes, relus and the
    Loop's iteration; a cost below zero, noise, as 0), and the kernels not measured, by kind."""
    rest = Counter({kind: n for kind, n in kinds.items() if kind not in MEASURED})
    rest["products of per-call matrices"] = sum(kinds[k] for k in PRODUCTS) - len(shapes)
    one = {name: max(cost, 0.0) for (name, rows), cost in costs.items() if rows == 1}
    total = sum(one[f"product {k}x{n}"] for k, n in shapes) + one["Loop iteration"]
    total += sum(kinds[kind] * one[kind] for kind in MEASURED - PRODUCTS)
    return total, +rest


def kernel_table(graph: str, kinds: Counter, shapes: list[tuple[int, int]], costs: dict[tuple[str, int], float],
                 rows: list[int], steps: int, repeats: int) -> str:
    many = max(rows)
    lines = [f"the greedy step's kernels ({graph}'s loop body as onnxruntime optimizes it): {sum(kinds.values())} "
             f"a step: " + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common()),
             f"cost of one kernel in a bare Loop of {plural(steps, 'iteration')}, medians of {plural(repeats, 'run')} "
             "(us):",
             f"| kernel | in a step | 1 row | {many} rows | {many} rows / 1 row |", "|---" * 5 + "|"]
    in_step = Counter(f"product {k}x{n}" for k, n in shapes)
    in_step.update({kind: kinds[kind] for kind in MEASURED - PRODUCTS})
    in_step["Loop iteration"] = 1
    for name in dict.fromkeys(name for name, _ in costs):
        one, more = costs[name, 1], costs[name, many]
        ratio = f"{more / one:.2f}" if one > 0 and more > 0 else "-"
        lines.append(f"| {name} | {in_step[name]} | {cost_cell(one)} | {cost_cell(more)} | {ratio} |")
    if any(cost <= 0 for cost in costs.values()):
        lines.append(f"(noise: a cost at or below zero is within the run-to-run spread of {plural(repeats, 'run')}; "
                     f"it counts as 0 below; raise --kernel-repeats)")
    return "\n".join(lines)


def cost_cell(cost: float) -> str:
    return f"{cost:.2f}" if cost > 0 else f"{cost:.2f} (noise)"


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def source_text(checkpoint: Path, spec: ModelSpec, source: str | None) -> tuple[str, int]:
    """(--source, or the first held-out dates source of SOURCE_TOKENS tokens; its token count), checked against the
    checkpoint's source vocabulary and the model's limits before anything is exported."""
    vocab = Vocabulary.load(checkpoint / VOCAB_FILES["source"])
    text = source if source is not None else held_out(vocab)[1][0]
    try:
        encode_sources(check_texts([text]), vocab, spec)
    except InputError as err:  # empty, unencodable or too long
        raise click.BadParameter(str(err), param_hint="'--source'") from None
    ids = vocab.encode(text, add_eos=False)
    unknown = sum(i == vocab.ids.unk for i in ids)
    if 2 * unknown > len(ids):  # still timed (every length is forced), but not a source the model was made for
        click.echo(f"warning: --source: {unknown} of its {len(ids)} tokens are not in the checkpoint's source "
                   f"vocabulary ({vocab.tokenizer} tokens; they read as <unk>)", err=True)
    return text, len(ids)


def greedy_graph(model: Seq2Seq, text: str, length: int) -> str:
    """The name of the loop graph a greedy call on `text` runs (the longest feed of the call's runs)."""
    runs = recorded_calls(lambda: model.translate_batch([text], min_decoding_length=length,
                                                        max_decoding_length=length))
    return max(runs, key=lambda run: len(run[1]))[0].name


def lengths_list(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    """ct2_bench.int_list, sorted: 1 (the fixed part) and at least two lengths of 2 or more (a further step is the
    slope over them)."""
    lengths = sorted(int_list(ctx, param, value))
    if 1 not in lengths:
        raise click.BadParameter(f"expected 1 among the lengths (the fixed part is a call decoding one token), got "
                                 f"{value!r}")
    if sum(n >= 2 for n in lengths) < 2:
        raise click.BadParameter(f"expected at least two lengths of 2 or more (a further step is the slope over "
                                 f"them), got {value!r}")
    return lengths


@click.command(cls=StoppableCommand)
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A transformer checkpoint (seq2onnx train --arch transformer).")
@click.option("--source", default=None, help="The source text (default: the first held-out dates source of "
                                             f"{SOURCE_TOKENS} tokens).")
@click.option("--beams", default="1,5", show_default=True, callback=int_list, help="Beam sizes (1: greedy).")
@click.option("--lengths", default="1,2,5,10,20", show_default=True, callback=lengths_list,
              help="Output lengths T, each decoded exactly (min = max = T).")
@click.option("--repeats", type=click.IntRange(min=1), default=150, show_default=True,
              help="Timed rounds of part 1.")
@click.option("--rows", type=click.IntRange(min=2), default=5, show_default=True,
              help="Rows besides 1 at which part 2 times each kernel (a beam's rows).")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True,
              help="Loop iterations of part 2's bare loops.")
@click.option("--kernel-repeats", type=click.IntRange(min=1), default=200, show_default=True,
              help="Timed runs of each bare loop of part 2.")
def main(checkpoint: Path, source: str | None, beams: list[int], lengths: list[int], repeats: int, rows: int,
         steps: int, kernel_repeats: int) -> None:
    """Where a batch-1 decode's time goes, against CTranslate2 (see the module docstring)."""
    info = machine()
    with tempfile.TemporaryDirectory(prefix="transformer-floor-") as tmp:
        root = Path(tmp)
        try:
            convert(checkpoint, root / "ct2")
            spec = checkpoint_spec(checkpoint)
        except (ConversionError, CheckpointError) as err:
            raise click.ClickException(str(err)) from None
        if max(lengths) > spec.max_positions:
            raise click.BadParameter(f"{max(lengths)} is more than this transformer's max_positions "
                                     f"{spec.max_positions}", param_hint="'--lengths'")
        text, tokens = source_text(checkpoint, spec, source)
        click.echo(f"{info['cpu']}, {info['cpus']} CPUs, flags {info['flags']}; uptime: {info['uptime']}", err=True)
        click.echo(f"exporting {checkpoint} ...", err=True)
        export_model(checkpoint, root / "fp32")
        model = Seq2Seq.load(root / "fp32", provider="cpu", threads=1)
        translator = ctranslate2.Translator(str(root / "ct2"), device="cpu", compute_type="float32",
                                            intra_threads=1, inter_threads=1)
        click.echo(f"{info['cpu']}; source {text!r} ({tokens} tokens + </s>); 1 thread; uptime: {info['uptime']}")
        step = {}
        for beam in beams:
            click.echo(f"timing beam {beam}: {plural(repeats, 'round')} x {3 * len(lengths)} decoders ...", err=True)
            times = time_rounds(split_decoders(model, translator, text, beam, lengths), repeats)
            table, step[beam] = split_table(beam, lengths, times, repeats)
            click.echo(table + "\n")
        graph = greedy_graph(model, text, max(lengths))
        kinds, shapes = census(optimized_body(root / "fp32" / graph, root), onnx.load(root / "fp32" / graph).graph)
        click.echo(f"timing the kernels: {plural(kernel_repeats, 'run')} of each bare loop ...", err=True)
        costs = kernel_costs(spec, shapes, [1, rows], steps, kernel_repeats)
    click.echo(kernel_table(graph, kinds, shapes, costs, [1, rows], steps, kernel_repeats))
    estimate, rest = step_estimate(kinds, shapes, costs)
    measured = f"; the step measured in part 1 (runs, beam 1): {step[1]:.1f} us" if 1 in step else ""
    click.echo(f"a greedy step at these costs: {estimate:.1f} us (the measured kinds and the Loop's iteration); not "
               f"measured: " + (", ".join(f"{kind} {n}" for kind, n in rest.most_common()) or "none") + measured)
    click.echo(f"uptime after: {machine()['uptime']}", err=True)

if __name__ == "__main__":
    main()
