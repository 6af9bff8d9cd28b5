"""A request checked on its own, before it joins a batch (`serving.batching`), into a job: against the model (as
`Seq2Seq.predict` / `translate_batch` would check it) and against the server's bounds (items a request, output
length, beam width), so one bad request is refused alone and never fails the others."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.decode_options import (
    OPTION_NAMES,
    TRANSLATE_OPTIONS,
    check_decoding_length,
    decoding_limit,
    samples,
    translate_options,
)
from runtime.defaults import MAX_TARGET_LEN
from runtime.errors import InputError, Seq2OnnxError
from runtime.model import Seq2Seq
from runtime.point_inputs import check_mask, check_source, check_target_len
from runtime.search.step import check_min_length
from runtime.tokens import check_texts, translate

# what a model of each kind takes, for a request sent to the other kind's route: (words, body, route)
TAKES = {"tokens": ("a token model, which takes texts", '{"texts": [...]}', "/v1/translate"),
         "points": ("a point model, which takes numeric sources", '{"source": [[[x, y], ...]]}', "/v1/predict")}


class WrongKind(InputError):
    """A request for the other kind of model. Its message names the route this model takes, as a client spells it:
    `under(prefix)` with the server's route prefix (the plain message has none: a caller of `Service` has no
    routes)."""

    def __init__(self, field_name: str, kind: str) -> None:
        self.field_name, self.kind = field_name, kind
        super().__init__(self.under(""))

    def under(self, prefix: str) -> str:
        words, body, route = TAKES[self.kind]
        return f"{self.field_name}: this server's model is {words}; POST {body} to {prefix}{route}"

    def __reduce__(self) -> tuple[Any, ...]:  # pickled as what it was made from (a Ray handle's answer)
        return WrongKind, (self.field_name, self.kind)


class RequestTooLarge(Seq2OnnxError, ValueError):
    """A request beyond the server's bounds (items per request, body bytes): HTTP 413."""


@dataclass
class PointJob:
    """A checked points request: source (n, L, F), mask (n, 1, L), target length, whether it wants attention."""

    source: np.ndarray
    mask: np.ndarray
    target_len: int
    attention: bool = True
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = int(self.source.shape[0])


OPTION_DEFAULTS = {name: inspect.signature(translate).parameters[name].default for name in TRANSLATE_OPTIONS}


@dataclass
class TokenJob:
    """A checked translate request: texts and the full option set of `Seq2Seq.translate_batch`."""

    texts: list[str]
    options: dict[str, Any]
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = len(self.texts)

    @property
    def key(self) -> tuple[Any, ...] | None:
        """Requests with equal keys decode together; None (sampling) decodes alone."""
        o = self.options
        if samples(o["sampling_topk"]):
            return None
        return tuple(repr(o[name]) for name in TRANSLATE_OPTIONS)


def check_rows(rows: int, name: str, max_rows: int) -> None:
    """Refuse a request with more items than one batch may hold."""
    if rows > max_rows:
        raise RequestTooLarge(f"{name}: {rows} items in one request; this server decodes at most {max_rows} per "
                              "request (serve --max-batch-size); split the request")


def length_bound(model: Seq2Seq, max_length: int) -> int:
    """The most output tokens (points: target_len) a request may ask of `model` on a server of `max_length`
    (--max-decoding-length): that, or the model's own length where it is longer (`check_length`), and never past
    what the model can produce (a transformer's position table; the runtime's bound)."""
    limit = decoding_limit(model.spec, model.contract) if model.spec.kind == "tokens" else MAX_TARGET_LEN
    return min(max(max_length, model.spec.target_len), limit)


def check_length(name: str, value: Any, model: Seq2Seq, max_length: int) -> None:
    """Refuse an output length beyond the server's bound (the model's own default length is always allowed): one
    long beam search would hold a replica, and the requests queued behind it, for minutes."""
    bound = max(max_length, model.spec.target_len)
    why = ("serve --max-decoding-length" if bound == max_length else
           f"the model's own length; serve --max-decoding-length {max_length} is below it")
    _within(name, value, 0 if name == "min_decoding_length" else 1, bound, why, "a shorter output")


def check_beam_size(value: Any, max_beam: int) -> None:
    """Refuse a beam wider than the server's bound: a request's decode holds its texts x beam_size rows of state
    and caches at every step, so one wide beam over long texts could take more memory than the machine has."""
    _within("beam_size", value, 1, max_beam, "serve --max-beam-size", "a narrower beam")


def _within(name: str, value: Any, low: int, bound: int, why: str, ask: str) -> None:
    """An int option within [low, bound] on this server, else InputError saying this server's bound (`why` it is
    that, what to `ask` for instead); another type is left to the runtime's checks, which refuse it by type."""
    if not isinstance(value, int) or isinstance(value, bool):
        return
    if value > bound:
        raise InputError(f"{name}: at most {bound} on this server ({why}), got {value}; ask for {ask}")
    if value < low:  # the runtime's message would name its own bound, not this server's
        raise InputError(f"{name}: expected an int in [{low}, {bound}] on this server, got {value}")


def point_job(model: Seq2Seq, source: Any, source_mask: Any, target_len: Any, max_rows: int,
              max_length: int, attention: bool = True) -> PointJob:
    """Check one points request against the model, as `Seq2Seq.predict` would, and against the server's bounds."""
    if model.spec.kind != "points":
        raise WrongKind("source", model.spec.kind)
    src = check_source(source, model.spec)  # (n, L, F)
    check_rows(src.shape[0], "source", max_rows)
    check_length("target_len", target_len, model, max_length)
    return PointJob(src, check_mask(source_mask, src), check_target_len(target_len, model.spec),
                    bool(attention))


def token_job(model: Seq2Seq, texts: Any, options: dict[str, Any], max_rows: int, max_length: int,
              max_beam: int) -> TokenJob:
    """Check one translate request's texts and options, against the model and the server's bounds."""
    if model.spec.kind != "tokens":
        raise WrongKind("texts", model.spec.kind)
    texts = check_texts(texts)
    check_rows(len(texts), "texts", max_rows)
    if not OPTION_NAMES.issuperset(options):
        unknown = sorted(set(options) - OPTION_NAMES)
        raise InputError(f"options: unknown {unknown}; understood: {list(TRANSLATE_OPTIONS)}")
    for name in ("max_decoding_length", "min_decoding_length"):
        check_length(name, options.get(name), model, max_length)
    check_beam_size(options.get("beam_size", OPTION_DEFAULTS["beam_size"]), max_beam)
    if options.get("min_decoding_length") and options.get("max_decoding_length") is None:
        # a min beyond the default max: the hint names this server's bound, not the runtime's
        steps = model.token_steps
        check_min_length(options.get("min_decoding_length", 0), check_decoding_length(model.spec, None, steps.contract),
                         length_bound(model, max_length))
    # every other option refused here, at once, as the decode would refuse it after the batch wait (a set seen
    # before is looked up, not checked again: runtime.decode_options.translate_options)
    translate_options(model.token_steps, *(options.get(name, OPTION_DEFAULTS[name]) for name in TRANSLATE_OPTIONS))
    return TokenJob(texts, options)
