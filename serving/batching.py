"""Dynamic batching without Ray: merge concurrent requests into one decode and split the results again.

A request is checked on its own before it joins a batch (`serving.jobs`), so one bad request never fails the
others. Points: requests with the same target length are right-padded to the longest source and masked; the runtime
starts the decoder from each row's last valid point, so padding changes nothing, and the attention is cut back to
each request's own source length. Tokens: requests with the same options decode together (the runtime pads texts
by their lengths). Sampling requests never merge: a seeded sample must not depend on what it was batched with."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from runtime.errors import RUN_FAILED_ADVICE, Cancelled, ResourceError, Seq2OnnxError, one_line
from runtime.model import Seq2Seq
from runtime.points import Cancel
from runtime.tokens import Translation

from .jobs import PointJob, TokenJob

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
