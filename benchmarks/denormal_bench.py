"""Decoding with denormals flushed to zero (the runtime's default, runtime.denormals) against IEEE denormals, side by
side in one process: two copies of one export, one loaded and run with `runtime.denormals.FLUSH` on, one with it
off, timed in interleaved rounds through the public API (`translate_batch`, `predict`).

    python benchmarks/denormal_bench.py MODEL_DIR [--batch 1 --batch 64] [--beam 1 --beam 5] [--source-len L]
        [--target-len T] [--threads 1] [--repeats 60]

--batch and --beam repeat (default batches 1 and 64, beams 1 and 5; point models decode greedily); lengths default as
in `seq2onnx bench`, and token models decode exactly --target-len tokens. First, onnxruntime's Softmax alone over
the wide greedy loop's batch-64 cross-attention scores, unmasked and a third masked, both ways (needs onnx). Then per
case: both medians and flushed / IEEE (< 1: flushing is faster), and whether both decoded the same ids (points: the
largest difference); a decode of one row is flushed on neither side (the runtime skips it), so its ratio is noise.
The gain depends on the CPU (measured on an Intel Xeon, where every denormal result is a microcode assist; not on
AMD): the first line names the CPU and its load.
"""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any, Callable

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from api_overhead import case_options  # noqa: E402
from stops import StoppableCommand  # noqa: E402

from cli.bench import resolve_grid  # noqa: E402
from runtime import denormals  # noqa: E402
from runtime.bench import Cell, make_inputs, measure  # noqa: E402
from runtime.bench_report import cpu_model, describe_model  # noqa: E402
from runtime.errors import Seq2OnnxError  # noqa: E402
from runtime.model import Seq2Seq  # noqa: E402
from runtime.sessions import max_threads, open_session  # noqa: E402

SIDES = {"flushed": True, "ieee": False}  # side -> runtime.denormals.FLUSH while it loads and runs


def cpu() -> str:
    """'Intel(R) Xeon(R) Processor, 2 CPUs, load 0.31'."""
    return f"{cpu_model()[0]}, {max_threads()} CPUs, load {os.getloadavg()[0]:.2f}"


SOFTMAX_SHAPE = (16, 4, 4, 52)  # the wide greedy loop's cross-attention scores at batch 64: blocks, heads, queries, keys


def softmax_line(threads: int, repeats: int) -> str:
    """onnxruntime's Softmax over SOFTMAX_SHAPE, unmasked and with a third of its keys at -inf, IEEE and flushed:
    the kernel that pays for denormals, alone."""
    try:
        from onnx import TensorProto, helper
    except ImportError:
        return "softmax alone: not timed (onnx is not installed: the `train` extra)"
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SOFTMAX_SHAPE))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SOFTMAX_SHAPE))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = open_session(model.SerializeToString(), "cpu", threads, "softmax")
    scores = np.random.default_rng(0).normal(size=SOFTMAX_SHAPE).astype(np.float32)
    masked = scores.copy()
    masked[..., ::3] = -np.inf

    def timed(x: np.ndarray, flush: bool) -> Callable[[], int]:
        def run() -> int:
            with denormals.flushing(flush):
                session.run(None, {"x": x})
            return 0
        return run

    cases = {f"{name} {side}": timed(x, flush) for name, x in (("unmasked", scores), ("masked", masked))
             for side, flush in SIDES.items()}
    times = measure(cases, warmup=2, repeats=max(repeats, 20))
    us = {name: t.median_s * 1e6 for name, t in times.items()}
    return (f"softmax alone {SOFTMAX_SHAPE}, a third of it -inf: IEEE {us['masked ieee']:.1f} us, flushed "
            f"{us['masked flushed']:.1f} us; unmasked: IEEE {us['unmasked ieee']:.1f} us, flushed "
            f"{us['unmasked flushed']:.1f} us")


def decode(model: Seq2Seq, cell: Cell, inputs: Any) -> Callable[[], Any]:
    """One decode of the cell's inputs: token ids of every best hypothesis, or the points."""
    if model.spec.kind == "points":
        return lambda: model.predict(inputs.source, cell.target_len, inputs.mask)
    return lambda: [hyps[0].ids for hyps in model.translate_batch(
        list(inputs.texts), beam_size=cell.beam, max_decoding_length=cell.target_len,
        min_decoding_length=cell.target_len)]


def side(flush: bool, call: Callable[[], Any]) -> Callable[[], int]:
    """The call with FLUSH set as the side runs (read when its decode starts); 0 tokens, for `measure`."""
    def run() -> int:
        denormals.FLUSH = flush
        call()
        return 0
    return run


def load(model_dir: Path, threads: int) -> dict[str, Seq2Seq]:
    """One copy a side, each made with its side's FLUSH (onnxruntime's worker threads take it at session creation)."""
    models = {}
    for name, flush in SIDES.items():
        denormals.FLUSH = flush
        models[name] = Seq2Seq.load(model_dir, provider="cpu", threads=threads)
    denormals.FLUSH = True
    return models


def agreement(first: Any, second: Any) -> str:
    if isinstance(first, np.ndarray):
        return f"max point diff {float(np.max(np.abs(first - second))) if first.size else 0.0:.2e}"
    return "same ids" if first == second else "DIFFERENT ids"


@click.command(cls=StoppableCommand, help=__doc__.split("\n\n")[0].replace("\n", " "))
@case_options(batches="1 and 64", repeats=60)
def main(model_dir: Path, batches: tuple[int, ...], beams: tuple[int, ...], source_len: int | None,
         target_len: int | None, threads: int, repeats: int) -> None:
    if not denormals.FLAGS.works:
        raise click.ClickException(f"denormals are flushed on x86-64 Linux only; this is {sys.platform} on "
                                   f"{platform.machine()}, where both sides would be the same")
    try:
        models = load(model_dir, threads)
        spec, points = models["flushed"].spec, models["flushed"].spec.kind == "points"
        given = {"batches": batches or (1, 64), "beams": beams, "source_lens": (source_len,) if source_len else (),
                 "target_lens": (target_len,) if target_len else ()}
        contract = None if points else models["flushed"].contract
        axes = resolve_grid(click.get_current_context(), model_dir, spec, given, contract)
        (source_len,), (target_len,) = axes["source_lens"], axes["target_lens"]
        vocab = None if points else models["flushed"].vocabularies["source"]
        print(f"{cpu()}\n{model_dir}: {describe_model(spec)}; {threads} thread(s), source {source_len}, target "
              f"{target_len}, {repeats} calls a side; ratio = flushed / IEEE (< 1: flushing is faster)")
        print(softmax_line(threads, repeats), flush=True)
        for batch in axes["batches"]:
            inputs = make_inputs(spec, vocab, batch, source_len, contract=contract)
            for beam in axes["beams"]:
                cell = Cell("cpu", threads, "fused", batch, source_len, target_len, beam)
                calls = {name: decode(models[name], cell, inputs) for name in SIDES}
                outputs = {}
                for name, flush in SIDES.items():
                    denormals.FLUSH = flush
                    outputs[name] = calls[name]()
                times = measure({name: side(flush, calls[name]) for name, flush in SIDES.items()}, warmup=1,
                                repeats=repeats)
                denormals.FLUSH = True
                flushed, ieee = (times[name].median_s * 1e3 for name in SIDES)
                label = f"{'greedy' if beam in (None, 1) else f'beam {beam}'} b{batch}"
                alike = " (one row: neither side flushes)" if batch * (beam or 1) == 1 else ""
                print(f"{label}: flushed {flushed:.3f} ms | IEEE {ieee:.3f} ms | ratio {flushed / ieee:.3f} | "
                      f"{agreement(outputs['flushed'], outputs['ieee'])}{alike}", flush=True)
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        denormals.FLUSH = True


if __name__ == "__main__":
    main()
