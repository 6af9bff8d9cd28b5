"""What a reduced-precision export is judged on: a checkpoint's own test data, or random inputs where there is
none (`export.quality` says why random inputs are judged only then)."""
from __future__ import annotations

from typing import Any

from runtime.spec import ModelSpec
from training.checkpoint import read_data_description
from training.points.models import EncoderDecoder
from training.tokens.base import TokenModel

from .adapter import Seq2SeqAdapter
from .kinds import KINDS

MODEL_OBJECTS = (EncoderDecoder, TokenModel, Seq2SeqAdapter)  # sources that carry no data of their own


def checkpoint_data(source: Any, spec: ModelSpec, name: str | None = None) -> Any:
    """Real inputs to judge a reduced-precision export on: the test split of `name` (a data set name or path), else
    of the checkpoint's own data; texts for token models, (N, L, F) sources for point models. None when there are
    none (a model object, or data moved or changed since training)."""
    if name is None and isinstance(source, MODEL_OBJECTS):
        return None
    return KINDS[spec.kind].test_inputs(source, spec, name)


def random_only(source: Any, data: Any) -> str | None:
    """Where a checkpoint's reduced-precision export is judged on random inputs though it records its training data
    (moved or changed since training), a sentence saying so; else None."""
    if data is not None or isinstance(source, MODEL_OBJECTS):
        return None
    recorded = read_data_description(source)
    if recorded is None:
        return None
    return (f"the checkpoint's training data {recorded.get('path', recorded.get('name'))!r} is missing or changed "
            "since training, so the reduced-precision graphs were judged on random inputs only, whose answers a "
            "change of precision moves more often than real data's: put the data back where training read it, to "
            "be judged on it")
