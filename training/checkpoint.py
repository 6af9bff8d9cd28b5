"""Checkpoint directories: written whole or not at all, read back with `weights_only=True`.

Layout of a finished checkpoint `<out>/`:
    spec.json       {"format_version", "spec": ModelSpec dict, "train": TrainConfig dict, "data": description}
    weights.pt      the model's state_dict
    history.json    {"train": [...], "val": [...]}, one mean MSE per epoch
    loss.png        both curves (token models: training loss and validation exact / token accuracy)
    train_state.pt  optimizer, RNG states and epoch, so `--resume --epochs M` can extend the run
Token models add `source_vocab.json` and `target_vocab.json` (runtime.contract.VOCAB_FILES); their spec.json holds
a TokenTrainConfig under "train" and a `describe_text_dataset` description under "data", and their history.json
{"train_loss", "val_exact", "val_token"} per epoch.
A run in progress keeps its state in `<out>.partial/` (training.train_state).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from runtime.atomic import staged_directory
from runtime.contract import (
    CHECKPOINT_HISTORY_FILE,
    CHECKPOINT_PLOT_FILE,
    CHECKPOINT_SPEC_FILE,
    CHECKPOINT_STATE_FILE,
    CHECKPOINT_WEIGHTS_FILE,
    MANIFEST_FILE,
    PARTIAL_SUFFIX,
    VOCAB_FILES,
)
from runtime.destination import check_destination
from runtime.spec import ModelSpec, SpecError
from runtime.vocab import VocabError, Vocabulary
from training.points.models import EncoderDecoder
from training.points.trainer import ConfigError, History, TrainConfig
from training.tokens.base import TokenModel
from training.tokens.trainer import TokenTrainConfig

from .build import build_model
from .plots import plot_history
from .torch_files import load_torch, save_torch

CHECKPOINT_FORMAT_VERSION = 1
# What a point checkpoint holds; a token checkpoint adds its two vocabularies. Either may be replaced with --force.
CHECKPOINT_FILES = frozenset({CHECKPOINT_SPEC_FILE, CHECKPOINT_WEIGHTS_FILE, CHECKPOINT_HISTORY_FILE,
                              CHECKPOINT_STATE_FILE, CHECKPOINT_PLOT_FILE})
TOKEN_CHECKPOINT_FILES = CHECKPOINT_FILES | frozenset(VOCAB_FILES.values())
TRAIN_CONFIGS = {"points": TrainConfig, "tokens": TokenTrainConfig}  # spec.json's "train", by the spec's kind
META_KEYS = frozenset({"format_version", "spec", "train", "data", "vocabularies", "distributed"})  # spec.json's


class CheckpointError(OSError):
    """A checkpoint directory or training-state file is missing, incomplete or unreadable."""


def check_checkpoint_destination(out: str | Path, force: bool) -> None:
    """Refuse protected paths and anything but an earlier checkpoint (that one only with force)."""
    check_destination(out, force, kind="checkpoint", marker=CHECKPOINT_SPEC_FILE, owned=TOKEN_CHECKPOINT_FILES,
                      sibling_suffix=PARTIAL_SUFFIX)


def _write_json(path: Path, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")


def save_checkpoint(
    out: str | Path,
    model: EncoderDecoder | TokenModel,
    spec: ModelSpec,
    config: TrainConfig | TokenTrainConfig,
    history: History,
    data: dict[str, Any],
    train_state: dict[str, Any] | None = None,
    force: bool = False,
    vocabularies: tuple[Vocabulary, Vocabulary] | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory via a temporary sibling and a rename; returns its path. Token models pass
    their (source, target) `vocabularies`, saved beside the weights; `meta` adds entries to spec.json (a torchrun
    run's "distributed")."""
    out = Path(out)
    with staged_directory(out, lambda existing: check_checkpoint_destination(existing, force)) as tmp:
        save_torch(tmp / CHECKPOINT_WEIGHTS_FILE, model.state_dict(), CheckpointError)
        for side, vocab in zip(VOCAB_FILES, vocabularies or ()):
            vocab.save(tmp / VOCAB_FILES[side])
        if train_state is not None:
            save_torch(tmp / CHECKPOINT_STATE_FILE, {**train_state, "data": data}, CheckpointError)
        _write_json(tmp / CHECKPOINT_HISTORY_FILE, history)
        plot_history(history, tmp / CHECKPOINT_PLOT_FILE)
        written = {**(meta or {}), "format_version": CHECKPOINT_FORMAT_VERSION, "spec": spec.to_dict(),
                   "train": config.to_dict(), "data": data}
        if vocabularies is not None:  # hashed, so that an edited vocabulary file is refused on load
            written["vocabularies"] = {side: {"sha256": v.sha256} for side, v in zip(VOCAB_FILES, vocabularies)}
        _write_json(tmp / CHECKPOINT_SPEC_FILE, written)
    return out


def _read_json(path: Path) -> Any:
    if path.exists() and not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} is not a file (a directory, or another kind of "
                              "entry); restore the file it should be")
    if not path.is_file():
        if (path.parent / MANIFEST_FILE).is_file():  # the other mix-up is answered by runtime.manifest
            raise CheckpointError(f"{str(path.parent)!r} is an export (it holds {MANIFEST_FILE}), not a training "
                                  "checkpoint; pass the checkpoint directory it was exported from")
        raise CheckpointError(f"checkpoint file {str(path)!r} is missing; the directory is not a complete "
                              "seq2onnx checkpoint (train one with: seq2onnx train --out DIR)")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint file {str(path)!r} is not readable JSON ({err}); retrain or restore it") \
            from err


def read_meta(path: str | Path) -> dict[str, Any]:
    """spec.json of a checkpoint: format_version, spec, train config and data description."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {str(path)!r} does not exist; "
                              "train one with: seq2onnx train --out DIR")
    meta_file = path / CHECKPOINT_SPEC_FILE
    meta = _read_json(meta_file)
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if type(version) is not int or version != CHECKPOINT_FORMAT_VERSION:  # not true, nor 1.0
        has = "has no format_version" if version is None else f"has format_version {version!r}"
        raise CheckpointError(f"checkpoint file {str(meta_file)!r} {has}; this seq2onnx reads checkpoints of "
                              f"format_version {CHECKPOINT_FORMAT_VERSION}, as `seq2onnx train` writes them")
    if unknown := sorted(set(meta) - META_KEYS):  # a setting put at the top by hand would be ignored without a word
        raise CheckpointError(f"checkpoint file {str(meta_file)!r} has unknown keys {unknown}; it holds only "
                              f"{sorted(META_KEYS)} (the model's settings go under 'spec', training's under 'train')")
    return meta


def read_data_description(path: str | Path) -> dict[str, Any] | None:
    """The description of the data a checkpoint was trained on (see `training.points.data.describe_dataset`)."""
    data = read_meta(path).get("data")
    return data if isinstance(data, dict) else None


def _read_spec(path: Path) -> tuple[ModelSpec, TrainConfig | TokenTrainConfig]:
    """The spec and train config of a checkpoint's spec.json, checked."""
    meta = read_meta(path)
    try:
        spec = ModelSpec.from_dict(meta.get("spec"))
        return spec, TRAIN_CONFIGS[spec.kind].from_dict(meta.get("train"))
    except (SpecError, ConfigError) as err:
        raise CheckpointError(f"checkpoint file {str(path / CHECKPOINT_SPEC_FILE)!r} is invalid: {err}") from err


def load_checkpoint(path: str | Path) -> tuple[EncoderDecoder | TokenModel, ModelSpec, History]:
    """Rebuild the trained model (eval mode), its spec and loss history (a record: {} where history.json is gone;
    export, verify and bench do not need it, --resume reads train_state.pt) from a checkpoint directory."""
    path = Path(path)
    spec, config = _read_spec(path)
    history, history_file = {}, path / CHECKPOINT_HISTORY_FILE
    try:
        if history_file.exists() or history_file.is_symlink():
            history = _read_json(history_file)
    except CheckpointError as err:  # a record only: it need not stop an export
        raise CheckpointError(f"{err}; or delete it (a record of the losses: export, verify and bench do not need "
                              "it)") from None
    weights_file = path / CHECKPOINT_WEIGHTS_FILE
    if not weights_file.is_file():
        raise CheckpointError(f"checkpoint file {str(weights_file)!r} is missing; retrain or restore it")
    weights = load_torch(weights_file, "checkpoint file", "retrain or restore it", CheckpointError)
    with torch.random.fork_rng(devices=[]):  # building draws initial weights; keep the caller's RNG intact
        model = build_model(spec, teacher_forcing_prob=config.teacher_forcing)
    _check_weights_fit(model.state_dict(), weights, weights_file, path / CHECKPOINT_SPEC_FILE)
    model.load_state_dict(weights)
    return model.eval(), spec, history


def load_checkpoint_vocabularies(path: str | Path) -> tuple[Vocabulary, Vocabulary]:
    """The (source, target) vocabularies of a token checkpoint, each sized as its spec says."""
    path = Path(path)
    spec, _ = _read_spec(path)
    hashes = read_meta(path).get("vocabularies") or {}
    if spec.kind != "tokens":
        raise CheckpointError(f"checkpoint {str(path)!r} holds a point model, which has no vocabularies; "
                              "pass a checkpoint trained on text data")
    found = []
    for side, size in zip(VOCAB_FILES, (spec.source_vocab_size, spec.target_vocab_size)):
        file = path / VOCAB_FILES[side]
        if not file.is_file():
            raise CheckpointError(f"checkpoint file {str(file)!r} is missing; a token checkpoint keeps its {side} "
                                  "vocabulary there; restore it or retrain")
        try:
            vocab = Vocabulary.load(file)
        except VocabError as err:
            raise CheckpointError(f"{err}; restore it or retrain") from None  # the message names the file
        if len(vocab) != size:
            raise CheckpointError(f"checkpoint file {str(file)!r} holds {len(vocab)} tokens, but the spec's "
                                  f"{side}_vocab_size is {size}; restore the file it was saved with, or retrain")
        saved = hashes.get(side, {}).get("sha256") if isinstance(hashes.get(side), dict) else None
        if saved is not None and saved != vocab.sha256:
            raise CheckpointError(f"checkpoint file {str(file)!r} differs from the vocabulary it was trained with "
                                  f"(sha256 {vocab.sha256[:12]}..., spec.json says {str(saved)[:12]}...); restore "
                                  "it, or retrain")
        found.append(vocab)
    return found[0], found[1]


def _first(names: list[str]) -> str:
    return f" (first {names[0]!r})" if names else ""


def _shape(value: Any) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__


def _check_weights_fit(expected: dict[str, Any], weights: Any, weights_file: Path, spec_file: Path) -> None:
    """The saved tensors must be exactly the ones the spec builds: same names, same shapes."""
    where = f"checkpoint file {str(weights_file)!r}"
    if not isinstance(weights, dict):
        raise CheckpointError(f"{where} holds a {type(weights).__name__}, expected a state_dict of tensors; "
                              "retrain or restore it")
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise CheckpointError(f"{where} does not match {str(spec_file)!r}: the spec builds {len(missing)} tensor(s) "
                              f"the weights lack{_first(missing)} and the weights hold {len(extra)} it does not "
                              f"build{_first(extra)}; restore the spec.json it was saved with, or retrain")
    for name, tensor in expected.items():
        if not isinstance(weights[name], torch.Tensor) or weights[name].shape != tensor.shape:
            raise CheckpointError(f"{where} does not match {str(spec_file)!r}: tensor {name!r} is "
                                  f"{_shape(weights[name])} in the weights, the spec builds {_shape(tensor)}; "
                                  "restore the spec.json it was saved with, or retrain")
