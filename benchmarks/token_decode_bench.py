"""Token decoding speed: the exported model under onnxruntime vs the PyTorch reference, greedy and beam, side by side.

    python benchmarks/token_decode_bench.py [--hidden 128] [--steps 20] [--beam 5] [--repeats 10] [--json]

The model is spec_for_text's default on `reverse` (GRU, hidden 128, embedding 32, bidirectional encoder, dot
attention) with seeded random weights, exported to a temporary directory (parity checked). Untrained weights would
stop at random lengths, so the output bias of EOS is set to -1e4: no decoder ever picks EOS, and every sequence runs
exactly --steps steps on both sides (checked), which is what `min_decoding_length = max_decoding_length` would do
for the search strategies, but also holds for `TokenSeq2Seq.greedy`, which has no such option.

Sources are the held-out `reverse` strings of 12 digits (13 ids with EOS). Decoders, each timed on the same batch:
  ort search      Seq2Seq.token_steps (encode + step sessions) driven by runtime.search greedy_search / beam_search
  ort translate   Seq2Seq.translate_batch: the above plus text encoding and decoding to text
  torch search    training.tokens.recurrent.torch_steps driven by the same runtime.search strategies
  torch greedy    TokenSeq2Seq.greedy, the PyTorch reference loop (greedy only)
Each repeat runs every decoder once, in turn, so drift hits all alike; figures are medians after one warm-up call.
tok/s counts the output tokens (batch x steps; beam: of the best hypothesis, not of every beam row). `vs ort` is a
decoder's time over `ort search`'s at the same threads, batch and strategy (> 1: slower than onnxruntime).
Threads: torch.set_num_threads for the PyTorch side, Seq2Seq.load(threads=) for onnxruntime's intra-op pool. On a
2-core machine that something else keeps busy, the 2-thread rows measure waiting for a descheduled thread (PyTorch
suffers most: each op waits), not the decoders; read them only on a machine with idle cores.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import onnxruntime as ort
import torch

from export.api import export_model
from runtime.contract import state_batch_axes
from runtime.model import Seq2Seq
from runtime.search import beam_search, greedy_search
from runtime.vocab import BOS, EOS, Vocabulary
from training.tokens.builtin import REVERSE, REVERSE_MAX_LEN, TOKENIZER_OF
from training.tokens.data import load_text_dataset
from training.tokens.recurrent import TokenSeq2Seq, torch_steps
from training.tokens.trainer import spec_for_text

NO_EOS_BIAS = -1e4  # EOS's logit offset: far below any other logit of a random model, so EOS is never chosen
BATCHES = (1, 64)


def build(hidden: int, out: Path) -> tuple[TokenSeq2Seq, Vocabulary, list[str], Path]:
    """The seeded never-stopping model, its source vocabulary, 12-digit sources, and its export directory."""
    train, test = load_text_dataset(REVERSE)
    kind = TOKENIZER_OF[REVERSE]
    source, target = Vocabulary.build(train.sources, kind), Vocabulary.build(train.targets, kind)
    torch.manual_seed(0)
    model = TokenSeq2Seq(spec_for_text(train, source, target, hidden_dim=hidden)).eval()
    with torch.no_grad():
        model.decoder.output.bias[EOS] = NO_EOS_BIAS
    texts = [s for s in test.sources if len(s) == REVERSE_MAX_LEN]
    return model, source, texts, export_model(model, out, vocabularies=(source, target))


def decoders(model: TokenSeq2Seq, runtime: Seq2Seq, vocab: Vocabulary, texts: list[str], beam: int,
             steps: int) -> dict[str, Callable[[], list[list[int]]]]:
    """Each decoder as a call returning the best ids per text; beam > 0 is beam search, 0 greedy."""
    ids, lengths = vocab.encode_batch(texts, add_eos=True, reverse=model.spec.reverse_source)  # (N, L), (N,)
    common = {"batch_size": len(texts), "bos_id": BOS, "eos_id": EOS, "max_decoding_length": steps}
    axes = state_batch_axes(model.spec)
    token_steps = runtime.token_steps

    def search(step: Any, state: Any) -> list[list[int]]:
        if beam:
            return [h[0].tokens for h in beam_search(step, state, axes, beam_size=beam, **common)]
        return [h.tokens for h in greedy_search(step, state, axes, **common)]

    def torch_search() -> list[list[int]]:
        state, step = torch_steps(model, ids, lengths)
        return search(step, state)

    out = {"ort search": lambda: search(token_steps.step, token_steps.encode(ids, lengths)),
           "ort translate": lambda: [t[0].ids for t in runtime.translate_batch(
               texts, beam_size=max(beam, 1), max_decoding_length=steps)],
           "torch search": torch_search}
    if not beam:
        source, source_lengths = torch.from_numpy(ids), torch.from_numpy(lengths)
        out["torch greedy"] = lambda: model.greedy(source, source_lengths, steps)
    return out


def measure(calls: dict[str, Callable[[], list[list[int]]]], repeats: int, steps: int) -> dict[str, float]:
    """Median seconds of each call, interleaved; every call must emit `steps` tokens per sequence."""
    for name, call in calls.items():  # warm-up, and the fixed-length check
        lengths = {len(ids) for ids in call()}
        assert lengths == {steps}, f"{name} decoded lengths {sorted(lengths)}, expected {steps} for every sequence"
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def rows_for(model: TokenSeq2Seq, out: Path, vocab: Vocabulary, texts: list[str], threads: int, beam: int,
             steps: int, repeats: int) -> list[dict[str, Any]]:
    """Every decoder's figures at one thread count, for each batch size and strategy."""
    torch.set_num_threads(threads)
    runtime = Seq2Seq.load(out, provider="cpu", threads=threads)
    rows = []
    for batch in BATCHES:
        for strategy, width in (("greedy", 0), (f"beam {beam}", beam)):
            medians = measure(decoders(model, runtime, vocab, texts[:batch], width, steps), repeats, steps)
            for name, seconds in medians.items():
                rows.append({"threads": threads, "batch": batch, "strategy": strategy, "decoder": name,
                             "ms": seconds * 1e3, "sequences_per_s": batch / seconds,
                             "tokens_per_s": batch * steps / seconds, "vs_ort": seconds / medians["ort search"]})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a fixed-width table."""
    lines = [(f"{'threads':>7} {'batch':>5} {'strategy':<8} {'decoder':<13} {'ms':>9} {'seq/s':>9} {'tok/s':>10} "
              f"{'vs ort':>7}")]
    for r in rows:
        lines.append(f"{r['threads']:>7} {r['batch']:>5} {r['strategy']:<8} {r['decoder']:<13} {r['ms']:>9.2f} "
                     f"{r['sequences_per_s']:>9.1f} {r['tokens_per_s']:>10.0f} {r['vs_ort']:>6.2f}x")
    return "\n".join(lines)


@click.command()
@click.option("--hidden", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True,
              help="Decoding steps per sequence (every sequence runs exactly this many).")
@click.option("--beam", type=click.IntRange(min=2), default=5, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--threads", "thread_counts", type=click.IntRange(min=1), multiple=True, default=(1, 2),
              show_default=True, help="Thread counts to measure; repeat the option for several.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def bench(hidden: int, steps: int, beam: int, repeats: int, thread_counts: tuple[int, ...], as_json: bool) -> None:
    """Median decode times of onnxruntime and PyTorch, greedy and beam, at batch 1 and 64."""
    with tempfile.TemporaryDirectory() as tmp:
        model, vocab, texts, out = build(hidden, Path(tmp) / "model")
        if len(texts) < max(BATCHES):
            raise click.ClickException(f"only {len(texts)} held-out sources of {REVERSE_MAX_LEN} digits")
        rows = [row for threads in thread_counts
                for row in rows_for(model, out, vocab, texts, threads, beam, steps, repeats)]
    setup = {"onnxruntime": ort.__version__, "torch": torch.__version__, "spec": model.spec.to_dict(),
             "source_ids": REVERSE_MAX_LEN + 1, "steps": steps, "beam": beam, "repeats": repeats}
    if as_json:
        click.echo(json.dumps({"setup": setup, "rows": rows}, sort_keys=True))
        return
    spec = model.spec
    click.echo(f"onnxruntime {ort.__version__}, torch {torch.__version__}, CPU; {spec.cell.upper()} hidden "
               f"{spec.hidden_dim}, embedding {spec.embedding_dim}, {spec.attention} attention; sources of "
               f"{REVERSE_MAX_LEN + 1} ids, {steps} steps each; medians of {repeats}")
    click.echo(table(rows))


if __name__ == "__main__":
    bench()
