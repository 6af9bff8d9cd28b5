"""What a reduced-precision export is judged on: a checkpoint's own test data, or random inputs where there is
none (`export.quality` says why random inputs are judged only then)."""
from __future__ import annotations

from typing import Any

import numpy as np

from runtime.errors import InputError, UsageError, brief
from runtime.infer_tokens import Item, batches
from runtime.point_inputs import check_source
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


def check_quality_data(data: Any, spec: ModelSpec) -> Any:
    """A caller's `quality_data` as the quality report reads it: a list of texts for a token model, a float32
    (N, L, F) array for a point model; else a UsageError naming it (a bare string was read as its characters, pairs
    and numbers were dropped without a word, and a point model's wrong shape surfaced as onnxruntime's)."""
    if data is None:
        return None
    if spec.kind == "tokens":
        if isinstance(data, (str, bytes)) or not isinstance(data, (list, tuple)):
            raise UsageError(f"quality_data: expected a list of source texts, got {brief(data)}"
                             + ("; one text is [text]" if isinstance(data, str) else ""))
        wrong = next((i for i, text in enumerate(data) if not isinstance(text, str)), None)
        if wrong is not None:
            pair = isinstance(data[wrong], (list, tuple)) and len(data[wrong]) == 2
            raise UsageError(f"quality_data: expected source texts (str), got {brief(data[wrong])} at "
                             f"quality_data[{wrong}]" + ("; of (source, target) pairs pass the sources alone: the "
                                                         "export is judged against its own float32 graphs" * pair))
        if not data or not any(text.strip() for text in data):
            raise UsageError(f"quality_data: expected source texts to judge the export on, got {brief(data)}; "
                             "leave it out (None) to judge on the checkpoint's own test data")
        return list(data)
    try:
        points = check_source(data, spec)
    except InputError as exc:  # the runtime's own check, as predict makes it, named for this argument
        raise UsageError(str(exc).replace("source:", "quality_data:", 1)) from None
    if not len(points):
        raise UsageError(f"quality_data: expected at least one (L, {spec.n_features}) source, got {brief(data)}; "
                         "leave it out (None) to judge on the checkpoint's own test data")
    return np.asarray(points)


def check_quality_texts(texts: list[str], vocab: Any, spec: ModelSpec, contract: Any) -> None:
    """Each given text is one the runtime decodes: not blank, no longer than it reads, encodable; else a UsageError
    naming quality_data[i] (the report had left such texts out without a word, and judged random ids if none was
    left)."""
    blank: list[Item] = []
    try:
        for _ in batches((Item(i, text, f"quality_data[{i}]") for i, text in enumerate(texts)), len(texts), vocab,
                         blank, spec, contract):
            pass
    except InputError as exc:
        raise UsageError(str(exc)) from None
    if blank:
        raise UsageError(f"{blank[0].where}: expected a source text, got {brief(blank[0].text)}; drop blank texts")
