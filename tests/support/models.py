"""Tiny seeded models: point models (one per attention kind) and deterministic sources; token models on the toy
corpus's vocabularies, and one way to export them."""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

KINDS = {"none": 1, "dot": 1, "multihead": 3}
HIDDEN = 5


@dataclass
class Exported:
    """A seeded model, its spec and the directory it was exported to."""

    kind: str
    model: object
    spec: object
    path: Path


def make_model(kind: str, seed: int = 0):
    """A small seeded model of the given attention kind."""
    import torch

    from runtime.spec import ModelSpec
    from training.build import build_model

    torch.manual_seed(seed)
    spec = ModelSpec(n_features=2, hidden_dim=HIDDEN, attention=kind, n_heads=KINDS[kind])
    return build_model(spec).eval(), spec


def source_batch(n: int, length: int, seed: int = 1, features: int = 2) -> np.ndarray:
    """Deterministic float32 sources (N, L, F)."""
    return np.random.default_rng(seed).normal(size=(n, length, features)).astype(np.float32)


@dataclass
class TokenExport:
    """A seeded token model, its (source, target) vocabularies and the directory it was exported to."""

    model: object
    source: object
    target: object
    path: Path


@functools.lru_cache(maxsize=None)
def toy_vocabularies() -> tuple[object, object]:
    """(source, target) whitespace vocabularies of the toy corpus (the attention notebook's nine pairs)."""
    from runtime.vocab import Vocabulary
    from training.tokens.builtin import toy_translation

    pairs, _ = toy_translation()
    return Vocabulary.build(pairs.sources, "whitespace"), Vocabulary.build(pairs.targets, "whitespace")


def toy_token_spec(**fields: object):
    """A token ModelSpec sized to the toy vocabularies (target_len 6 unless given)."""
    from runtime.spec import ModelSpec

    source, target = toy_vocabularies()
    return ModelSpec(kind="tokens", **{"source_vocab_size": len(source), "target_vocab_size": len(target),
                                       "target_len": 6, **fields})


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """PyTorch's intra-op threads set to `n` for the block (tiny models export fastest on one; a session or module
    fixture cannot use the function-scoped `one_torch_thread`)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def export_token_model(spec, out: Path, seed: int = 0, model=None, **options: object) -> TokenExport:
    """A token model of `spec` (built after seeding with `seed`, unless `model` is given) on the toy vocabularies,
    exported to `out` at one PyTorch thread (parity checked); `options` go to export_model."""
    import torch

    from export.api import export_model
    from training.build import build_token_model

    source, target = toy_vocabularies()
    if model is None:
        torch.manual_seed(seed)
        model = build_token_model(spec).eval()
    with torch_threads(1):
        path = export_model(model, out, vocabularies=(source, target), **options)
    return TokenExport(model, source, target, path)


def save_token_checkpoint(out: Path, model, vocabularies: tuple[object, object] | None = None) -> Path:
    """`model` saved as a one-epoch token checkpoint on the toy corpus (its vocabularies: the toy ones by default),
    as `seq2onnx train` writes one."""
    from training.checkpoint import save_checkpoint
    from training.tokens.data import describe_text_dataset, load_text_dataset
    from training.tokens.trainer import TokenTrainConfig

    train, test = load_text_dataset("toy-translation")
    return save_checkpoint(out, model, model.spec, TokenTrainConfig(epochs=1),
                           {"train_loss": [1.0], "val_exact": [0.0], "val_token": [0.0]},
                           describe_text_dataset("toy-translation", train, test),
                           vocabularies=vocabularies or toy_vocabularies())
