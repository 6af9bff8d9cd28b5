"""The point-model part of `seq2onnx train`: point data (squares, .npz), the trainer, and the held-out MSE report.
Torch is imported only inside `point_job`, so `--help` works without it."""
from __future__ import annotations

from typing import Any

import click

from training.points.data import SQUARES

from .common import say
from .train_options import given, load_or_reload


def saved_point_options(state: dict[str, Any]) -> dict[str, Any]:
    """The options a point run was started with, from its training state."""
    spec = state["spec"]
    return {"data": state["data"].get("path", SQUARES), "attention": spec["attention"], "heads": spec["n_heads"],
            "hidden_dim": spec["hidden_dim"], **state["config"]}


def point_job(ctx: click.Context, opts: dict[str, Any], state: dict[str, Any] | None, dist: Any = None) -> Any:
    """Load (or reload) point data and build spec, config and trainer."""
    from training.points.data import describe_dataset, load_dataset, reload_dataset
    from training.points.trainer import TrainConfig, Trainer, evaluate, spec_for_data
    from training.run import Job

    train_set, test_set, description = load_or_reload(opts["data"], state, load_dataset, describe_dataset,
                                                      reload_dataset, given(ctx, "data"))
    spec = spec_for_data(train_set, opts["hidden_dim"], opts["attention"], opts["heads"])
    config = TrainConfig(epochs=opts["epochs"], batch_size=opts["batch_size"], lr=opts["lr"],
                         teacher_forcing=opts["teacher_forcing"], seed=opts["seed"])
    trainer = Trainer(spec, config, train_set, test_set, dist)
    return Job(trainer, description, lambda: say(f"test MSE: {evaluate(trainer.model, test_set):.5f}", err=False))
