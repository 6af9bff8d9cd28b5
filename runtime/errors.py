"""Typed errors of the runtime. Each message names the input, what was expected and what was given."""
from __future__ import annotations


class Seq2OnnxError(Exception):
    """Base class of every error seq2onnx raises on purpose."""


class ManifestError(Seq2OnnxError, ValueError):
    """manifest.json is missing, malformed, or of a format version this runtime does not know."""


class IntegrityError(Seq2OnnxError, OSError):
    """A graph file is missing, altered, truncated, or does not belong to this export."""


class InputError(Seq2OnnxError, ValueError):
    """An input to `predict` has the wrong rank, shape, dtype or values."""


class ProviderError(Seq2OnnxError, RuntimeError):
    """The requested execution provider cannot run on this machine or install."""
