"""Dynamic batching without Ray: merge concurrent requests into one decode and split the results again.

A request is checked on its own before it joins a batch, so one bad request never fails the others. Points:
requests with the same target length are right-padded to the longest source and masked; the runtime starts the
decoder from each row's last valid point, so padding changes nothing, and the attention is cut back to each
request's own source length. Tokens: requests with the same options decode together (the runtime pads texts by
their lengths). Sampling requests never merge: a seeded sample must not depend on what it was batched with."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

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
from runtime.errors import RUN_FAILED_ADVICE, Cancelled, InputError, ResourceError, Seq2OnnxError, one_line
from runtime.model import Seq2Seq
from runtime.point_inputs import check_mask, check_source, check_target_len
from runtime.points import Cancel
from runtime.search.step import check_min_length
from runtime.tokens import Translation, check_texts, translate

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


# what a request that the server's memory could not decode is told (HTTP 503), by kind of model
SMALLER = {"points": "; ask for less in one request (fewer or shorter sources, a smaller target_len, or no "
                     "return_attention), or try again later",
           "tokens": "; ask for less in one request (fewer or shorter texts, a smaller beam_size, num_hypotheses or "
                     "max_decoding_length / min_decoding_length, or no return_attention), or try again later"}


@dataclass(frozen=True)
class Decoded:
    """One request's result (or the error that is its own), and the batch it was decoded in."""

    value: Any
    batch_rows: int
    batch_requests: int


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


def decode_points(model: Seq2Seq, jobs: Sequence[PointJob], cancel: Cancel | None = None) -> list[Decoded]:
    """Decode point jobs, merged by target length and similar source lengths (`similar_lengths`) -> per job
    (outputs (n, Lt, F), attention or None where it was not asked for). `cancel`: asked between decoder steps; True
    stops the decode (runtime.errors.Cancelled)."""
    groups: dict[int, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(job.target_len, []).append(i)
    found: dict[int, Decoded] = {}
    for target_len, same_target in groups.items():
        for members in similar_lengths(same_target, [jobs[i].source.shape[1] for i in same_target]):
            merged = [jobs[i] for i in members]
            found.update(zip(members, _guarded(lambda js, n=target_len: _points_together(model, js, n, cancel),
                                               merged, SMALLER["points"])))
    return [found[i] for i in range(len(jobs))]


MAX_PADDING = 2  # a merged request's source is padded to at most this many times its own length,
PADDING_FREE = 64  # or to this many points, which costs next to nothing


def similar_lengths(members: list[int], lengths: list[int]) -> list[list[int]]:
    """`members` in runs of source lengths that pad each other little (MAX_PADDING, PADDING_FREE): merging a
    3-point request with a 50,000-point one padded it (and its attention, and every other request's) to 50,000."""
    runs: list[list[int]] = []
    shortest = 0
    for length, member in sorted(zip(lengths, members)):
        if not runs or length > max(MAX_PADDING * shortest, PADDING_FREE):
            runs.append([])
            shortest = length
        runs[-1].append(member)
    return runs


def _points_together(model: Seq2Seq, jobs: Sequence[PointJob], target_len: int,
                     cancel: Cancel | None = None) -> list[Any]:
    """One predict for all jobs: right-pad to the longest source, mask the padding, split and un-pad."""
    longest = max(job.source.shape[1] for job in jobs)
    features = jobs[0].source.shape[2]
    rows = sum(job.rows for job in jobs)
    source = np.zeros((rows, longest, features), dtype=np.float32)  # (R, Lmax, F)
    mask = np.zeros((rows, 1, longest), dtype=bool)  # (R, 1, Lmax)
    start = 0
    for job in jobs:
        length = job.source.shape[1]
        source[start:start + job.rows, :length] = job.source
        mask[start:start + job.rows, :, :length] = job.mask
        start += job.rows
    wanted = any(job.attention for job in jobs)
    found = model.predict(source, target_len=target_len, source_mask=mask, return_attention=wanted, cancel=cancel)
    outputs, attention = found if wanted else (found, None)
    results, start = [], 0
    for job in jobs:
        part = slice(start, start + job.rows)
        alphas = None if attention is None or not job.attention else \
            attention[part, ..., :job.source.shape[1]]  # (n, [h,] Lt, L)
        results.append((outputs[part], alphas))
        start += job.rows
    return results


def decode_texts(model: Seq2Seq, jobs: Sequence[TokenJob], cancel: Cancel | None = None) -> list[Decoded]:
    """Translate token jobs, merged by options (sampling jobs alone) -> per job its n-best Translations.
    `cancel`: as for `decode_points`."""
    groups: dict[Any, list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(job.key if job.key is not None else ("alone", i), []).append(i)
    found: dict[int, Decoded] = {}
    for members in groups.values():
        merged = [jobs[i] for i in members]
        found.update(zip(members, _guarded(lambda js: _texts_together(model, js, cancel), merged, SMALLER["tokens"])))
    return [found[i] for i in range(len(jobs))]


def _texts_together(model: Seq2Seq, jobs: Sequence[TokenJob],
                    cancel: Cancel | None = None) -> list[list[list[Translation]]]:
    """One translate_batch for all jobs (equal options), split back per job (each text's attention is its own
    width whatever else is in the call: runtime.tokens.own_widths)."""
    texts = [text for job in jobs for text in job.texts]
    found = model.translate_batch(texts, cancel=cancel, **jobs[0].options)
    results, start = [], 0
    for job in jobs:
        results.append(found[start:start + job.rows])
        start += job.rows
    return results


def _guarded(decode: Callable[[list[Any]], list[Any]], jobs: list[Any], smaller: str) -> list[Decoded]:
    """Decode jobs together; when that fails with a user error or for memory, decode each alone so each gets its
    own result (a batch too large for the memory left may be decoded a request at a time). A request the memory
    cannot hold alone gets a ResourceError ending in `smaller`, the advice in its model's fields."""
    rows = sum(job.rows for job in jobs)
    try:
        return [Decoded(value, rows, len(jobs)) for value in decode(jobs)]
    except Cancelled:  # the caller stopped the decode: no one waits for any of these
        raise
    except ResourceError as exc:
        if len(jobs) == 1:
            return [Decoded(ResourceError(one_line(exc).removesuffix(RUN_FAILED_ADVICE) + smaller), rows, 1)]
    except Seq2OnnxError as exc:
        if len(jobs) == 1:
            return [Decoded(released(exc), rows, 1)]
    except MemoryError:  # the batcher's own arrays (merged sources padded); the runtime raises ResourceError
        if len(jobs) == 1:
            return [Decoded(ResourceError(f"this request ({rows} input{'s' if rows != 1 else ''}) needs more memory "
                                          f"to decode than this server has free now{smaller}"), rows, 1)]
    return [_guarded(decode, [job], smaller)[0] for job in jobs]


def released(exc: Exception) -> Exception:
    """`exc` without its traceback and context, to be kept as a request's answer: their frames hold the failed
    decode's arrays (a search's state), and once the error is raised again to answer it, a cycle through the
    answering frame keeps them until the garbage collector runs. (A request refused for memory gets a new error:
    with the frames of its search kept, the requests after it were refused for memory too, until then.)"""
    exc.__traceback__, exc.__context__, exc.__cause__ = None, None, None
    return exc
