"""A small, deterministic trainer: Adam + MSE, teacher forcing in training, greedy validation.

Determinism: the seed fixes the model's initial weights (global torch RNG, as in the book), the
teacher-forcing coin flips (the model draws them from the global RNG) and the shuffling (its own
generator). `state_dict()` captures all of it after an epoch, so a resumed run repeats an
uninterrupted one exactly.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from runtime.defaults import POINT_DEFAULTS, SEED
from runtime.spec import ModelSpec
from training.build import build_model
from training.distributed import Dist, ddp_call, global_loss, is_main

from .data import SeqData
from .models import Attention, EncoderDecoder

STATE_FORMAT_VERSION = 1
SCALE_LIMIT = 1e6  # data values beyond this make a diverged run's hint the data's scale, not the learning rate
EVAL_CHUNK = 4096  # validation rows per forward pass; only bounds memory, results do not depend on it much

History = dict[str, list[float]]


class ConfigError(ValueError):
    """A training configuration or a saved training state does not fit this run."""


class DivergedError(ConfigError):
    """The loss became NaN or Inf: the weights are ruined, so nothing of that epoch is kept."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; the defaults are the book's."""

    epochs: int = POINT_DEFAULTS["epochs"]
    batch_size: int = POINT_DEFAULTS["batch_size"]
    lr: float = POINT_DEFAULTS["lr"]
    teacher_forcing: float = POINT_DEFAULTS["teacher_forcing"]
    seed: int = SEED

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"train config {name!r} must be a positive int, got {value!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"train config 'lr' must be a finite positive number, got {self.lr!r}")
        if not (isinstance(self.teacher_forcing, (int, float)) and 0.0 <= self.teacher_forcing <= 1.0):
            raise ConfigError(f"train config 'teacher_forcing' must be in [0, 1], got {self.teacher_forcing!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"train config 'seed' must be an int, got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, the inverse of `from_dict`."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "TrainConfig":
        """Rebuild a config, refusing unknown or missing fields by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != known:
            given = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"train config must be an object with fields {sorted(known)}, got {given}")
        return cls(**data)


def spec_for_data(data: SeqData, hidden_dim: int = 2, attention: str = "dot", n_heads: int = 1) -> ModelSpec:
    """A spec whose features and lengths come from the data."""
    return ModelSpec(n_features=data.n_features, hidden_dim=hidden_dim, attention=attention, n_heads=n_heads,
                     input_len=data.input_len, target_len=data.target_len)


def _check_fits(spec: ModelSpec, data: SeqData, role: str) -> None:
    shape = (spec.input_len, spec.target_len, spec.n_features)
    given = (data.input_len, data.target_len, data.n_features)
    if shape != given:
        raise ConfigError(f"{role} data {data.origin} has (source_len, target_len, features) = {given}, "
                          f"but the model spec expects {shape}; build the spec with spec_for_data(data)")


@torch.no_grad()
def evaluate(model: EncoderDecoder, data: SeqData, dist: Dist | None = None) -> float:
    """Mean squared error of greedy predictions (eval mode, source only) over all of `data`; under `dist` each
    rank predicts its share of the rows and the errors are summed."""
    model.eval()
    rows = torch.tensor(range(data.n) if dist is None else dist.rows(data.n), dtype=torch.long)  # (n,)
    source, target = torch.from_numpy(data.source)[rows], torch.from_numpy(data.target)[rows]
    total = 0.0
    for start in range(0, len(rows), EVAL_CHUNK):
        pred = model(source[start:start + EVAL_CHUNK])  # (n, Lt, F)
        total += F.mse_loss(pred, target[start:start + EVAL_CHUNK], reduction="sum").item()
    if dist is not None:
        (total,) = dist.all_sum(total)
    return total / data.target.size


def _unused_parameters(model: nn.Module) -> bool:
    """True when the model holds parameters its forward never uses: the book's dot attention keeps a value
    projection (`linear_value`) that only multi-head attention applies."""
    return any(isinstance(m, Attention) and not m.proj_values for m in model.modules())


class Trainer:
    """Trains one model on `train`, validating on `val` after every epoch."""

    def __init__(self, spec: ModelSpec, config: TrainConfig, train: SeqData, val: SeqData,
                 dist: Dist | None = None) -> None:
        _check_fits(spec, train, "training")
        _check_fits(spec, val, "validation")
        self.spec, self.config, self.train_data, self.val_data = spec, config, train, val
        torch.manual_seed(config.seed)
        self.model = build_model(spec, teacher_forcing_prob=config.teacher_forcing)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.epoch = 0
        self.history: History = {"train": [], "val": []}
        # The training model reads source and target as one sequence and splits it itself.
        self._full = torch.from_numpy(np.concatenate([train.source, train.target], axis=1))  # (N, Ls+Lt, F)
        self._target = torch.from_numpy(train.target)  # (N, Lt, F)
        self.dist = dist
        # DDP averages gradients in backward
        self.net = self.model if dist is None else dist.wrap(self.model, find_unused=_unused_parameters(self.model))

    def epoch_batches(self) -> list[torch.Tensor]:
        """This epoch's batches of row indices (under torchrun: of this rank's shard)."""
        if self.dist is None:
            order = torch.randperm(self.train_data.n, generator=self.generator)  # (N,)
        else:
            order = self.dist.shard(self.train_data.n, self.config.seed, self.epoch)  # (ceil(N / W),)
        # a batch past the data is all of it (torch's split takes an int64: a huge --batch-size overflowed there)
        return list(order.split(min(self.config.batch_size, max(len(order), 1))))

    def train_step(self, index: torch.Tensor) -> tuple[float, int]:
        """One optimizer step on the rows `index` (under torchrun: with every other rank's rows) -> the step's
        summed squared error and its number of coordinates, over all ranks."""
        target = self._target[index]  # (n, Lt, F)
        loss_sum = F.mse_loss(ddp_call(self.dist, self.net, self._full[index]), target, reduction="sum")
        loss, total, count = global_loss(loss_sum, target.numel(), self.dist)
        ddp_call(self.dist, loss.backward)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return total, count

    def train_epoch(self) -> float:
        """One shuffled pass in train mode; returns the mean training loss."""
        self.model.train()
        total, count = 0.0, 0
        for index in self.epoch_batches():
            step_total, step_count = self.train_step(index)
            total, count = total + step_total, count + step_count
        return total / count

    def _divergence_hint(self) -> str:
        """What to change: the data's scale when its squared errors can leave float32's range, else the rate."""
        largest = max(float(np.abs(a).max(initial=0.0)) for d in (self.train_data, self.val_data)
                      for a in (d.source, d.target))
        if largest > SCALE_LIMIT:
            return (f"the data's values reach {largest:.3g}, where a squared error overflows float32 (beyond "
                    f"~{math.sqrt(np.finfo(np.float32).max):.2g}) or swamps the gradients; scale the data (for "
                    "example to zero mean and unit variance) and start again")
        return f"lower the learning rate (lr={self.config.lr:g}) and start again"

    def fit(self, on_epoch_end: Callable[["Trainer"], None] | None = None, progress: bool = True) -> History:
        """Train from the current epoch up to `config.epochs`, calling `on_epoch_end` after each."""
        bar = tqdm(range(self.epoch, self.config.epochs), initial=self.epoch, total=self.config.epochs,
                   desc="train", unit="epoch", disable=not progress or not is_main(self.dist))
        for _ in bar:
            train_loss = self.train_epoch()
            val_loss = evaluate(self.model, self.val_data, self.dist)
            if not (math.isfinite(train_loss) and math.isfinite(val_loss)):
                bar.close()
                raise DivergedError(f"training diverged in epoch {self.epoch + 1} (training loss {train_loss:g}, "
                                    f"validation loss {val_loss:g}); this epoch was not saved; "
                                    f"{self._divergence_hint()}")
            self.epoch += 1
            self.history["train"].append(train_loss)
            self.history["val"].append(val_loss)
            bar.set_postfix(train=f"{train_loss:.4f}", val=f"{val_loss:.4f}")
            if on_epoch_end is not None:
                on_epoch_end(self)
        bar.close()
        self.model.eval()
        return self.history

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue after the current epoch (a copy, safe to keep)."""
        return resumable_state(self, STATE_FORMAT_VERSION)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state; its spec and config must match this run's (`epochs` may grow)."""
        restore_state(self, state, STATE_FORMAT_VERSION)


def resumable_state(trainer: Any, version: int, **extra: Any) -> dict[str, Any]:
    """A trainer's state after its current epoch (a deep copy): weights, optimizer, RNGs, history, spec, config;
    `extra` entries must match again on resume (e.g. the token trainer's vocabulary hashes)."""
    return copy.deepcopy({
        "format_version": version,
        "epoch": trainer.epoch,
        "spec": trainer.spec.to_dict(),
        "config": trainer.config.to_dict(),
        "history": trainer.history,
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "shuffle_rng": trainer.generator.get_state(),
        **extra,
    })


VOCAB_CHANGED = ("the vocabularies differ: a --tokenizer file or the --data they were built from changed since the "
                 "run started; restore it, or start a new run without --resume")


def _differ(then: Any, now: Any) -> list[str]:
    if not isinstance(then, dict) or not isinstance(now, dict):
        return []
    return [k for k in list(then) + [k for k in now if k not in then] if then.get(k) != now.get(k)]


def _changes(then: Any, now: Any) -> str:
    """'key A, this run B' for each key that differs (a hash by its first 12 digits)."""
    def shown(value: Any) -> str:
        return f"{value[:12]}..." if isinstance(value, str) and len(value) == 64 else repr(value)
    keys = _differ(then, now)
    if not keys:
        return f"{then!r}, this run {now!r}"
    return "; ".join(f"{k} {shown(then.get(k))}, this run {shown(now.get(k))}" for k in keys)


def restore_state(trainer: Any, state: dict[str, Any], version: int,
                  must_match: dict[str, tuple[Any, str]] | None = None) -> None:
    """Continue `trainer` from `resumable_state`'s output; spec, config (but `epochs`) and each
    `must_match[key] = (value, what it is)` must equal the saved ones."""
    if state.get("format_version") != version:
        raise ConfigError(f"training state format_version {state.get('format_version')!r} is not understood; "
                          f"this version reads {version}")
    if state["spec"] != trainer.spec.to_dict():
        sizes = any(k.endswith("vocab_size") for k in _differ(state["spec"], trainer.spec.to_dict()))
        raise ConfigError(f"training state was saved for a model of {_changes(state['spec'], trainer.spec.to_dict())}"
                          f"; {VOCAB_CHANGED if sizes else 'resume with the original model options'}")
    saved = {k: v for k, v in state["config"].items() if k != "epochs"}
    ours = {k: v for k, v in trainer.config.to_dict().items() if k != "epochs"}
    if saved != ours:
        raise ConfigError(f"training state was saved with {_changes(saved, ours)}; resume with the original training "
                          "options")
    for key, (value, what) in (must_match or {}).items():
        if state.get(key) != value:
            hint = VOCAB_CHANGED if key == "vocab_sha256" else f"resume with the original {what}"
            raise ConfigError(f"training state was saved with other {what} than this run has ({key}: "
                              f"{_changes(state.get(key), value)}); {hint}")
    if state["epoch"] > trainer.config.epochs:
        raise ConfigError(f"training state is at epoch {state['epoch']}, past this run's epochs="
                          f"{trainer.config.epochs}; pass epochs >= {state['epoch']}")
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    trainer.generator.set_state(state["shuffle_rng"])
    trainer.epoch = int(state["epoch"])
    trainer.history = {k: list(v) for k, v in state["history"].items()}
