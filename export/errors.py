"""Typed errors of the export side."""
from __future__ import annotations

from runtime.errors import Seq2OnnxError


class ExportError(Seq2OnnxError, RuntimeError):
    """The exporter produced a graph that does not match the declared contract."""


class ParityError(Seq2OnnxError, AssertionError):
    """onnxruntime and PyTorch disagree beyond the tolerance; nothing was written."""


class DestinationExistsError(Seq2OnnxError, FileExistsError):
    """The output directory already holds something and `force` was not given."""
