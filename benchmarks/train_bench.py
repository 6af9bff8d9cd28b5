"""Time the project trainer against plain PyTorch loops doing the same steps on the default squares run.

    python benchmarks/train_bench.py [--repeats 5] [--epochs 100]

Variants, run round-robin so drifts in machine load hit all of them alike:
  plain       hand-written loop: same model, data, seeded shuffles, Adam steps and per-epoch validation
  dataloader  the same loop with the book's DataLoader(TensorDataset, shuffle=True, generator=...)
  trainer     training.points.trainer.Trainer.fit, no progress bar
  train-cli   what `seq2onnx train` adds: progress bar (to a buffer), train_state.pt every epoch, final checkpoint
plain, trainer and train-cli must end with identical weights; the benchmark fails otherwise. The DataLoader's
sampler draws extra random numbers from the generator each epoch, so its batches (and weights) differ.
"""
from __future__ import annotations

import contextlib
import io
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import click
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from runtime.contract import CHECKPOINT_STATE_FILE, partial_dir
from training.build import build_model
from training.checkpoint import save_checkpoint
from training.points.data import SeqData, describe_dataset, squares
from training.points.trainer import TrainConfig, Trainer, evaluate, spec_for_data
from training.train_state import save_train_state

TARGET_RATIO = 1.5
Weights = dict[str, torch.Tensor]


def plain_loop(train: SeqData, test: SeqData, config: TrainConfig, use_dataloader: bool = False) -> Weights:
    """The training written out by hand, as a user would without the project."""
    torch.manual_seed(config.seed)
    model = build_model(spec_for_data(train), teacher_forcing_prob=config.teacher_forcing)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    loss_fn = nn.MSELoss()
    generator = torch.Generator().manual_seed(config.seed)
    full = torch.as_tensor(np.concatenate([train.source, train.target], axis=1))  # (N, Ls+Lt, F)
    target = torch.as_tensor(train.target)
    source_test, target_test = torch.as_tensor(test.source), torch.as_tensor(test.target)
    loader = DataLoader(TensorDataset(full, target), batch_size=config.batch_size, shuffle=True, generator=generator)
    losses = []
    for _ in range(config.epochs):
        model.train()
        if use_dataloader:
            batches = iter(loader)
        else:
            order = torch.randperm(len(full), generator=generator)
            batches = ((full[i], target[i]) for i in order.split(config.batch_size))
        total = 0.0
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            total += loss.item() * len(x)
        model.eval()
        with torch.no_grad():
            losses.append((total / len(full), loss_fn(model(source_test), target_test).item()))
    return model.state_dict()


def project_trainer(train: SeqData, test: SeqData, config: TrainConfig) -> Weights:
    """The project's trainer, quiet, nothing saved."""
    trainer = Trainer(spec_for_data(train), config, train, test)
    trainer.fit(progress=False)
    return trainer.model.state_dict()


def project_cli_path(train: SeqData, test: SeqData, config: TrainConfig) -> Weights:
    """The trainer plus everything `seq2onnx train` does around it."""
    spec, description = spec_for_data(train), describe_dataset("squares", train, test)
    trainer = Trainer(spec, config, train, test)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ck"

        def save_state(t: Trainer) -> None:
            save_train_state(partial_dir(out) / CHECKPOINT_STATE_FILE, t.state_dict(), description)

        with contextlib.redirect_stderr(io.StringIO()):
            trainer.fit(save_state, progress=True)
        save_checkpoint(out, trainer.model, spec, config, trainer.history, description, trainer.state_dict())
    return trainer.model.state_dict()


VARIANTS: dict[str, Callable[[SeqData, SeqData, TrainConfig], Weights]] = {
    "plain": plain_loop,
    "dataloader": lambda train, test, config: plain_loop(train, test, config, use_dataloader=True),
    "trainer": project_trainer,
    "train-cli": project_cli_path,
}


@click.command()
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=100, show_default=True)
def bench(repeats: int, epochs: int) -> None:
    """Median wall time per variant, the ratio to the plain loop, and the final test MSE."""
    train, test = squares()
    config = TrainConfig(epochs=epochs)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    weights: dict[str, Weights] = {}
    for run in VARIANTS.values():  # warm-up: first calls pay for lazy imports and allocator growth
        run(train, test, TrainConfig(epochs=2))
    for _ in range(repeats):
        for name, run in VARIANTS.items():
            start = time.perf_counter()
            weights[name] = run(train, test, config)
            times[name].append(time.perf_counter() - start)
    for name in ("trainer", "train-cli"):
        w = weights[name]
        if any(not torch.equal(w[k], weights["plain"][k]) for k in w):
            raise click.ClickException(f"variant {name!r} ended with different weights than the plain loop")
    model = build_model(spec_for_data(train))
    model.load_state_dict(weights["trainer"])
    base = statistics.median(times["plain"])
    click.echo(f"squares, dot attention, hidden 2, {epochs} epochs, batch {config.batch_size}; "
               f"torch {torch.__version__}, {torch.get_num_threads()} threads, {repeats} repeats")
    click.echo(f"{'variant':<12}{'median s':>10}{'min s':>8}{'max s':>8}{'ratio':>8}")
    for name, values in times.items():
        median = statistics.median(values)
        click.echo(f"{name:<12}{median:>10.3f}{min(values):>8.3f}{max(values):>8.3f}{median / base:>8.2f}")
    worst = max(statistics.median(times[n]) for n in ("trainer", "train-cli")) / base
    verdict = "within" if worst <= TARGET_RATIO else "OVER"
    click.echo(f"plain, trainer and train-cli end with identical weights; worst project/plain ratio {worst:.2f} "
               f"({verdict} the {TARGET_RATIO}x target)")
    click.echo(f"final test MSE: {evaluate(model, test):.5f}")


if __name__ == "__main__":
    bench()
