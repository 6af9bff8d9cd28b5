"""CPU decoding: the step graph and the session settings, before and after, side by side in one run (issue 9).

    python benchmarks/cpu_step_bench.py [--repeats 7] [--threads 1 --threads 2] [--case points-b256] [--json]

Cases, seeded random weights exported to a temporary directory (parity checked by export_model):
  points-b1     GRU + dot attention, hidden 64,  batch 1,   source 50, 100 steps (runtime.points.greedy_decode)
  points-b256   GRU + dot attention, hidden 256, batch 256, source 50, 100 steps
  tokens-b1     token GRU (spec_for_text on `reverse`, hidden 128, as benchmarks/token_decode_bench.py: the EOS logit
  tokens-b64    pushed down, so every row runs all 20 steps), greedy through runtime.search over TokenSteps
Variants, each timed on the same inputs, in turn, every repeat (figures are medians after a warm-up call):
  before          the decoder's own step exported as is (an ONNX GRU op of length 1; Div after the scores' MatMul,
                  which onnxruntime fuses into a slower FusedMatMul), onnxruntime's default session settings
                  (spinning on, ORT_ENABLE_ALL) with intra_op_num_threads = t
  before+opts     that graph with seq2onnx's session settings (runtime.sessions.session_options)
  cell            the step export_model writes now (export.points.graphs, export.tokens.graphs: the GRU as Gemms and
                  gates, cells.ExplicitGRU; for points also 1/sqrt(d_k) folded into the query projection, the mask
                  applied by one Where, the read-out one Gemm), onnxruntime's default session settings
  after           the step export_model writes, seq2onnx's session settings: what Seq2Seq.load(threads=t) runs
  after+spin      after, with session.intra_op.allow_spinning on
  after+stop      after, spinning on during a run and stopped at its end (session.force_spinning_stop)
  after/extended  after, at ORT_ENABLE_EXTENDED;  after/basic: at ORT_ENABLE_BASIC
  torch           PyTorch eager: training.points.decode.reference_decode / TokenSeq2Seq.greedy, torch.set_num_threads(t)
`vs before` is before's time over the variant's (> 1: faster), `vs torch` torch's at the same threads over the
variant's. The summary compares each side at its best thread count. Then, per spinning setting: the CPU a process
burns in the 0.5 s after a call, while it waits for the next request.
On a machine that other work keeps busy, the 2-thread rows measure waiting for descheduled threads, not decoding.

Figures (AMD EPYC, 2 cores, AVX2, shared with other jobs: load 1-2 during the run; medians of 9, ms):
    case          t  before   after  after+spin   torch   after vs before   after vs torch
    points-b1     1    8.97    6.60        6.93   37.17        1.36x             5.63x
    points-b256   1  784.96  582.64      617.03  835.66        1.35x             1.43x
    points-b256   2  485.54  426.08      391.50  480.80        1.14x             1.13x
    tokens-b1     1    5.52    3.72        3.29   14.72        1.49x             3.96x
    tokens-b64    1   14.70   12.30       12.61   30.12        1.19x             2.45x
    CPU burnt in the 0.5 s after a call, 2 threads: spinning (onnxruntime's default) 40.1 ms, seq2onnx 0.1 ms.
The 1-thread rows repeat within ~10% from run to run; the 2-thread rows move by 20% and more with the machine's load.
"""
from __future__ import annotations

import copy
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
import onnxruntime as ort
import torch
import torch.nn as nn

from export.api import export_model
from export.graphs import dynamic_axes
from runtime.contract import DECODER_STEP_FILE, ENCODER_FILE, graph_io
from runtime.points import greedy_decode
from runtime.search import greedy_search
from runtime.sessions import CPU, session_options
from runtime.spec import ModelSpec
from runtime.token_steps import TokenSteps
from runtime.vocab import BOS, EOS, Vocabulary
from training.build import build_model
from training.points.decode import reference_decode
from training.tokens.builtin import REVERSE, REVERSE_MAX_LEN, TOKENIZER_OF
from training.tokens.data import load_text_dataset
from training.tokens.recurrent import TokenSeq2Seq
from training.tokens.trainer import spec_for_text

NO_EOS_BIAS = -1e4  # as token_decode_bench: EOS is never chosen, every row decodes TOKEN_STEPS steps
TOKEN_STEPS = 20
SOURCE_LEN, TARGET_LEN = 50, 100
POINT_CASES = {"points-b1": (1, 64), "points-b256": (256, 256)}  # name: (batch, hidden)
TOKEN_CASES = {"tokens-b1": 1, "tokens-b64": 64}
LEVELS = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL, "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}
IDLE_S = 0.5


class OwnPointStep(nn.Module):
    """The point decoder's own `step`, as the export wrapper was before issue 9."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.decoder, self.names = model.decoder, names

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = dict(zip(self.names, inputs))
        return self.decoder.step(feed["decoder_input"], feed["hidden"], feed["keys_t"], feed["values"],
                                 feed["source_mask"])


class OwnTokenStep(nn.Module):
    """A token model's own `step`, as the export wrapper was before issue 9."""

    def __init__(self, model: TokenSeq2Seq, names: list[str], outputs: list[str]) -> None:
        super().__init__()
        self.model, self.names, self.outputs = model, names, outputs

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = dict(zip(self.names, inputs))
        log_probs, state, alphas = self.model.step(feed.pop("previous_tokens"), feed)
        produced = {"log_probs": log_probs, "alphas": alphas, "hidden_out": state["hidden"]}
        return tuple(produced[name] for name in self.outputs)


def export_own_step(module: nn.Module, io: dict[str, dict], example: dict[str, torch.Tensor], path: Path) -> bytes:
    """Export a step module under the contract's names and dims -> the graph's bytes."""
    names = list(io["inputs"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), tuple(example[n] for n in names), str(path), input_names=names,
                          output_names=list(io["outputs"]), opset_version=17, dynamo=False,
                          dynamic_axes={**dynamic_axes(io["inputs"]), **dynamic_axes(io["outputs"])})
    return path.read_bytes()


def session(data: bytes, threads: int, variant: str) -> ort.InferenceSession:
    """A CPU session for a variant's settings (see the module docstring)."""
    if variant.startswith(("before+opts", "after")):
        options = session_options(threads, spinning=variant in ("after+spin", "after+stop"))
    else:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
    if variant == "after+stop":
        options.add_session_config_entry("session.force_spinning_stop", "1")
    if "/" in variant:
        options.graph_optimization_level = LEVELS[variant.split("/")[1]]
    options.log_severity_level = 3
    return ort.InferenceSession(data, sess_options=options, providers=[CPU])


def runner(sess: ort.InferenceSession) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """A session as the runtime's runners: feed by name -> outputs by name."""
    outputs = [o.name for o in sess.get_outputs()]
    return lambda feed: dict(zip(outputs, sess.run(outputs, feed)))


VARIANTS = ("before", "before+opts", "cell", "after", "after+spin", "after+stop", "after/extended", "after/basic")


class PointCase:
    """A seeded point model: its graphs before and after, and a decode call per variant."""

    def __init__(self, batch: int, hidden: int, tmp: Path) -> None:
        torch.manual_seed(0)
        spec = ModelSpec(n_features=2, hidden_dim=hidden, attention="dot")
        self.model = build_model(spec).eval()
        out = export_model(self.model, tmp / f"points-{hidden}")
        io = graph_io(spec)[DECODER_STEP_FILE]
        self.step_inputs = list(io["inputs"])
        n, length = 3, 5
        example = {"decoder_input": torch.randn(n, 1, 2), "hidden": torch.randn(1, n, hidden),
                   "keys_t": torch.randn(n, hidden, length), "values": torch.randn(n, length, hidden),
                   "source_mask": torch.ones(n, 1, length, dtype=torch.bool)}
        self.graphs = {"encoder": (out / ENCODER_FILE).read_bytes(), "after": (out / DECODER_STEP_FILE).read_bytes(),
                       "before": export_own_step(OwnPointStep(self.model, self.step_inputs), io, example,
                                                 tmp / f"own-{hidden}.onnx")}
        self.source = np.random.default_rng(1).normal(size=(batch, SOURCE_LEN, 2)).astype(np.float32)
        self.mask = np.ones((batch, 1, SOURCE_LEN), dtype=bool)

    def ort_call(self, threads: int, variant: str) -> Callable[[], Any]:
        step = self.graphs["before" if variant.startswith("before") else "after"]
        encoder = runner(session(self.graphs["encoder"], threads, variant))
        stepper = runner(session(step, threads, variant))
        return lambda: greedy_decode(encoder, stepper, self.step_inputs, self.source, self.mask, TARGET_LEN)

    def torch_call(self) -> Callable[[], Any]:
        source = torch.from_numpy(self.source)
        return lambda: reference_decode(self.model, source, TARGET_LEN)


class TokenCase:
    """The seeded never-stopping token GRU model: graphs before and after, and a greedy call per variant."""

    def __init__(self, batches: list[int], tmp: Path) -> None:
        train, test = load_text_dataset(REVERSE)
        kind = TOKENIZER_OF[REVERSE]
        source, target = Vocabulary.build(train.sources, kind), Vocabulary.build(train.targets, kind)
        torch.manual_seed(0)
        self.model = TokenSeq2Seq(spec_for_text(train, source, target, hidden_dim=128)).eval()
        with torch.no_grad():
            self.model.decoder.output.bias[EOS] = NO_EOS_BIAS
        out = export_model(self.model, tmp / "tokens", vocabularies=(source, target))
        texts = [s for s in test.sources if len(s) == REVERSE_MAX_LEN]
        self.ids, self.lengths = source.encode_batch(texts[:max(batches)], add_eos=True,
                                                     reverse=self.model.spec.reverse_source)
        io = graph_io(self.model.spec)[DECODER_STEP_FILE]
        with torch.no_grad():
            example = self.model.encode(torch.from_numpy(self.ids[:3]), torch.from_numpy(self.lengths[:3]))
        example["previous_tokens"] = torch.full((3,), BOS)
        own = OwnTokenStep(self.model, list(io["inputs"]), list(io["outputs"]))
        self.graphs = {"encoder": (out / ENCODER_FILE).read_bytes(), "after": (out / DECODER_STEP_FILE).read_bytes(),
                       "before": export_own_step(own, io, example, tmp / "own-tokens.onnx")}
        self.batch = max(batches)

    def at(self, batch: int) -> "TokenCase":
        """The same model and graphs, decoding the first `batch` sources."""
        view = copy.copy(self)
        view.batch = batch
        return view

    def ort_call(self, threads: int, variant: str) -> Callable[[], Any]:
        step = self.graphs["before" if variant.startswith("before") else "after"]
        steps = TokenSteps(self.model.spec, runner(session(self.graphs["encoder"], threads, variant)),
                           runner(session(step, threads, variant)))
        ids, lengths, n = self.ids[:self.batch], self.lengths[:self.batch], self.batch
        return lambda: greedy_search(steps.step, steps.encode(ids, lengths), steps.batch_axes, batch_size=n,
                                     bos_id=BOS, eos_id=EOS, max_decoding_length=TOKEN_STEPS)

    def torch_call(self) -> Callable[[], Any]:
        ids, lengths = torch.from_numpy(self.ids[:self.batch]), torch.from_numpy(self.lengths[:self.batch])
        return lambda: self.model.greedy(ids, lengths, TOKEN_STEPS)


def measure(calls: dict[str, Callable[[], Any]], repeats: int, threads: int) -> dict[str, float]:
    """Median seconds of each call, interleaved, after one warm-up each."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats + 1):
        for name, call in calls.items():
            torch.set_num_threads(threads)
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t[1:]) for name, t in times.items()}


def idle_burn(case: PointCase | TokenCase, threads: int) -> dict[str, float]:
    """CPU seconds the process burns in the IDLE_S after a call, per spinning setting (median of 3)."""
    out = {}
    for variant in ("cell", "after", "after+stop"):
        call = case.ort_call(threads, variant)
        burns = []
        for _ in range(3):
            call()
            start = time.process_time()
            time.sleep(IDLE_S)
            burns.append(time.process_time() - start)
        out[variant] = statistics.median(burns)
    return out


def case_rows(name: str, case: PointCase | TokenCase, threads: tuple[int, ...], repeats: int) -> list[dict]:
    """Every variant's median at every thread count, for one case."""
    rows = []
    for t in threads:
        calls = {v: case.ort_call(t, v) for v in VARIANTS}
        calls["torch"] = case.torch_call()
        medians = measure(calls, repeats, t)
        for variant, seconds in medians.items():
            rows.append({"case": name, "threads": t, "variant": variant, "ms": seconds * 1e3,
                         "vs_before": medians["before"] / seconds, "vs_torch": medians["torch"] / seconds})
        click.echo(f"[{name} t{t}] done", err=True)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per case: PyTorch, before and after, each at its best thread count."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        best = {v: min((r for r in rows if r["case"] == case and r["variant"] == v), key=lambda r: r["ms"])
                for v in ("torch", "before", "after")}
        out.append({"case": case, **{f"{v}_ms": best[v]["ms"] for v in best},
                    **{f"{v}_threads": best[v]["threads"] for v in best},
                    "before_vs_torch": best["torch"]["ms"] / best["before"]["ms"],
                    "after_vs_torch": best["torch"]["ms"] / best["after"]["ms"],
                    "after_vs_before": best["before"]["ms"] / best["after"]["ms"]})
    return out


def print_tables(rows: list[dict], best: list[dict], burns: dict[str, dict[str, float]]) -> None:
    click.echo(f"{'case':<12} {'t':>2} {'variant':<15} {'ms':>9} {'vs before':>9} {'vs torch':>9}")
    for r in rows:
        click.echo(f"{r['case']:<12} {r['threads']:>2} {r['variant']:<15} {r['ms']:>9.2f} {r['vs_before']:>8.2f}x "
                   f"{r['vs_torch']:>8.2f}x")
    click.echo("\neach side at its best threads (t):")
    for b in best:
        click.echo(f"{b['case']:<12} torch {b['torch_ms']:8.2f} ms (t{b['torch_threads']})  before "
                   f"{b['before_ms']:8.2f} ms (t{b['before_threads']}) {b['before_vs_torch']:5.2f}x  after "
                   f"{b['after_ms']:8.2f} ms (t{b['after_threads']}) {b['after_vs_torch']:5.2f}x vs torch, "
                   f"{b['after_vs_before']:5.2f}x vs before")
    click.echo(f"\nCPU burnt in the {IDLE_S} s after a call (points-b1):")
    for t, by_variant in burns.items():
        click.echo(f"  t{t}: " + ", ".join(f"{v} {s * 1e3:.1f} ms" for v, s in by_variant.items()))


@click.command()
@click.option("--repeats", type=click.IntRange(min=1), default=7, show_default=True)
@click.option("--threads", "thread_counts", type=click.IntRange(min=1), multiple=True, default=(1, 2),
              show_default=True, help="Thread counts to measure; repeat the option for several.")
@click.option("--case", "cases", type=click.Choice([*POINT_CASES, *TOKEN_CASES]), multiple=True,
              help="Cases to run (repeatable); all when left out.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the tables.")
def bench(repeats: int, thread_counts: tuple[int, ...], cases: tuple[str, ...], as_json: bool) -> None:
    """Median decode times before and after issue 9's step graph and session settings, and PyTorch's."""
    cases = cases or (*POINT_CASES, *TOKEN_CASES)
    rows, burns = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        token_batches = [TOKEN_CASES[c] for c in cases if c in TOKEN_CASES]
        tokens = TokenCase(token_batches, Path(tmp)) if token_batches else None
        for name in cases:
            if name in POINT_CASES:
                case = PointCase(*POINT_CASES[name], Path(tmp))
                if name == "points-b1":
                    burns = {t: idle_burn(case, t) for t in thread_counts}
            else:
                case = tokens.at(TOKEN_CASES[name])
            rows += case_rows(name, case, thread_counts, repeats)
    best = summary(rows)
    if as_json:
        click.echo(json.dumps({"onnxruntime": ort.__version__, "torch": torch.__version__, "repeats": repeats,
                               "rows": rows, "best": best, "idle_burn_s": burns}, sort_keys=True))
        return
    click.echo(f"onnxruntime {ort.__version__}, torch {torch.__version__}, CPU; medians of {repeats}")
    print_tables(rows, best, burns)


if __name__ == "__main__":
    bench()
