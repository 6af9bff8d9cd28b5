"""What bounds a recurrent model's batch-1 greedy decode on onnxruntime's CPU kernels: the export's whole call, its
runs, and onnxruntime's own recurrent kernel (the GRU or LSTM op) at the model's sizes, interleaved in one process.

    python benchmarks/recurrent_floor.py MODEL_DIR [--source-len L] [--target-len T] [--threads 1] [--repeats 200]

MODEL_DIR is a recurrent export (points or tokens) with a greedy loop graph. --source-len and --target-len default
as in `seq2onnx bench` (points 50 and 100; a token model's input_len and target_len); a token model decodes exactly
--target-len tokens from a text of exactly --source-len tokens. Timed, medians (runtime.bench.measure):

  call        the public call at batch 1 (`predict`, or greedy `translate_batch`)
  runs        a bare replay of the onnxruntime runs that call made: the encoder, then the greedy loop
  encoder     the encoder's run alone
  loop        the greedy loop's run alone
  rnn         the encoder's recurrent nodes alone (their op, weights and attributes; one a layer), each as a
              one-node graph over the source: the least an encoder on onnxruntime's kernel can take
  rnn loop    an ONNX Loop of T steps whose body is one op of that kind a decoder layer at the decoder's hidden
              size, fed its own state (seeded weights): what the decoder's recurrence alone costs a step written as that op, with no
              attention, no read-out and no search (the exports write the decoder's cell as Gemms and gates,
              export.cells, which measured within ~15% of the op a step at hidden 64-128)
  empty loop  a Loop of T steps whose body is one Identity: the Loop's own cost

Then the API's part of the call (call - runs) and the recurrences' shares. Set beside PyTorch eager's time for the
same decode (`seq2onnx bench MODEL_DIR --checkpoint CKPT --batch 1`), the rnn row alone says how much of a speed-up
target's budget one kernel takes before the model does anything else.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import click
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api_overhead import recorded_calls  # noqa: E402

from cli.bench import resolve_grid  # noqa: E402
from cli.common import check_threads_option  # noqa: E402
from runtime.bench import Cell, make_inputs, measure, ort_call  # noqa: E402
from runtime.bench_report import describe_model  # noqa: E402
from runtime.errors import Seq2OnnxError  # noqa: E402
from runtime.model import Seq2Seq  # noqa: E402
from runtime.points import MAX_TARGET_LEN  # noqa: E402
from runtime.sessions import session_options  # noqa: E402

RECURRENT = {"GRU": 3, "LSTM": 4}  # gates per op: W is (directions, gates x hidden, input)
OPSET = 17


def recurrent_nodes(graph: onnx.GraphProto, where: str) -> list[tuple[onnx.NodeProto, dict[str, np.ndarray]]]:
    """The graph's GRU/LSTM nodes (one a layer), each with its weights (W, R and B: initializers)."""
    nodes = [n for n in graph.node if n.op_type in RECURRENT]
    if not nodes:
        raise click.ClickException(f"{where}: no GRU or LSTM node in the encoder; this measures recurrent models")
    weights = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    found = []
    for node in nodes:
        missing = [name for name in node.input[1:4] if name and name not in weights]
        if missing:
            raise click.ClickException(f"{where}: the {node.op_type} node's weights {missing} are not initializers")
        found.append((node, {name: weights[name] for name in node.input[1:4] if name}))
    return found


def session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), session_options(threads),
                                providers=["CPUExecutionProvider"])


def make_model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def rnn_alone(nodes: list[tuple[onnx.NodeProto, dict[str, np.ndarray]]], length: int,
              threads: int) -> Callable[[], int]:
    """The encoder's recurrent nodes over `length` positions at batch 1, every position valid: each alone, with its
    own weights and attributes, one after the other."""
    runs = []
    rng = np.random.default_rng(0)
    for node, weights in nodes:
        alone = helper.make_node(node.op_type, ["x", *node.input[1:4]], ["y"])
        alone.attribute.extend(node.attribute)
        width = weights[node.input[1]].shape[2]  # W: (directions, gates x hidden, input)
        graph = helper.make_graph([alone], "rnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 [None, 1, width])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(w, name) for name, w in weights.items()])
        runs.append((session(make_model(graph), threads),
                     {"x": rng.standard_normal((length, 1, width)).astype(np.float32)}))

    def run() -> int:
        for layer, feed in runs:
            layer.run(["y"], feed)
        return 0
    return run


def loop_of(op: str | None, hidden: int, layers: int, steps: int, threads: int) -> Callable[[], int]:
    """A Loop of `steps` iterations whose body is `layers` stacked `op`s (GRU/LSTM, hidden in and out, seeded
    weights), the first fed the last one's output, each its own state; or one Identity (op None)."""
    rng = np.random.default_rng(0)
    kinds = ["h"] + (["c"] if op == "LSTM" else [])
    state = [f"{kind}{layer}" for layer in range(layers if op else 1) for kind in kinds]

    def value(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 1, hidden])
    nodes = [helper.make_node("Identity", ["cond"], ["cond_out"])]
    weights = []
    if op is None:
        nodes.append(helper.make_node("Identity", ["h0"], ["h0_out"]))
    else:
        gates, extra = RECURRENT[op], {"GRU": {"linear_before_reset": 1}, "LSTM": {}}[op]
        x = f"h{layers - 1}"
        for layer in range(layers):
            names = [f"{n}{layer}" for n in ("w", "r", "b")]
            weights += [numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
                        for name, shape in zip(names, ((1, gates * hidden, hidden), (1, gates * hidden, hidden),
                                                       (1, 2 * gates * hidden)))]
            own = [f"{kind}{layer}" for kind in kinds]
            nodes.append(helper.make_node(op, [x, *names, "", *own], ["", *(f"{s}_out" for s in own)],
                                          hidden_size=hidden, **extra))
            x = f"h{layer}_out"
    body = helper.make_graph(nodes, "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                                             helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                                             *map(value, state)],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              *(value(f"{s}_out") for s in state)], weights)
    loop = helper.make_node("Loop", ["steps", "", *state], [f"{s}_last" for s in state], body=body)
    graph = helper.make_graph([loop], "loop", list(map(value, state)),
                              [helper.make_tensor_value_info(f"{s}_last", TensorProto.FLOAT, None) for s in state],
                              [numpy_helper.from_array(np.array(steps, np.int64), "steps")])
    run = session(make_model(graph), threads)
    feed = {s: np.zeros((1, 1, hidden), np.float32) for s in state}
    return lambda: (run.run(None, feed), 0)[1]


def stacked(layers: int) -> str:
    """'2 x ' for stacked layers, '' for one."""
    return f"{layers} x " if layers > 1 else ""


def decoder_state(model_dir: Path, loop_file: str, fallback: int) -> tuple[int, int]:
    """(layers, hidden) of the greedy loop's carried hidden state (its 'hidden' input, (layers, batch, hidden)),
    else (1, `fallback`)."""
    for value in onnx.load(str(model_dir / loop_file), load_external_data=False).graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name == "hidden" and len(dims) == 3 and all(dims[i].HasField("dim_value") for i in (0, 2)):
            return dims[0].dim_value, dims[2].dim_value
    return 1, fallback


@click.command(help=__doc__.split("\n\n")[0].replace("\n", " "))
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--source-len", type=click.IntRange(1, MAX_TARGET_LEN), default=None,
              help="Source points or tokens (default as `seq2onnx bench`).")
@click.option("--target-len", type=click.IntRange(1, MAX_TARGET_LEN), default=None,
              help="Points or tokens decoded, exactly (default as `seq2onnx bench`).")
@click.option("--threads", type=int, default=1, show_default=True, callback=check_threads_option,
              help="Intra-op threads.")
@click.option("--repeats", type=click.IntRange(1), default=200, show_default=True, help="Timed calls a side.")
def main(model_dir: Path, source_len: int | None, target_len: int | None, threads: int, repeats: int) -> None:
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
        call = ort_call(model, Cell("cpu", threads, "fused", 1, source_len, target_len, None if points else 1),
                        inputs)
        runs = recorded_calls(call)
        if len(runs) != 2:
            raise click.ClickException(f"{model_dir}: a greedy decode made {len(runs)} onnxruntime runs, expected the "
                                       "encoder and the greedy loop; this measures exports with a greedy loop graph")
        (encoder, encoder_feed), (loop, loop_feed) = runs
        nodes = recurrent_nodes(onnx.load(str(model_dir / encoder.name)).graph, str(model_dir / encoder.name))
        node = nodes[0][0]
        rnn_hidden = next(a.i for a in node.attribute if a.name == "hidden_size")
        layers, hidden = decoder_state(model_dir, loop.name, rnn_hidden)
        positions = int(encoder_feed[next(iter(encoder_feed))].shape[1])  # what the encoder reads, specials included
        sides: dict[str, Callable[[], Any]] = {
            "call": call,
            "runs": lambda: (encoder._run(encoder_feed), loop._run(loop_feed), 0)[2],
            "encoder": lambda: (encoder._run(encoder_feed), 0)[1],
            "loop": lambda: (loop._run(loop_feed), 0)[1],
            "rnn": rnn_alone(nodes, positions, threads),
            "rnn loop": loop_of(node.op_type, hidden, layers, target_len, threads),
            "empty loop": loop_of(None, hidden, 1, target_len, threads),
        }
        print(f"{model_dir}: {describe_model(spec)}; batch 1, {threads} thread(s), source {source_len} "
              f"({positions} encoder positions), target {target_len}; medians of {repeats} (us)")
        times = {name: t.median_s * 1e6 for name, t in measure(sides, warmup=2, repeats=repeats).items()}
        direction = next((a.s.decode() for a in node.attribute if a.name == "direction"), "forward")
        notes = {"rnn": f"{stacked(len(nodes))}{node.op_type} {direction}, hidden {rnn_hidden}, over {positions} "
                        "positions",
                 "rnn loop": f"{stacked(layers)}{node.op_type}, hidden {hidden}, {target_len} steps: "
                             f"{times['rnn loop'] / target_len:.2f} us a step",
                 "loop": f"{times['loop'] / target_len:.2f} us a step",
                 "empty loop": f"{times['empty loop'] / target_len:.2f} us a step"}
        for name, us in times.items():
            print(f"{name:>10} {us:9.1f}  {notes.get(name, '')}".rstrip())
        print(f"{'API':>10} {times['call'] - times['runs']:9.1f}  call - runs")
        print(f"rnn: {times['rnn'] / times['encoder']:.0%} of the encoder's run; rnn loop: "
              f"{times['rnn loop'] / times['loop']:.0%} of the greedy loop's")
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":
    main()
