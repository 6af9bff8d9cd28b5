"""Typed errors of the export side."""
from __future__ import annotations

from runtime.destination import DestinationError
from runtime.errors import Seq2OnnxError


class ExportError(Seq2OnnxError, RuntimeError):
    """The exporter produced a graph that does not match the declared contract."""


class ParityError(Seq2OnnxError, AssertionError):
    """onnxruntime and PyTorch disagree beyond the tolerance; nothing was written."""


class VerifyError(Seq2OnnxError, ValueError):
    """The checkpoint and the export are not a pair, or they differ beyond the tolerances."""


# The output directory holds something that may not be replaced (see runtime.destination).
DestinationExistsError = DestinationError
