"""Train a token model on a built-in set (default `reverse`) and report wall time and held-out greedy accuracy.

    python benchmarks/token_train_bench.py [--arch recurrent|transformer] [--data reverse] [--epochs N] ...

Options left out take `seq2onnx train`'s defaults for the arch and data set (runtime.defaults): recurrent is a
GRU, hidden 128, embedding 32, bidirectional encoder, dot attention, 12 epochs of Adam at 3e-3 decayed x0.8 per
epoch, batch 64, clip 1.0; the transformer's are TRANSFORMER_DEFAULTS and DATASET_DEFAULTS['transformer'].
Validation after every epoch is greedy decoding of the test set (never trained on; no epoch is chosen by it:
training runs a fixed number of epochs). Results are bit-for-bit repeatable at a fixed thread count; another
thread count rounds differently and takes another path. On a 2-core machine that something else keeps busy, run
--threads 1: with 2 threads each op waits for a descheduled thread (an epoch measured 206 s instead of 6-8 s).
"""
from __future__ import annotations

import time
from typing import Any

import click
import torch

from runtime.defaults import arch_defaults
from runtime.spec import NORMS, POSITIONALS, TRAINABLE_ARCHS
from runtime.vocab import Vocabulary
from training.tokens.builtin import ACCURACY_TARGETS, BUILTIN_LOADERS, REVERSE, TOKENIZER_OF
from training.tokens.data import load_text_dataset
from training.tokens.evaluate import evaluate_tokens
from training.tokens.trainer import TokenTrainConfig, TokenTrainer, spec_for_text

TARGET_SECONDS = {"recurrent": 120.0, "transformer": 180.0}  # to the set's target, on 2 idle CPU threads
SPEC_OPTIONS = ("hidden_dim", "embedding_dim", "cell", "attention", "bidirectional", "layers", "reverse_source",
                "d_model", "d_ff", "norm", "positional", "dropout")


@click.command()
@click.option("--arch", type=click.Choice(TRAINABLE_ARCHS), default="recurrent", show_default=True)
@click.option("--data", type=click.Choice(sorted(BUILTIN_LOADERS)), default=REVERSE, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=None)
@click.option("--hidden-dim", type=click.IntRange(min=1), default=None, help="Recurrent only.")
@click.option("--embedding-dim", type=click.IntRange(min=1), default=None, help="Recurrent only.")
@click.option("--cell", type=click.Choice(["gru", "lstm"]), default=None, help="Recurrent only.")
@click.option("--attention", type=click.Choice(["none", "dot", "additive"]), default=None, help="Recurrent only.")
@click.option("--bidirectional/--unidirectional", default=None, help="Recurrent only.")
@click.option("--layers", type=click.IntRange(min=1), default=None)
@click.option("--heads", type=click.IntRange(min=1), default=None, help="Transformer only.")
@click.option("--d-model", type=click.IntRange(min=1), default=None, help="Transformer only.")
@click.option("--d-ff", type=click.IntRange(min=1), default=None, help="Transformer only.")
@click.option("--dropout", type=click.FloatRange(0, 1, max_open=True), default=None, help="Transformer only.")
@click.option("--norm", type=click.Choice(NORMS), default=None, help="Transformer only.")
@click.option("--positional", type=click.Choice(POSITIONALS), default=None, help="Transformer only.")
@click.option("--lr", type=float, default=None)
@click.option("--lr-decay", type=float, default=None)
@click.option("--warmup", type=click.IntRange(min=0), default=None)
@click.option("--batch-size", type=click.IntRange(min=1), default=None)
@click.option("--clip", type=float, default=None)
@click.option("--label-smoothing", type=float, default=None)
@click.option("--teacher-forcing", type=float, default=None)
@click.option("--reverse-source/--no-reverse-source", default=None)
@click.option("--bucket/--no-bucket", default=None)
@click.option("--seed", type=int, default=TokenTrainConfig.seed, show_default=True)
def bench(arch: str, data: str, threads: int, heads: int | None, **given: Any) -> None:
    """Per-epoch loss and test accuracy with elapsed time, then the totals and the time to the set's target."""
    torch.set_num_threads(threads)
    opts = {**arch_defaults(arch, data), **{k: v for k, v in given.items() if v is not None}}
    heads = heads or opts.get("heads") or 1
    train, test = load_text_dataset(data)
    kind = TOKENIZER_OF[data]
    source_vocab, target_vocab = Vocabulary.build(train.sources, kind), Vocabulary.build(train.targets, kind)
    spec = spec_for_text(train, source_vocab, target_vocab, arch=arch, n_heads=heads,
                         **{k: opts[k] for k in SPEC_OPTIONS if opts.get(k) is not None})
    config = TokenTrainConfig(**{f: opts[f] for f in TokenTrainConfig().to_dict() if f in opts})
    target = ACCURACY_TARGETS[data]
    click.echo(f"{data}: {len(train)} train / {len(test)} test pairs; torch {torch.__version__}, "
               f"{torch.get_num_threads()} threads")
    click.echo(f"spec {spec.to_dict()}")
    click.echo(f"config {config.to_dict()}")
    start = time.perf_counter()
    reached: list[tuple[int, float]] = []

    def report(trainer: TokenTrainer) -> None:
        elapsed = time.perf_counter() - start
        h = trainer.history
        click.echo(f"epoch {trainer.epoch:>3}  loss {h['train_loss'][-1]:.4f}  test exact {h['val_exact'][-1]:.4f}  "
                   f"token {h['val_token'][-1]:.4f}  {elapsed:7.1f} s", nl=True)
        if h["val_exact"][-1] >= target and not reached:
            reached.append((trainer.epoch, elapsed))

    trainer = TokenTrainer(spec, config, train, test, source_vocab, target_vocab)
    trainer.fit(report, progress=False)
    wall = time.perf_counter() - start
    exact, token = evaluate_tokens(trainer.model, test, source_vocab, target_vocab)
    click.echo(f"wall time {wall:.1f} s for {config.epochs} epochs (validation included)")
    click.echo(f"held-out greedy: exact {exact:.4f}, token accuracy {token:.4f} on {len(test)} sequences")
    if reached:
        epoch, seconds = reached[0]
        verdict = "within" if seconds <= TARGET_SECONDS[arch] else "OVER"
        click.echo(f"exact >= {target} first after epoch {epoch}, {seconds:.1f} s ({verdict} the "
                   f"{TARGET_SECONDS[arch]:.0f} s target)")
    else:
        click.echo(f"exact never reached {target} in {config.epochs} epochs")


if __name__ == "__main__":
    bench()
