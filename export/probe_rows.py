"""The probe's checks that a declared model decodes each text as it would alone (export.adapted.probe runs them
last): each source of the first probe batch encoded and stepped once alone, at the batch's width and at its own,
against its row in the batch; a source of max_source_len tokens encoded and stepped; one source decoded
PROBE_OUTPUT_STEPS tokens on. Each failure is an AdapterError saying what the model reads that it may not, or the
limit to declare."""
from __future__ import annotations

import torch

from runtime.contract import SOURCE_LEN, Dims

from .adapted import PROBE_WIDTHS, example_sources
from .adapter import AdapterError, Seq2SeqAdapter
from .probe_checks import check_encoded, check_step, tensor_dict
from .tracing import run_declared

PROBE_OUTPUT_STEPS = 256  # steps one source is decoded at export, unless output_limit (or max_decoding_length) says
ALONE_ATOL, ALONE_RTOL = 1e-4, 1e-3  # a source encoded and stepped alone against within a batch: rounding differs
ROWS_READ = ("its rows read one another (a mean, sum or norm over the batch axis, a batch norm in training mode)")
SCORES, ATTENTION = "step's scores", "step's attention"
READS_PADDING = ("it reads the padding or the width it is padded to (a recurrent layer run over the pads: pack it, "
                 "pack_padded_sequence; an attention that does not mask the pads: mask them with source_lengths; a "
                 "value computed from x.shape[1]: use source_lengths)")


def check_alone(adapter: Seq2SeqAdapter, dims: dict[str, Dims], ids: torch.Tensor, lengths: torch.Tensor,
                state: dict[str, torch.Tensor]) -> None:
    """Each source of the first probe encoded and stepped once alone, at the batch's width and (unless the model
    fixes it) at its own, gives what it gave within the batch: the runtime decodes texts in batches of any make-up
    and width, so a row may depend on its own tokens only. Else AdapterError saying which of the two it reads."""
    n, width = ids.shape
    batched = _stepped(adapter, state, n, width)
    for row in range(n):
        own = int(lengths[row])
        for w, cause in ((width, ROWS_READ), (own, READS_PADDING)):
            if cause is READS_PADDING and (adapter.fixed_source_len is not None or own == width):
                continue
            alone = tensor_dict(run_declared(adapter, "encode", adapter.encode, ids[row:row + 1, :w],
                                              lengths[row:row + 1]), "what encode returns")
            check_encoded(adapter, alone, 1)
            how = (f"alone, at the batch's width {width}," if w == width
                   else f"alone at its own width {w} (the batch pads it to {width})")
            stepped = _stepped(adapter, alone, 1, w)
            for when, mine, got in (("encoded", state, alone), ("after one step", batched, stepped)):
                for name, value in mine.items():
                    expected = value.narrow(adapter.state[name].batch_axis if name in adapter.state else 0, row, 1)
                    for axis in _source_axes(name, dims):
                        expected = expected.narrow(axis, 0, w)
                    said = name if name in (SCORES, ATTENTION) else repr(name)
                    _same_alone(f"{said} {when}", got[name], expected, row, how, n, cause)


def _source_axes(name: str, dims: dict[str, Dims]) -> list[int]:
    """The axes of a state tensor, or of the step's attention, that run over the source."""
    if name in dims:
        return [axis for axis, d in enumerate(dims[name]) if d == SOURCE_LEN]
    return [1] if name == ATTENTION else []


def check_longest(adapter: Seq2SeqAdapter) -> None:
    """A source of max_source_len tokens (specials included) encodes and steps once: the runtime takes texts that
    long, and a model with fewer positions (a positional table of 64 under the default 256) failed at run time."""
    longest = adapter.max_source_len
    if adapter.fixed_source_len is not None or longest <= max(PROBE_WIDTHS):
        return
    ids, lengths = (torch.from_numpy(a) for a in example_sources(adapter, 1, longest, seed=3))
    try:
        state = tensor_dict(run_declared(adapter, "encode", adapter.encode, ids, lengths), "what encode returns")
        check_encoded(adapter, state, 1)
        _stepped(adapter, state, 1, longest)
    except AdapterError as exc:
        raise AdapterError(f"at max_source_len={longest} (a source of {longest} tokens, specials included: the "
                           f"longest the runtime takes), {exc}; declare max_source_len=... no longer than the model "
                           "takes (its positional table, say)") from None


def check_long_output(adapter: Seq2SeqAdapter) -> None:
    """One source decoded PROBE_OUTPUT_STEPS steps on (or output_limit, or max_decoding_length if more): a model
    with fewer target positions (a positional table of 64) failed mid-decode in onnxruntime at run time."""
    steps = max(min(adapter.output_limit or PROBE_OUTPUT_STEPS, PROBE_OUTPUT_STEPS), adapter.max_decoding_length)
    width = adapter.fixed_source_len or min(PROBE_WIDTHS)
    ids, lengths = (torch.from_numpy(a) for a in example_sources(adapter, 1, width, seed=4))
    state = tensor_dict(run_declared(adapter, "encode", adapter.encode, ids, lengths), "what encode returns")
    tokens = torch.full((1,), adapter.target_vocab.ids.bos, dtype=torch.int64)
    for t in range(steps):
        try:
            scores, changed, _ = check_step(adapter, state, run_declared(adapter, "step", adapter.step, tokens,
                                                                        dict(state)), 1, width)
        except AdapterError as exc:
            why = ("its output_limit" if adapter.output_limit is not None and steps == adapter.output_limit else
                   "its max_decoding_length" if steps == adapter.max_decoding_length else
                   "no output_limit is declared: the runtime decodes as many as --max-len asks")
            raise AdapterError(f"at output token {t + 1} of the {steps} the probe decodes ({why}), {exc}; declare "
                               f"output_limit={t} if that is the most tokens the model can produce (its positional "
                               "table, say)") from None
        state, tokens = {**state, **{name: changed[name] for name in adapter.changing}}, scores.argmax(-1)


def _same_alone(what: str, got: torch.Tensor, expected: torch.Tensor, row: int, how: str, n: int, cause: str) -> None:
    is_, differs = ("are", "differ") if what.startswith(SCORES) else ("is", "differs")  # "step's scores" are plural
    if tuple(got.shape) != tuple(expected.shape):
        raise AdapterError(f"{what} for source {row} of the probe {is_} {tuple(got.shape)} when that source is {how} "
                           f"where its row within the batch of {n} is {tuple(expected.shape)}")
    if expected.is_floating_point():
        same = torch.allclose(got, expected, rtol=ALONE_RTOL, atol=ALONE_ATOL, equal_nan=True)
    else:
        same = torch.equal(got, expected)
    if not same:
        gap = (got.double() - expected.double()).abs().nan_to_num(nan=0.0, posinf=float("inf"))
        raise AdapterError(f"{what} for source {row} of the probe {differs} when that source is {how} from within "
                           f"the batch of {n}, by up to {float(gap.max()):.3g}: {cause}; the runtime decodes texts "
                           "in batches of any make-up and width, so each row may depend on its own source only")


def _stepped(adapter: Seq2SeqAdapter, state: dict[str, torch.Tensor], n: int, width: int) -> dict[str, torch.Tensor]:
    """One step from bos: the scores, each changing state tensor and the attention (if any), by name (the scores'
    and attention's names are no identifiers: no state's)."""
    tokens = torch.full((n,), adapter.target_vocab.ids.bos, dtype=torch.int64)
    scores, changed, attention = check_step(adapter, state, run_declared(adapter, "step", adapter.step, tokens,
                                                                         dict(state)), n, width)
    out = {SCORES: scores, **{name: changed[name] for name in adapter.changing}}
    return out if attention is None else {**out, ATTENTION: attention}
