"""Train a token model on the built-in `reverse` task and report wall time and held-out greedy accuracy.

    python benchmarks/token_train_bench.py [--epochs 12] [--threads 2] [--hidden 128] [--embedding 32] ...

The defaults are TokenTrainConfig's and spec_for_text's: GRU, hidden 128, embedding 32, bidirectional encoder, dot
attention, 12 epochs of Adam at 3e-3 decayed x0.8 per epoch, batch 64, clip 1.0, batches bucketed by source length.
Validation after every epoch is greedy decoding of the 1000-sequence test set (never trained on; no epoch is chosen
by it: training runs a fixed number of epochs). Results are bit-for-bit repeatable at a fixed thread count; another
thread count rounds differently and takes another path. On a 2-core machine that something else keeps busy, run
--threads 1: with 2 threads each op waits for a descheduled thread (an epoch measured 206 s instead of 6-8 s).
"""
from __future__ import annotations

import time

import click
import torch

from runtime.vocab import Vocabulary
from training.text_data import REVERSE, TOKENIZER_OF, load_text_dataset
from training.token_trainer import (
    TokenTrainConfig,
    TokenTrainer,
    evaluate_tokens,
    spec_for_text,
)

TARGET_EXACT = 0.99
TARGET_SECONDS = 120.0


@click.command()
@click.option("--epochs", type=click.IntRange(min=1), default=TokenTrainConfig.epochs, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--hidden", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--embedding", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--cell", type=click.Choice(["gru", "lstm"]), default="gru", show_default=True)
@click.option("--attention", type=click.Choice(["none", "dot", "additive"]), default="dot", show_default=True)
@click.option("--bidirectional/--unidirectional", default=True, show_default=True)
@click.option("--lr", type=float, default=TokenTrainConfig.lr, show_default=True)
@click.option("--lr-decay", type=float, default=TokenTrainConfig.lr_decay, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=TokenTrainConfig.batch_size, show_default=True)
@click.option("--clip", type=float, default=TokenTrainConfig.clip, show_default=True)
@click.option("--teacher-forcing", type=float, default=TokenTrainConfig.teacher_forcing, show_default=True)
@click.option("--reverse-source/--no-reverse-source", default=False, show_default=True)
@click.option("--bucket/--no-bucket", default=True, show_default=True)
@click.option("--seed", type=int, default=TokenTrainConfig.seed, show_default=True)
def bench(epochs: int, threads: int, hidden: int, embedding: int, cell: str, attention: str, bidirectional: bool,
          lr: float, lr_decay: float, batch_size: int, clip: float, teacher_forcing: float, reverse_source: bool,
          bucket: bool, seed: int) -> None:
    """Per-epoch loss and test accuracy with elapsed time, then the totals and the time to TARGET_EXACT."""
    torch.set_num_threads(threads)
    train, test = load_text_dataset(REVERSE)
    kind = TOKENIZER_OF[REVERSE]
    source_vocab, target_vocab = Vocabulary.build(train.sources, kind), Vocabulary.build(train.targets, kind)
    spec = spec_for_text(train, source_vocab, target_vocab, hidden_dim=hidden, embedding_dim=embedding, cell=cell,
                         bidirectional=bidirectional, attention=attention, reverse_source=reverse_source)
    config = TokenTrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, lr_decay=lr_decay, seed=seed, clip=clip,
                              teacher_forcing=teacher_forcing, bucket=bucket)
    click.echo(f"reverse: {len(train)} train / {len(test)} test pairs; torch {torch.__version__}, "
               f"{torch.get_num_threads()} threads")
    click.echo(f"spec {spec.to_dict()}")
    click.echo(f"config {config.to_dict()}")
    start = time.perf_counter()
    reached: list[tuple[int, float]] = []

    def report(trainer: TokenTrainer) -> None:
        elapsed = time.perf_counter() - start
        h = trainer.history
        click.echo(f"epoch {trainer.epoch:>3}  loss {h['train_loss'][-1]:.4f}  test exact {h['val_exact'][-1]:.4f}  "
                   f"token {h['val_token'][-1]:.4f}  {elapsed:7.1f} s")
        if h["val_exact"][-1] >= TARGET_EXACT and not reached:
            reached.append((trainer.epoch, elapsed))

    trainer = TokenTrainer(spec, config, train, test, source_vocab, target_vocab)
    trainer.fit(report, progress=False)
    wall = time.perf_counter() - start
    exact, token = evaluate_tokens(trainer.model, test, source_vocab, target_vocab)
    click.echo(f"wall time {wall:.1f} s for {epochs} epochs (validation included)")
    click.echo(f"held-out greedy: exact {exact:.4f}, token accuracy {token:.4f} on {len(test)} sequences")
    if reached:
        epoch, seconds = reached[0]
        verdict = "within" if seconds <= TARGET_SECONDS else "OVER"
        click.echo(f"exact >= {TARGET_EXACT} first after epoch {epoch}, {seconds:.1f} s ({verdict} the "
                   f"{TARGET_SECONDS:.0f} s target)")
    else:
        click.echo(f"exact never reached {TARGET_EXACT} in {epochs} epochs")


if __name__ == "__main__":
    bench()
