"""What bounds a recurrent model's batch-1 greedy decode on onnxruntime's CPU kernels: the export's whole call, its
runs, and onnxruntime's own recurrent kernel (the GRU or LSTM op) at the model's sizes, interleaved in one process.

    python benchmarks/recurrent_floor.py MODEL_DIR [--source-len L] [--target-len T] [--threads 1] [--repeats 200]
        [--checkpoint CKPT [--speed-up X]]

MODEL_DIR is a recurrent export (points or tokens; any number of layers; float32, fp16 or int8) with a greedy loop
graph. --source-len and --target-len default as in `seq2onnx bench` (points 50 and 100; a token model's input_len
and target_len); a token model decodes exactly --target-len tokens from a text of exactly --source-len tokens.

Rows (medians of --repeats timed calls each, interleaved as runtime.bench.measure times them; separate medians, so
they need not add up; below ~100 repeats the noise of a shared machine can order them wrongly):

  call        the public call at batch 1 (`predict`, or greedy `translate_batch`)
  runs        a bare replay of the onnxruntime runs that call made: the encoder, then the greedy loop
  encoder     the encoder's run alone
  loop        the greedy loop's run alone
  rnn         the encoder's recurrent nodes alone (their op, weights and attributes: one a layer, and as quantized
              as the export's), each as a one-node graph over the source: what the encoder's recurrence costs on
              onnxruntime's kernel, before embeddings, masks and projections
  rnn loop    an ONNX Loop of T steps (a Scan where the greedy graph runs its steps in one: a point model's,
              export.scan_steps) whose body is one op of that kind a decoder layer (the float op for a quantized
              one), the decoder's sizes (hidden; the first layer's input: a token model's embedding, a point
              model's features), seeded weights, fed a constant input and its own state: what the decoder's
              recurrence would cost a step written as that op, with no attention, read-out or search (the exports
              write the decoder's cell as Gemms and gates, export.cells)
  empty loop  a Loop (or Scan, as above) of T steps whose body is one Identity: its own cost (its per-call part
              shared by T)
  torch       with --checkpoint: PyTorch eager's greedy decode of the same input (the float32 checkpoint, also
              beside an int8 or fp16 export; on --threads threads), as `seq2onnx bench --checkpoint` times it

Then the API's part of the call (call - runs) and the recurrences' shares. With --checkpoint (checked, as `seq2onnx
bench --checkpoint` checks it, to be a checkpoint of the same kind and sizes as MODEL_DIR), a last line sizes a
speed-up over PyTorch eager (--speed-up X): the call's time budget, PyTorch's time / X, against the two recurrences
alone as onnxruntime's own op runs them (rnn + rnn loop), then with the API; what is left is the budget for the rest
of the encoder and every step's attention, read-out and search. PyTorch's time moves by 30-50% between runs on a
shared machine, every ratio with it: run it twice.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable

import click
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api_overhead import decode_options, recorded_calls, replay  # noqa: E402
from stops import StoppableCommand  # noqa: E402

from cli.bench import resolve_grid  # noqa: E402
from cli.eager import load_eager  # noqa: E402
from runtime.bench import Cell, make_inputs, measure, ort_call  # noqa: E402
from runtime.bench_report import describe_model  # noqa: E402
from runtime.binding import SessionRunner  # noqa: E402
from runtime.errors import Seq2OnnxError, one_line  # noqa: E402
from runtime.model import Seq2Seq  # noqa: E402
from runtime.sessions import read_graph, session_options  # noqa: E402

RECURRENT = {"GRU": "GRU", "LSTM": "LSTM", "DynamicQuantizeLSTM": "LSTM"}  # the encoder's op -> the loop's
GATES = {"GRU": 3, "LSTM": 4}
MS = "com.microsoft"
NOISY = ("; the API's part came out negative (the bare runs' median above the call's: the rounds were disturbed), so "
         "trust none of this run's figures; raise --repeats")
MOST = 1000.0  # --speed-up's largest: beyond it the budget is under a microsecond
TARGETS = {"points": 15.0, "tokens": 10.0}  # --speed-up's default: issue #22's batch-1 greedy targets
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]


def recurrent_nodes(graph: onnx.GraphProto, where: str) -> list[tuple[onnx.NodeProto, dict[str, np.ndarray]]]:
    """The graph's recurrent nodes (GRU, LSTM or its quantized form; one a layer), each with the initializers it
    reads (its weights, biases, scales)."""
    nodes = [n for n in graph.node if n.op_type in RECURRENT]
    if not nodes:
        raise click.ClickException(f"{where}: no GRU or LSTM node in the encoder; this measures recurrent models")
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    found = []
    for node in nodes:
        if node.input[1] not in weights:
            raise click.ClickException(f"{where}: the {node.op_type} node's weights {node.input[1]!r} are not an "
                                       "initializer")
        found.append((node, {name: weights[name] for name in node.input[1:] if name in weights}))
    return found


def session(graph: onnx.GraphProto, threads: int, what: str) -> ort.InferenceSession:
    model = helper.make_model(graph, opset_imports=OPSETS)
    model.ir_version = 8
    try:
        return ort.InferenceSession(model.SerializeToString(), session_options(threads),
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's own untyped errors
        raise click.ClickException(f"{what}: onnxruntime cannot run it ({one_line(exc)})") from None


def input_width(node: onnx.NodeProto, weights: dict[str, np.ndarray]) -> int:
    """The node's input size: W is (directions, gates x hidden, input), or (directions, input, gates x hidden)
    quantized."""
    w = weights[node.input[1]]
    return w.shape[1] if node.op_type == "DynamicQuantizeLSTM" else w.shape[2]


def rnn_alone(nodes: list[tuple[onnx.NodeProto, dict[str, np.ndarray]]], length: int, dtype: np.dtype,
              threads: int) -> Callable[[], int]:
    """The encoder's recurrent nodes over `length` positions at batch 1, every position valid (no lengths, zero
    initial state): each alone, with its own initializers and attributes, one after the other."""
    runs = []
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    for node, weights in nodes:
        inputs = ["x"] + [name if name in weights else "" for name in node.input[1:]]
        alone = helper.make_node(node.op_type, inputs, ["y"], domain=node.domain)
        alone.attribute.extend(node.attribute)
        width = input_width(node, weights)
        graph = helper.make_graph([alone], "rnn", [helper.make_tensor_value_info("x", elem, [None, 1, width])],
                                  [helper.make_tensor_value_info("y", elem, None)],
                                  [numpy_helper.from_array(w, name) for name, w in weights.items()])
        runs.append((session(graph, threads, f"the encoder's {node.op_type} node alone"),
                     {"x": rng.standard_normal((length, 1, width)).astype(dtype)}))

    def run() -> int:
        for layer, feed in runs:
            layer.run(["y"], feed)
        return 0
    return run


def loop_of(op: str | None, hidden: int, layers: int, width: int, dtype: np.dtype, steps: int,
            threads: int, scan: bool = False) -> Callable[[], int]:
    """A Loop of `steps` iterations whose body is `layers` stacked `op`s (GRU/LSTM; the first reads a constant
    input `width` wide, the others the layer below; each its own state; seeded weights), or one Identity (op
    None); with `scan`, a Scan of as many steps over a constant (steps, 1) input, as a point model's greedy graph
    runs them (export.scan_steps)."""
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(dtype)
    kinds = ["h"] + (["c"] if op == "LSTM" else [])
    state = [f"{kind}{layer}" for layer in range(layers if op else 1) for kind in kinds]

    def value(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, elem, [1, 1, hidden])

    def weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(dtype), name)
    nodes = [] if scan else [helper.make_node("Identity", ["cond"], ["cond_out"])]
    weights = []
    if op is None:
        nodes.append(helper.make_node("Identity", ["h0"], ["h0_out"]))
    else:
        gates, extra = GATES[op], {"GRU": {"linear_before_reset": 1}, "LSTM": {}}[op]
        x, size = "x", width
        weights.append(weight("x", (1, 1, width)))
        for layer in range(layers):
            names = [f"{n}{layer}" for n in ("w", "r", "b")]
            weights += [weight(name, shape) for name, shape in zip(names, ((1, gates * hidden, size),
                                                                         (1, gates * hidden, hidden),
                                                                         (1, 2 * gates * hidden)))]
            own = [f"{kind}{layer}" for kind in kinds]
            nodes.append(helper.make_node(op, [x, *names, "", *own], ["", *(f"{s}_out" for s in own)],
                                          hidden_size=hidden, **extra))
            x, size = f"h{layer}_out", hidden
    loop_io = ([], []) if scan else ([helper.make_tensor_value_info("i", TensorProto.INT64, []),
                                      helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                                     [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])])
    ticks = [helper.make_tensor_value_info("tick", TensorProto.FLOAT, [1])] if scan else []
    body = helper.make_graph(nodes, "body", [*loop_io[0], *map(value, state), *ticks],
                             [*loop_io[1], *(value(f"{s}_out") for s in state)], weights)
    kind = "Scan" if scan else "Loop"
    if scan:
        node = helper.make_node(kind, [*state, "ticks"], [f"{s}_last" for s in state], body=body, num_scan_inputs=1)
        length = numpy_helper.from_array(np.zeros((steps, 1), np.float32), "ticks")
    else:
        node = helper.make_node(kind, ["steps", "", *state], [f"{s}_last" for s in state], body=body)
        length = numpy_helper.from_array(np.array(steps, np.int64), "steps")
    graph = helper.make_graph([node], "loop", list(map(value, state)),
                              [helper.make_tensor_value_info(f"{s}_last", elem, None) for s in state], [length])
    run = session(graph, threads, f"a {kind} of {op or 'Identity'}")
    feed = {s: np.zeros((1, 1, hidden), dtype) for s in state}
    return lambda: (run.run(None, feed), 0)[1]


def stacked(layers: int) -> str:
    """'2 x ' for stacked layers, '' for one."""
    return f"{layers} x " if layers > 1 else ""


def decoder_state(loop: SessionRunner, fallback: int) -> tuple[int, int]:
    """(layers, hidden) of the greedy loop session's carried hidden state (its 'hidden' input, (layers, batch,
    hidden)), else (1, `fallback`)."""
    for value in loop.session.get_inputs():
        if value.name == "hidden" and len(value.shape) == 3 and all(isinstance(value.shape[i], int) for i in (0, 2)):
            return value.shape[0], value.shape[2]
    return 1, fallback


def eager_decoder(checkpoint: Path, model_dir: Path, model: Seq2Seq, threads: int, source_len: int,
                  target_len: int, inputs: Any) -> Callable[[], Any]:
    """PyTorch eager's greedy decode of `inputs`, as `seq2onnx bench --checkpoint` times it (export.eager)."""
    eager = load_eager(checkpoint, model_dir, model)
    eager.set_threads(threads)
    points = model.spec.kind == "points"
    return eager.decoders(Cell("cpu", threads, "fused", 1, source_len, target_len, None if points else 1),
                          inputs)["torch"][1]


def finite_speed_up(value: float | None) -> float | None:
    """--speed-up: a number from 1 to MOST (click's FloatRange lets nan through)."""
    if value is not None and not (math.isfinite(value) and 1 <= value <= MOST):
        raise click.BadParameter(f"expected a number from 1 to {MOST:g} (times PyTorch eager's speed), got {value}",
                                 param_hint="'--speed-up'")
    return value


def budget(times: dict[str, float], speed_up: float) -> str:
    """What `speed_up` x PyTorch eager leaves for the call, against the recurrences alone and with the API (us)."""
    allowed = times["torch"] / speed_up
    api = times["call"] - times["runs"]
    recurrences = times["rnn"] + times["rnn loop"]
    return (f"{speed_up:g}x PyTorch eager ({times['torch']:.1f} us) needs the call in {allowed:.1f} us; it takes "
            f"{times['call']:.1f} ({times['call'] / allowed:.2f}x that). The encoder's recurrence and the decoder's "
            f"alone take {recurrences:.1f} ({recurrences / allowed:.2f}x), and with the API {recurrences + api:.1f} "
            f"({(recurrences + api) / allowed:.2f}x)" + (NOISY if api < 0 else ""))


def help_text() -> str:
    """The docstring's first paragraph, then its legend of the rows kept as written."""
    paragraphs = __doc__.split("\n\n")
    return paragraphs[0].replace("\n", " ") + "\n\n\b\n" + "\n\n\b\n".join(paragraphs[3:6])


@click.command(cls=StoppableCommand, help=help_text())
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@decode_options
@click.option("--repeats", type=click.IntRange(1), default=200, show_default=True, help="Timed calls a side.")
@click.option("--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="The model's checkpoint: time PyTorch eager's decode of the same input too, and size the "
                   "call's budget at --speed-up times PyTorch's speed.")
@click.option("--speed-up", type=float, default=None, callback=lambda ctx, param, value: finite_speed_up(value),
              help="The speed-up over PyTorch eager to size (with --checkpoint), from 1 to 1000.  [default: 15 "
                   "for a point model, 10 for a token model: issue #22's batch-1 greedy targets]")
def main(model_dir: Path, source_len: int | None, target_len: int | None, threads: int, repeats: int,
         checkpoint: Path | None, speed_up: float | None) -> None:
    if speed_up is not None and checkpoint is None:
        raise click.UsageError("--speed-up sizes a budget from PyTorch eager's time: pass the model's --checkpoint "
                               "with it")
    try:
        model = Seq2Seq.load(model_dir, provider="cpu", threads=threads)
        spec = model.spec
        points = spec.kind == "points"
        if spec.is_transformer:
            raise click.ClickException(f"{model_dir}: a transformer has no recurrent kernel; this measures "
                                       "recurrent models (benchmarks/ct2_bench.py compares transformers)")
        given = {"batches": (1,), "beams": () if points else (1,), "source_lens": (source_len,) if source_len else (),
                 "target_lens": (target_len,) if target_len else ()}
        axes = resolve_grid(click.get_current_context(), model_dir, spec, given, None if points else model.contract)
        (source_len,), (target_len,) = axes["source_lens"], axes["target_lens"]
        inputs = make_inputs(spec, None if points else model.vocabularies["source"], 1, source_len,
                             contract=None if points else model.contract)
        eager = (None if checkpoint is None  # checked before the timed sides are built
                 else eager_decoder(checkpoint, model_dir, model, threads, source_len, target_len, inputs))
        call = ort_call(model, Cell("cpu", threads, "fused", 1, source_len, target_len, None if points else 1),
                        inputs)
        runs = recorded_calls(call)
        if len(runs) != 2:
            raise click.ClickException(f"{model_dir}: a greedy decode made {len(runs)} onnxruntime runs, expected the "
                                       "encoder and the greedy loop; this measures exports with a greedy loop graph")
        (encoder, encoder_feed, _, _), (loop, _, _, _) = runs
        data = read_graph(model_dir, encoder.name, model.manifest.graphs[encoder.name]["sha256"])  # as loaded
        nodes = recurrent_nodes(onnx.load_from_string(data).graph, str(model_dir / encoder.name))
        steps = read_graph(model_dir, loop.name, model.manifest.graphs[loop.name]["sha256"])
        scan = any(n.op_type == "Scan" for n in onnx.load_from_string(steps).graph.node)  # export.scan_steps
        node = nodes[0][0]
        op = RECURRENT[node.op_type]
        rnn_hidden = next(a.i for a in node.attribute if a.name == "hidden_size")
        layers, hidden = decoder_state(loop, rnn_hidden)
        width = spec.n_features if points else spec.embedding_dim or hidden  # the decoder cell's first input
        dtype = np.dtype(next(w for w in nodes[0][1].values() if w.dtype.kind == "f").dtype)
        source = encoder.session.get_inputs()[0].name  # source ids (N, L) or points (N, L, F)
        positions = int(encoder_feed[source].shape[1])  # what the encoder reads, specials included
        sides: dict[str, Callable[[], Any]] = {
            "call": call,
            "runs": replay(runs),
            "encoder": replay(runs[:1]),
            "loop": replay(runs[1:]),
            "rnn": rnn_alone(nodes, positions, dtype, threads),
            "rnn loop": loop_of(op, hidden, layers, width, dtype, target_len, threads, scan),
            "empty loop": loop_of(None, hidden, 1, width, dtype, target_len, threads, scan),
        }
        if eager is not None:
            sides["torch"] = eager
        times = {name: t.median_s * 1e6 for name, t in measure(sides, warmup=2, repeats=repeats).items()}
        print(f"{model_dir}: {describe_model(spec)}; batch 1, {threads} thread(s), source {source_len} "
              f"({positions} encoder positions), target {target_len}; {dtype.name} recurrences; medians of "
              f"{repeats} (us)")
        direction = next((a.s.decode() for a in node.attribute if a.name == "direction"), "forward")
        notes = {"rnn": f"{stacked(len(nodes))}{node.op_type} {direction}, hidden {rnn_hidden}, over {positions} "
                        "positions",
                 "rnn loop": f"{stacked(layers)}{op}, hidden {hidden}, input {width}, {target_len} step{'s' * (target_len != 1)}: "
                             f"{times['rnn loop'] / target_len:.2f} us a step",
                 "loop": f"{times['loop'] / target_len:.2f} us a step",
                 "empty loop": f"{times['empty loop'] / target_len:.2f} us a step"}
        if scan:  # the two built rows run as the greedy graph does
            notes = {name: f"{note} (a Scan)" if name.endswith(" loop") else note for name, note in notes.items()}
        notes["torch"] = "PyTorch eager, the same decode"
        for name, us in times.items():
            print(f"{name:>10} {us:9.1f}  {notes.get(name, '')}".rstrip())
        print(f"{'API':>10} {times['call'] - times['runs']:9.1f}  call - runs")
        print(f"rnn: {times['rnn'] / times['encoder']:.0%} of the encoder's run; rnn loop: "
              f"{times['rnn loop'] / times['loop']:.0%} of the greedy loop's")
        if checkpoint is not None:
            print(budget(times, speed_up or TARGETS[spec.kind]))
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":
    main()
