"""Data-parallel decoding (`Seq2Seq.load(workers=N)`, runtime.workers): a call of many rows splits into chunks of its
inputs decoded at once on copies of the sessions, and returns exactly what one copy returns; small calls, seeded
sampling and bad worker counts are handled as documented. Real sessions and real threads throughout."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from cli.infer import infer
from runtime import Seq2Seq
from runtime.errors import Cancelled, InputError
from runtime.sessions import max_threads
from runtime.workers import ALIGN, SPLIT_ROWS, Workers, check_workers
from training.tokens.builtin import toy_translation

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
two_cpus = pytest.mark.skipif(max_threads() < 2, reason="two workers of one thread need 2 CPUs")


def texts(n: int) -> list[str]:
    sources = list(toy_translation()[0].sources)
    return (sources * (n // len(sources) + 1))[:n]


class Threads:
    """A `cancel` callback that never cancels and records the threads that asked it: the thread that decodes,
    before each decoder call or step, and the cancel watchdog while a one-call graph runs."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        with self._lock:
            self.names.add(threading.current_thread().name)
        return False

    @property
    def workers(self) -> int:
        return sum(name.startswith("seq2onnx-worker") for name in self.names)


@pytest.mark.parametrize(("inputs", "rows_each", "copies", "expected"), [
    (64, 1, 2, [(0, 32), (32, 64)]),
    (63, 1, 2, [(0, 63)]),  # two chunks would hold fewer than SPLIT_ROWS rows each
    (70, 1, 2, [(0, 32), (32, 70)]),  # the second chunk starts on a block of ALIGN inputs
    (16, 5, 2, [(0, 8), (8, 16)]),  # 80 rows of beam 5
    (14, 5, 2, [(0, 14)]),  # 70 rows, but aligned chunks of 12 and 2 inputs: 2 x 5 rows are too few
    (100, 1, 3, [(0, 32), (32, 64), (64, 100)]),
    (100, 1, 4, [(0, 32), (32, 64), (64, 100)]),  # four chunks of 25 rows would be too small: three
    (12, 40, 4, [(0, 4), (4, 8), (8, 12)]),
    (500, 1, 1, [(0, 500)]),
])
def test_chunks_are_contiguous_aligned_and_hold_enough_rows(inputs, rows_each, copies, expected):
    parts = Workers(list(range(copies))).chunks(inputs, rows_each)
    assert [(p.start, p.stop) for p in parts] == expected
    assert all(p.start % ALIGN == 0 and (p.stop - p.start) * rows_each >= SPLIT_ROWS for p in parts) or \
        len(parts) == 1


def test_a_split_needs_every_chunk_decoded_by_the_whole_calls_graph():
    wide_from_16 = lambda n: n >= 16  # noqa: E731  (the float32 beam graphs: wide from 16 inputs)
    workers = Workers([0, 1])
    assert [(p.start, p.stop) for p in workers.chunks(24, 5, wide_from_16)] == [(0, 24)]  # 12 + 12: fast, not wide
    assert [(p.start, p.stop) for p in workers.chunks(32, 5, wide_from_16)] == [(0, 16), (16, 32)]
    assert [(p.start, p.stop) for p in workers.chunks(10, 5, wide_from_16)] == [(0, 10)]  # fast as a whole, but
    # aligned chunks of 8 and 2 inputs: the 2 have too few rows


def test_the_alignment_is_the_wide_greedy_loops_block():
    from export.tokens.fast import GROUP

    assert ALIGN % GROUP == 0


def dated(n: int) -> list[str]:
    """n dates in the many spellings of the `dates` set (sources of varied lengths)."""
    from training.tokens.builtin import generate_dates

    return list(generate_dates(n, 7).sources)


@pytest.fixture(scope="module")
def dates_transformer(tmp_path_factory):
    """A seeded, untrained transformer on the toy vocabularies, exported once, fed dates (sources of varied
    lengths): its wide greedy loop decodes blocks of 4 inputs, the case a chunk starting inside a block moves."""
    from support.models import export_token_model, toy_token_spec

    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=32, n_heads=2, layers=2, max_positions=64)
    return export_token_model(spec, tmp_path_factory.mktemp("dates-tf") / "model")


def hypotheses(found: list) -> list:
    return [[(h.ids, h.score, h.log_prob) for h in hyps] for hyps in found]


@two_cpus
@pytest.mark.parametrize("options", [dict(), dict(beam_size=3, num_hypotheses=2), dict(return_attention=True)])
def test_a_split_call_returns_what_one_copy_returns(transformer_export, options):
    one = Seq2Seq.load(transformer_export.path, provider="cpu", threads=1)
    two = Seq2Seq.load(transformer_export.path, provider="cpu", workers=2)
    batch, asked = texts(70), Threads()
    expected, got = one.translate_batch(batch, **options), two.translate_batch(batch, cancel=asked, **options)
    assert asked.workers == 1 and "MainThread" in asked.names  # both copies decoded a chunk
    assert hypotheses(got) == hypotheses(expected)
    if options.get("return_attention"):
        assert all(np.array_equal(a[0].attention, b[0].attention) for a, b in zip(got, expected))


@two_cpus
def test_every_batch_size_splits_exactly_even_off_the_blocks_and_at_the_beam_graphs_change(dates_transformer):
    """Sizes whose halves do not fall on the wide greedy loop's blocks of 4 inputs (66-71, 74-79 moved scores by
    ~1e-6 before chunks were aligned), and beam calls whose halves would run the fast beam graph where the whole
    call runs the wide one (from 16 inputs): the split call is exact, or runs whole."""
    one = Seq2Seq.load(dates_transformer.path, provider="cpu", threads=1)
    two = Seq2Seq.load(dates_transformer.path, provider="cpu", workers=2)
    sources = dated(80)
    for n in range(64, 81):
        asked = Threads()
        assert hypotheses(two.translate_batch(sources[:n], cancel=asked)) == \
            hypotheses(one.translate_batch(sources[:n])), n
        assert asked.workers == 1
    for n, splits in ((24, False), (32, True)):  # beam 3: 12-input halves run fast_beam, 16-input ones wide_beam
        asked = Threads()
        got = two.translate_batch(sources[:n], beam_size=3, cancel=asked)
        assert hypotheses(got) == hypotheses(one.translate_batch(sources[:n], beam_size=3)) and \
            asked.workers == splits, n


@two_cpus
def test_a_recurrent_model_and_a_point_model_split_too():
    gru = (Seq2Seq.load(ARTIFACTS / "dates", threads=1), Seq2Seq.load(ARTIFACTS / "dates", workers=2))
    batch, asked = ["March 3, 2021", "1 jan 1999", "12/11/2000", "Friday, June 9, 1961"] * 20, Threads()
    assert [h[0].ids for h in gru[1].translate_batch(batch, beam_size=2, cancel=asked)] == \
        [h[0].ids for h in gru[0].translate_batch(batch, beam_size=2)]
    assert asked.workers == 1
    points = (Seq2Seq.load(ARTIFACTS / "squares", threads=1), Seq2Seq.load(ARTIFACTS / "squares", workers=2))
    source = np.random.default_rng(0).standard_normal((90, 2, 2)).astype(np.float32)
    mask = np.ones((90, 1, 2), bool)
    mask[50, 0, 1] = False  # a padded source in the second chunk
    asked = Threads()
    got = points[1].predict(source, source_mask=mask, return_attention=True, cancel=asked)
    expected = points[0].predict(source, source_mask=mask, return_attention=True)
    assert asked.workers == 1
    assert all(np.array_equal(a, b) for a, b in zip(got, expected)) and got[0].shape == (90, 2, 2)


@two_cpus
def test_small_calls_and_seeded_sampling_run_whole(transformer_export):
    model = Seq2Seq.load(transformer_export.path, provider="cpu", workers=2)
    asked = Threads()
    model.translate_batch(texts(2 * SPLIT_ROWS - 1), cancel=asked)
    assert asked.workers == 0 and "MainThread" in asked.names
    one = Seq2Seq.load(transformer_export.path, provider="cpu", threads=1)
    draws = dict(sampling_topk=0, sampling_temperature=1.5, seed=7)
    asked = Threads()
    got = model.translate_batch(texts(80), cancel=asked, **draws)
    assert asked.workers == 0  # the seed's draws are the whole batch's
    assert [h[0].ids for h in got] == [h[0].ids for h in one.translate_batch(texts(80), **draws)]
    asked = Threads()
    model.translate_batch(texts(80), cancel=asked, sampling_topk=0)  # unseeded: nothing to repeat, so it splits
    assert asked.workers == 1


@two_cpus
def test_an_error_names_the_whole_batchs_index_and_a_cancel_stops_every_chunk():
    model = Seq2Seq.load(ARTIFACTS / "squares", workers=2, fused=False)
    second = model.copies[1]  # decodes inputs 40-79
    run_step = second.run_step

    def overflowing(feed: dict) -> dict:  # as a model whose step overflows on extreme inputs (test_runtime's)
        result = run_step(feed)
        result["output"][30] = np.nan  # its row 30: the call's input 70
        return result
    second.run_step = overflowing
    with pytest.raises(InputError, match="batch item 70 "):
        model.predict(np.ones((80, 2, 2), np.float32))
    model = Seq2Seq.load(ARTIFACTS / "squares", workers=2)
    seen = Threads()

    def cancel() -> bool:
        seen()
        return True
    with pytest.raises(Cancelled):
        model.predict(np.ones((80, 2, 2), np.float32), cancel=cancel)
    with pytest.raises(Cancelled):
        Seq2Seq.load(ARTIFACTS / "dates", workers=2).translate_batch(texts(80), cancel=cancel)
    assert seen.workers == 1  # the second chunk was asked too, and the call waited for it


@pytest.fixture(scope="module")
def int8_transformer(tmp_path_factory):
    from support.models import export_token_model, toy_token_spec

    spec = toy_token_spec(arch="transformer", d_model=16, d_ff=32, n_heads=2, layers=2, max_positions=64)
    return export_token_model(spec, tmp_path_factory.mktemp("int8-tf") / "model", quantize="int8",
                              accept_quality_loss=True)


@two_cpus
def test_copies_decode_every_call_whole_and_int8_never_splits(transformer_export, int8_transformer, tmp_path):
    """`copies` (infer's batches go one to a copy) never split a call again; an int8 export's call never splits,
    its activations being quantized per call (a split moved its scores by up to 0.17)."""
    model = Seq2Seq.load(transformer_export.path, provider="cpu", workers=2)
    assert len(model.copies) == 2 and model.copies[1] is not model
    for copy in model.copies:
        asked = Threads()
        copy.translate_batch(texts(80), cancel=asked)
        assert asked.workers == 0
    int8 = (Seq2Seq.load(int8_transformer.path, provider="cpu", threads=1),
            Seq2Seq.load(int8_transformer.path, provider="cpu", workers=2))
    asked = Threads()
    got = int8[1].translate_batch(dated(100), beam_size=2, cancel=asked)
    assert asked.workers == 0 and hypotheses(got) == hypotheses(int8[0].translate_batch(dated(100), beam_size=2))
    sources = tmp_path / "in.txt"
    sources.write_text("\n".join(dated(150)) + "\n")
    runner = CliRunner()
    outputs = [runner.invoke(infer, [str(int8_transformer.path), "--input", str(sources), "--beam", "4", *args])
               for args in (["--threads", "1"], ["--workers", "2"])]
    assert outputs[0].exit_code == outputs[1].exit_code == 0 and outputs[0].output == outputs[1].output


@pytest.mark.parametrize("workers", [1, 2] if max_threads() >= 2 else [1])
def test_a_model_is_freed_when_its_last_reference_goes(workers):
    """No reference cycle keeps a model (and its onnxruntime sessions) alive until the garbage collector, or until
    the interpreter's own teardown, runs."""
    import gc
    import weakref

    gc.disable()
    try:
        model = Seq2Seq.load(ARTIFACTS / "dates", workers=workers)
        model.translate_batch(texts(70))
        freed = [weakref.ref(m) for m in (model, *model.copies)]
        del model
        assert all(ref() is None for ref in freed)
    finally:
        gc.enable()


@two_cpus
def test_concurrent_calls_share_the_copies(transformer_export):
    model = Seq2Seq.load(transformer_export.path, provider="cpu", workers=2)
    expected = [h[0].ids for h in model.translate_batch(texts(70))]
    results: list[list[list[int]]] = []

    def call() -> None:
        results.append([h[0].ids for h in model.translate_batch(texts(70))])
    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 4


@pytest.mark.parametrize(("workers", "threads", "message"), [
    (0, None, "workers: expected a positive int, got 0"),
    (True, None, "workers: expected a positive int, got True"),
    (1.5, None, "workers: expected a positive int, got 1.5"),
    ("2", None, "workers: expected a positive int, got '2'"),
    (max_threads() + 1, None, f"more than the {max_threads()} this process may use"),
    (1, max_threads() + 1, "threads:"),
])
def test_bad_worker_counts_are_refused_before_anything_is_read(tmp_path, workers, threads, message):
    with pytest.raises(InputError, match=message):
        Seq2Seq.load(tmp_path / "missing", workers=workers, threads=threads)  # the path is never reached


@two_cpus
def test_workers_times_threads_must_fit_the_cpus():
    with pytest.raises(InputError, match=r"2 workers of 2 intra-op threads each need 4 CPUs"):
        check_workers(2, 2) if max_threads() < 4 else check_workers(max_threads(), 2)
    assert check_workers(2, None) == 2 == check_workers(2, 1)


@two_cpus
@pytest.mark.parametrize("options", [[], ["--beam", "4"], ["--sample", "--seed", "3"], ["--attention"]])
def test_infer_workers_decode_batches_side_by_side_byte_for_byte(tmp_path, dates_transformer, options):
    """infer --workers 2 decodes two --batch-size batches at once, each as one copy would: the same bytes out."""
    sources = tmp_path / "in.txt"
    sources.write_text("\n".join(dated(150)) + "\n")
    runner, model = CliRunner(), str(dates_transformer.path)
    one = runner.invoke(infer, [model, "--input", str(sources), "--threads", "1", *options])
    two = runner.invoke(infer, [model, "--input", str(sources), "--workers", "2", *options])
    assert one.exit_code == two.exit_code == 0 and one.output == two.output and one.stdout.count("\n") == 150


@two_cpus
def test_infer_workers_refuse_what_cannot_work(tmp_path):
    runner = CliRunner()
    sources = tmp_path / "in.txt"
    sources.write_text("\n".join(["March 3, 2021", "1 jan 1999", "12/11/2000"] * 30) + "\n")
    one = runner.invoke(infer, [str(ARTIFACTS / "dates"), "--input", str(sources), "--threads", "1"])
    two = runner.invoke(infer, [str(ARTIFACTS / "dates"), "--input", str(sources), "--workers", "2"])
    assert one.exit_code == two.exit_code == 0 and one.output == two.output and one.stdout.count("\n") == 90
    for args, says in ((["--workers", "2", "--ray"], "with --ray every actor holds a copy"),
                       (["--workers", str(max_threads() + 1)], "CPUs, more than the"),
                       (["--workers", "2", "--threads", str(max_threads())], "--threads"),
                       (["--workers", "0"], "'--workers'")):
        result = runner.invoke(infer, [str(ARTIFACTS / "dates"), "--text", "x", *args])
        assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output


@two_cpus
def test_the_workers_bench_times_three_ways_and_refuses_what_it_cannot_time():
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "workers_bench.py"

    def bench(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), *args, "--repeats", "2"], capture_output=True, text=True,
                              timeout=300)
    done = bench(str(ARTIFACTS / "dates"), "--batch", "64", "--beam", "1", "--steps", "5")
    assert done.returncode == 0, done.stderr
    line = done.stdout.splitlines()[-1]
    assert line.startswith("batch 64 beam 1: 1 thread ") and "2 threads " in line and "2 workers " in line
    assert line.endswith("outputs equal")
    for args, says in (([str(ARTIFACTS / "dates"), "--steps", "99999"], "max_decoding_length: 99999"),
                       ([str(ARTIFACTS / "squares"), "--beam", "5"], "is a point model"),
                       ([str(ARTIFACTS / "squares"), "--steps", "5"], "which decodes 100 points; drop --steps"),
                       ([str(ARTIFACTS / "dates"), "--workers", str(max_threads() + 1)], "--workers")):
        refused = bench(*args)
        assert refused.returncode == 2 and says in refused.stderr and "Traceback" not in refused.stderr
