"""What the public API adds to a decode at small batches: the model's own call (`translate_batch` for token models,
`predict` for point models) against a bare replay of the onnxruntime calls that same call made, with the same feeds,
interleaved in one process (1 intra-op thread by default).

    python benchmarks/api_overhead.py artifacts/dates [--batch 1 ...] [--beam 1 --beam 5] [--source-len L]
        [--target-len T] [--threads 1] [--repeats 300]

--batch and --beam repeat (default batch 1; beams 1 and 5 for token models, point models decode greedily);
--source-len and --target-len default as in `seq2onnx bench` (a token model's input_len, within what it reads, and
target_len; points 50 and 100), and token models decode exactly --target-len tokens from texts of exactly
--source-len tokens. Per case it prints the medians of both sides and their difference, then the difference of the
two sides' 10th percentiles (the calls are not paired, so that is not a percentile of the difference).

The difference is the API's whole cost per call: checking the options, tokenizing, building the feeds, reading the
outputs back into hypotheses (or points) and text, any search the runtime drives from Python between graph calls (a
recurrent model's beam search: most of its figure), and any slowdown of the runs that this work causes (measured on
a 2-core EPYC: a few microseconds of numpy work before a run made the run itself 5-20 us slower, more than the work
took). The last column is the API call with every graph run answered from the recording: its own Python work,
without the runs' effect on it (the text work of a batch, the search between steps).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stops import StoppableCommand  # noqa: E402

from cli.bench import resolve_grid  # noqa: E402
from cli.options import check_threads_option  # noqa: E402
from runtime.bench import BLOCK, Cell, Timing, make_inputs, measure, ort_call  # noqa: E402
from runtime.bench_report import describe_model  # noqa: E402
from runtime.binding import SessionRunner  # noqa: E402
from runtime.defaults import MAX_TARGET_LEN  # noqa: E402
from runtime.denormals import flushes_now, flushing  # noqa: E402
from runtime.errors import Seq2OnnxError  # noqa: E402
from runtime.infer_tokens import MAX_BATCH  # noqa: E402
from runtime.model import Seq2Seq  # noqa: E402
from runtime.search.beam import MAX_BEAM  # noqa: E402

Recorded = list[tuple[SessionRunner, dict[str, Any], bool, dict[str, Any]]]


def recorded_calls(call: Callable[[], Any]) -> Recorded:
    """The (runner, feed, whether denormals were flushed, outputs) of every graph run one API call makes, in order
    (runners of every kind are recorded)."""
    calls: Recorded = []
    original = SessionRunner.__call__

    def record(self: SessionRunner, feed: dict[str, Any], cancel: Any = None) -> dict[str, Any]:
        outputs = original(self, feed, cancel)
        calls.append((self, dict(feed), flushes_now(), outputs))
        return outputs

    SessionRunner.__call__ = record  # type: ignore[method-assign]
    try:
        call()
    finally:
        SessionRunner.__call__ = original  # type: ignore[method-assign]
    return calls


def replay(calls: Recorded) -> Callable[[], int]:
    """The recorded runs, bare: each runner's own `_run` on its recorded feed, in order (0 tokens, for `measure`),
    with denormals flushed once around them where the API flushed (it does so once a decode: runtime.denormals)."""
    flushed = any(f for _, _, f, _ in calls)

    def run() -> int:
        with flushing(flushed):
            for runner, feed, _, _ in calls:
                runner._run(feed)
        return 0
    return run


def answered(call: Callable[[], int], calls: Recorded) -> Callable[[], int]:
    """The API call with every graph run answered from the recording, in order: its Python work alone (what it
    does around the runs, without the runs' effect on it)."""
    answers = [outputs for *_, outputs in calls]

    def run() -> int:
        given = iter(answers)
        original = SessionRunner.__call__
        SessionRunner.__call__ = lambda self, feed, cancel=None: next(given)  # type: ignore[method-assign]
        try:
            return call()
        finally:
            SessionRunner.__call__ = original  # type: ignore[method-assign]
    return run


def decode_options(command: Callable) -> Callable:
    """--source-len, --target-len and --threads, as this script and recurrent_floor.py take them."""
    for option in reversed([
        click.option("--source-len", type=click.IntRange(1, MAX_TARGET_LEN), default=None,
                     help="Source tokens (or points) per input (default as `seq2onnx bench`)."),
        click.option("--target-len", type=click.IntRange(1, MAX_TARGET_LEN), default=None,
                     help="Tokens (or points) decoded per input, exactly (default as `seq2onnx bench`)."),
        click.option("--threads", type=int, default=1, show_default=True, callback=check_threads_option,
                     help="Intra-op threads."),
    ]):
        command = option(command)
    return command


def case_options(batches: str, repeats: int) -> Callable[[Callable], Callable]:
    """MODEL_DIR, --batch (default `batches`, in words), --beam, decode_options and --repeats (default `repeats`),
    as this script and denormal_bench.py take them."""
    def apply(command: Callable) -> Callable:
        for option in reversed([
            click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path)),
            click.option("--batch", "batches", type=click.IntRange(1, MAX_BATCH), multiple=True,
                         help=f"Batch sizes (repeatable; default {batches})."),
            click.option("--beam", "beams", type=click.IntRange(1, MAX_BEAM), multiple=True,
                         help="Beam sizes of token models (repeatable; default 1 and 5)."),
            decode_options,
            click.option("--repeats", type=click.IntRange(1), default=repeats, show_default=True,
                         help=f"Timed calls a side, in rounds of {BLOCK} a side (seq2onnx bench's timing)."),
        ]):
            command = option(command)
        return command
    return apply


def case_line(label: str, runs: int, times: dict[str, Timing]) -> str:
    """'greedy b1: bare 1 run(s) 861 us (p10 840) | API 931 us (p10 905) | API adds 70 us (p10 65), 1.081x |
    its Python alone 18 us (p10 17)'."""
    bare, api, alone = (times[k].median_s * 1e6 for k in ("bare", "api", "python"))
    bare10, api10, alone10 = (np.percentile(times[k].samples, 10) * 1e6 for k in ("bare", "api", "python"))
    return (f"{label}: bare {runs} run(s) {bare:.0f} us (p10 {bare10:.0f}) | API {api:.0f} us (p10 {api10:.0f}) | "
            f"API adds {api - bare:.0f} us (p10 {api10 - bare10:.0f}), {api / bare:.3f}x | its Python alone "
            f"{alone:.0f} us (p10 {alone10:.0f})")


@click.command(cls=StoppableCommand, help=__doc__.split("\n\n")[0].replace("\n", " "))
@case_options(batches="1", repeats=300)
def main(model_dir: Path, batches: tuple[int, ...], beams: tuple[int, ...], source_len: int | None,
         target_len: int | None, threads: int, repeats: int) -> None:
    try:
        model = Seq2Seq.load(model_dir, provider="cpu", threads=threads)
        spec, points = model.spec, model.spec.kind == "points"
        given = {"batches": batches or (1,), "beams": beams, "source_lens": (source_len,) if source_len else (),
                 "target_lens": (target_len,) if target_len else ()}
        axes = resolve_grid(click.get_current_context(), model_dir, spec, given, None if points else model.contract)
        (source_len,), (target_len,) = axes["source_lens"], axes["target_lens"]
        vocab = None if points else model.vocabularies["source"]
        inputs = {batch: make_inputs(spec, vocab, batch, source_len, contract=None if points else model.contract)
                  for batch in axes["batches"]}
        print(f"{model_dir}: {describe_model(spec)}; {threads} thread(s), source {source_len}, target {target_len}, "
              f"{repeats} calls a side")
        for batch in axes["batches"]:
            for beam in axes["beams"]:
                cell = Cell("cpu", threads, "fused", batch, source_len, target_len, beam)
                api = ort_call(model, cell, inputs[batch])
                recorded = recorded_calls(api)
                label = f"{'greedy' if beam in (None, 1) else f'beam {beam}'} b{batch}"
                times = measure({"bare": replay(recorded), "api": api, "python": answered(api, recorded)},
                                warmup=1, repeats=repeats)
                print(case_line(label, len(recorded), times), flush=True)
    except Seq2OnnxError as exc:
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":
    main()
