"""Tiny seeded point models (one per attention kind) and deterministic sources."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
