"""The trainer of token models: padded batches (optionally bucketed by length), Adam, teacher forcing or scheduled
sampling, grad clipping, label smoothing, and greedy exact/token accuracy on the validation set after every epoch.

Encoding rules (the runtime must feed sources the same way):
  source      vocab.encode(text): its tokens, then EOS (Vocabulary's default); with the spec's `reverse_source` the
              text's tokens are reversed and EOS stays last (Sutskever et al. 2014); lengths count EOS. The runtime
              encodes with the same rule (`Vocabulary.encode_batch(reverse=spec.reverse_source)`).
  target_in   BOS + target tokens          target_out   target tokens + EOS
Every tensor is right-padded with PAD, to the longest row of its own batch.

Determinism as in `training.points.trainer`: the seed fixes the initial weights (global torch RNG, seeded just before the
model is built) and the trainer's own generator, which draws the batches and the scheduled-sampling coins, so nothing
run between construction and `fit` changes the result; a transformer's dropout draws from the global RNG, saved too.
The learning rate is a function of the epoch and the optimizer step (`TokenTrainConfig.learning_rate`: warm-up, then
per-epoch decay). `state_dict()` after an epoch holds all of it, the step count included.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from runtime.defaults import MAX_LR, RECURRENT_SIZES, SEED, TOKEN_DEFAULTS
from runtime.spec import ModelSpec
from runtime.vocab import PAD, Vocabulary
from training.build import build_token_model
from training.distributed import Dist, ddp_call, global_loss, is_main
from training.points.trainer import ConfigError, DivergedError, restore_state, resumable_state

from .base import TokenModel
from .batches import TokenBatch, TokenBatcher, encode_sources
from .evaluate import evaluate_tokens
from .pairs import TextPairs
from .recurrent import sequence_loss

TOKEN_STATE_FORMAT_VERSION = 1

History = dict[str, list[float]]
# Config fields added after the first format: absent in older spec.json / train_state.pt, read with their defaults.
ADDED_CONFIG_FIELDS = ("warmup",)
# spec_for_text's sizes of recurrent models when left out (a transformer takes its widths from d_model instead).


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class TokenTrainConfig:
    """Optimisation settings of token models; the defaults train a recurrent model on `reverse` to >= 99% exact (see
    benchmarks/token_train_bench.py; transformers: runtime.defaults.TRANSFORMER_DEFAULTS). With many more
    epochs, raise lr_decay towards 1 (e.g. 0.8 ** (12 / epochs))."""

    epochs: int = TOKEN_DEFAULTS["epochs"]
    batch_size: int = TOKEN_DEFAULTS["batch_size"]
    lr: float = TOKEN_DEFAULTS["lr"]
    lr_decay: float = TOKEN_DEFAULTS["lr_decay"]  # epoch e (0-based) trains at lr * lr_decay**e; 1 keeps it constant
    seed: int = SEED
    clip: float = TOKEN_DEFAULTS["clip"]  # max global grad norm; 0 turns clipping off
    label_smoothing: float = TOKEN_DEFAULTS["label_smoothing"]
    teacher_forcing: float = TOKEN_DEFAULTS["teacher_forcing"]  # of feeding the true previous token; < 1: scheduled
    bucket: bool = TOKEN_DEFAULTS["bucket"]
    warmup: int = TOKEN_DEFAULTS["warmup"]  # optimizer steps of linear warm-up: step s trains at (s + 1) / warmup

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"token train config {name!r} must be a positive int, got {value!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"token train config 'warmup' must be an int >= 0 (optimizer steps; 0: none), got "
                              f"{self.warmup!r}")
        if not (_is_number(self.lr) and 0 < self.lr <= MAX_LR):
            raise ConfigError(f"token train config 'lr' must be a number in (0, {MAX_LR:g}], got {self.lr!r}")
        if not (_is_number(self.lr_decay) and 0 < self.lr_decay <= 1):
            raise ConfigError(f"token train config 'lr_decay' must be a number in (0, 1], got {self.lr_decay!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"token train config 'seed' must be an int, got {self.seed!r}")
        if not (_is_number(self.clip) and self.clip >= 0):
            raise ConfigError(f"token train config 'clip' must be a finite number >= 0 (0: off), got {self.clip!r}")
        if not (_is_number(self.label_smoothing) and 0 <= self.label_smoothing < 1):
            raise ConfigError(f"token train config 'label_smoothing' must be in [0, 1), got {self.label_smoothing!r}")
        if not (_is_number(self.teacher_forcing) and 0 <= self.teacher_forcing <= 1):
            raise ConfigError(f"token train config 'teacher_forcing' must be in [0, 1], got {self.teacher_forcing!r}")
        if not isinstance(self.bucket, bool):
            raise ConfigError(f"token train config 'bucket' must be true or false, got {self.bucket!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, the inverse of `from_dict`."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> TokenTrainConfig:
        """Rebuild a config, refusing unknown or missing fields by name (fields added later may be missing)."""
        known = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or not known - set(ADDED_CONFIG_FIELDS) <= set(data) <= known:
            given = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"token train config must be an object with fields {sorted(known)}, got {given}")
        return cls(**data)

    def learning_rate(self, epoch: int, step: int) -> float:
        """The lr of optimizer step `step` (0-based, counted over the whole run) in epoch `epoch` (0-based): the
        per-epoch decay, times the linear warm-up ramp (step + 1) / warmup over the first `warmup` steps."""
        lr = self.lr * self.lr_decay ** epoch
        return lr * (step + 1) / self.warmup if step < self.warmup else lr


D = TOKEN_DEFAULTS


def spec_for_text(train: TextPairs, source_vocab: Vocabulary, target_vocab: Vocabulary, hidden_dim: int | None = None,
                  embedding_dim: int | None = None, cell: str = D["cell"], layers: int = D["layers"],
                  bidirectional: bool | None = None, attention: str = "dot", tie_embeddings: bool = D["tie_embeddings"],
                  n_heads: int = 1, reverse_source: bool = D["reverse_source"], arch: str = "recurrent",
                  d_model: int = D["d_model"], d_ff: int = D["d_ff"], norm: str = D["norm"],
                  positional: str = D["positional"], dropout: float = D["dropout"]) -> ModelSpec:
    """A token spec sized by the vocabularies; input_len / target_len are the longest source and target in tokens,
    EOS included (what the encoder reads and the decoder emits). Recurrent sizes left out are RECURRENT_SIZES; a
    transformer (arch 'transformer', d_model and d_ff given) takes its widths from d_model, so leave them out."""
    input_len = max(len(s) for s in encode_sources(train.sources, source_vocab))
    target_len = max(len(target_vocab.encode(t)) for t in train.targets)
    sizes = {"hidden_dim": hidden_dim, "embedding_dim": embedding_dim, "bidirectional": bidirectional}
    if arch == "transformer":  # ModelSpec fills these from d_model; any given must agree with it
        sizes = {k: v for k, v in sizes.items() if v is not None}
    else:
        sizes = {k: RECURRENT_SIZES[k] if v is None else v for k, v in sizes.items()}
    return ModelSpec(kind="tokens", **sizes, cell=cell, layers=layers, attention=attention,
                     tie_embeddings=tie_embeddings, n_heads=n_heads, reverse_source=reverse_source, arch=arch,
                     d_model=d_model, d_ff=d_ff, norm=norm, positional=positional, dropout=dropout,
                     source_vocab_size=len(source_vocab), target_vocab_size=len(target_vocab),
                     input_len=input_len, target_len=target_len)


def check_token_lengths(spec: ModelSpec, source_vocab: Vocabulary, target_vocab: Vocabulary,
                        *sets: TextPairs) -> None:
    """Every source (with its eos) no longer than the runtime reads, and for a transformer every source and target
    within its position table; else DataError naming the first pair over and how many are. Lines are at most
    MAX_LINE_CHARS characters, but a subword tokenizer (byte-level BPE) can make more tokens of them: a transformer
    failed in its position table with a traceback, and a recurrent model trained on sources no export could read."""
    from runtime.declared import MAX_SOURCE_TOKENS  # the runtime's longest source
    from runtime.errors import clipped
    from training.data import DataError

    limit = min(MAX_SOURCE_TOKENS, spec.max_positions) if spec.is_transformer else MAX_SOURCE_TOKENS
    sides = [("source", "sources", source_vocab, limit)]
    if spec.is_transformer:  # the decoder's input holds bos and the target: target + 1 positions
        sides.append(("target", "targets", target_vocab, spec.max_positions))
    for side, field, vocab, most in sides:
        over = [(pairs.origin, i, text, n) for pairs in sets for i, text in enumerate(getattr(pairs, field))
                if (n := len(vocab.encode(text, add_eos=True))) > most]
        if over:
            origin, i, text, n = over[0]
            why = (f"this transformer's position table ({most} positions)" if spec.is_transformer
                   else f"the {most} the runtime reads of one source")
            raise DataError(f"{origin}: {len(over)} {side}(s) hold more tokens than {why}; the first, "
                            f"{clipped(text, 40)!r}, is {n} tokens with its closing </s> "
                            f"under the {vocab.tokenizer} vocabulary: shorten or split such pairs")


def sampled_forward(model: TokenModel, batch: TokenBatch, teacher_forcing: float,
                    generator: torch.Generator) -> torch.Tensor:
    """Scheduled sampling: each row, each step, feeds the true previous token with probability `teacher_forcing`,
    else the model's own argmax (coins drawn from `generator`) -> log_probs (N, T, V)."""
    state = model.encode(batch.source, batch.lengths)
    previous = batch.target_in[:, 0]  # (N,) BOS
    steps = []
    for t in range(batch.target_in.shape[1]):
        log_probs, state, _ = model.step(previous, state)
        steps.append(log_probs)
        if t + 1 < batch.target_in.shape[1]:
            true = torch.rand(previous.shape[0], generator=generator) < teacher_forcing  # (N,)
            previous = torch.where(true, batch.target_in[:, t + 1], log_probs.argmax(dim=-1))
    return torch.stack(steps, dim=1)  # (N, T, V)


class TokenLoss(nn.Module):
    """A token model's training forward as one module (what DDP wraps): the cross-entropy summed over the real
    target tokens of a batch, with teacher forcing, or scheduled sampling when `teacher_forcing` < 1."""

    def __init__(self, model: TokenModel, label_smoothing: float) -> None:
        super().__init__()
        self.model, self.label_smoothing = model, label_smoothing

    def forward(self, batch: TokenBatch, teacher_forcing: float, generator: torch.Generator) -> torch.Tensor:
        if teacher_forcing >= 1.0:
            log_probs = self.model(batch.source, batch.lengths, batch.target_in)  # (N, T, V)
        else:
            log_probs = sampled_forward(self.model, batch, teacher_forcing, generator)
        return sequence_loss(log_probs, batch.target_out, self.label_smoothing, reduction="sum")


# -- the trainer --------------------------------------------------------------------------------------------------


class TokenTrainer:
    """Trains a TokenSeq2Seq on `train`, validating greedy accuracy on `val` after every epoch."""

    def __init__(self, spec: ModelSpec, config: TokenTrainConfig, train: TextPairs, val: TextPairs,
                 source_vocab: Vocabulary, target_vocab: Vocabulary, dist: Dist | None = None) -> None:
        sizes = (spec.kind, spec.source_vocab_size, spec.target_vocab_size)
        if sizes != ("tokens", len(source_vocab), len(target_vocab)):
            raise ConfigError(f"model spec (kind, source_vocab_size, target_vocab_size) = {sizes} does not fit the "
                              f"vocabularies of {len(source_vocab)} and {len(target_vocab)} tokens; build it with "
                              "spec_for_text(train, source_vocab, target_vocab)")
        self.spec, self.config, self.val_data = spec, config, val
        self.source_vocab, self.target_vocab = source_vocab, target_vocab
        torch.manual_seed(config.seed)
        self.model = build_token_model(spec)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.epoch = self.steps = 0  # epochs done, optimizer steps taken (the warm-up's clock)
        self.history: History = {"train_loss": [], "val_exact": [], "val_token": []}
        self.batcher = TokenBatcher(train, source_vocab, target_vocab, spec.reverse_source)
        self.dist = dist
        loss = TokenLoss(self.model, config.label_smoothing)
        self.loss = loss if dist is None else dist.wrap(loss)  # DDP averages gradients across ranks in backward

    def epoch_batches(self) -> list[torch.Tensor]:
        """This epoch's batches of row indices (under torchrun: of this rank's shard)."""
        order = None if self.dist is None else self.dist.shard(len(self.batcher), self.config.seed, self.epoch)
        return self.batcher.epoch_batches(self.config.batch_size, self.generator, self.config.bucket, order)

    def train_step(self, index: torch.Tensor) -> tuple[float, int]:
        """One optimizer step on the rows `index` (under torchrun: with every other rank's rows) -> the step's
        summed token loss and its number of target tokens, over all ranks."""
        for group in self.optimizer.param_groups:  # a function of epoch and step: both are resumable state
            group["lr"] = self.config.learning_rate(self.epoch, self.steps)
        batch = self.batcher.batch(index)
        loss_sum = ddp_call(self.dist, self.loss, batch, self.config.teacher_forcing, self.generator)
        loss, total, tokens = global_loss(loss_sum, int((batch.target_out != PAD).sum()), self.dist)
        if not math.isfinite(total):  # checked per batch: NaN weights would only waste the rest of the epoch
            raise DivergedError(f"training diverged in epoch {self.epoch + 1} (batch loss {total / tokens:g}); "
                                f"this epoch was not saved; lower the learning rate (lr={self.config.lr:g}) "
                                "or clip gradients, and start again")
        self.optimizer.zero_grad()
        ddp_call(self.dist, loss.backward)
        if self.config.clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip)
        self.optimizer.step()
        self.steps += 1
        return total, tokens

    def train_epoch(self) -> float:
        """One shuffled pass in train mode; returns the mean loss per target token (PAD excluded)."""
        self.model.train()
        total, tokens = 0.0, 0
        for index in self.epoch_batches():
            step_total, step_tokens = self.train_step(index)
            total, tokens = total + step_total, tokens + step_tokens
        return total / tokens

    def fit(self, on_epoch_end: Callable[[TokenTrainer], None] | None = None, progress: bool = True) -> History:
        """Train from the current epoch up to `config.epochs`, calling `on_epoch_end` after each."""
        bar = tqdm(range(self.epoch, self.config.epochs), initial=self.epoch, total=self.config.epochs,
                   desc="train", unit="epoch", disable=not progress or not is_main(self.dist))
        try:
            for _ in bar:
                loss = self.train_epoch()
                exact, token = evaluate_tokens(self.model, self.val_data, self.source_vocab, self.target_vocab,
                                               self.dist)
                self.epoch += 1
                for key, value in (("train_loss", loss), ("val_exact", exact), ("val_token", token)):
                    self.history[key].append(value)
                bar.set_postfix(loss=f"{loss:.4f}", exact=f"{exact:.3f}", token=f"{token:.3f}")
                if on_epoch_end is not None:
                    on_epoch_end(self)
        finally:
            bar.close()
        self.model.eval()
        return self.history

    def _vocab_sha256(self) -> dict[str, str]:
        return {"source": self.source_vocab.sha256, "target": self.target_vocab.sha256}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue after the current epoch (a copy, safe to keep)."""
        return resumable_state(self, TOKEN_STATE_FORMAT_VERSION, vocab_sha256=self._vocab_sha256(),
                               optimizer_steps=self.steps)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved state; spec, config and vocabularies must match this run's (`epochs` may grow)."""
        config = state.get("config")
        if isinstance(config, dict) and set(ADDED_CONFIG_FIELDS) - set(config):  # saved before those fields
            state = {**state, "config": TokenTrainConfig.from_dict(config).to_dict()}
        restore_state(self, state, TOKEN_STATE_FORMAT_VERSION,
                      must_match={"vocab_sha256": (self._vocab_sha256(), "vocabularies")})
        # States saved before the step count: every epoch takes ceil(N / batch_size) steps, bucketed or not.
        per_epoch = math.ceil(len(self.batcher) / self.config.batch_size)
        self.steps = int(state.get("optimizer_steps", self.epoch * per_epoch))
