"""translate_batch's options checked (`translate_options`, once per set a model has seen), and the output length a
model can produce (`decoding_limit`, `check_decoding_length`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .declared import TokenContract
from .defaults import MAX_TARGET_LEN
from .errors import InputError, brief, int_text
from .search.beam import MAX_BEAM, check_beam
from .search.filters import check_temperature, check_topp
from .search.sampling import MAX_SEED
from .search.step import check_int, check_min_length
from .spec import ModelSpec
from .token_steps import contract_for

if TYPE_CHECKING:
    from .token_steps import TokenSteps

TRANSLATE_OPTIONS = ("beam_size", "num_hypotheses", "length_penalty", "max_decoding_length", "min_decoding_length",
                     "sampling_topk", "sampling_topp", "sampling_temperature", "seed", "return_attention")
OPTION_NAMES = frozenset(TRANSLATE_OPTIONS)
CHECKED_OPTIONS = 256  # option sets a model keeps as checked (translate_options); one more empties the memory
PLAIN_TYPES = frozenset({int, float, bool, type(None)})


def samples(sampling_topk: Any = 1) -> bool:
    """Whether the options draw tokens at random: sampling_topk other than 1 (0: the whole vocabulary), as in
    CTranslate2; at 1, the default, sampling_topp and sampling_temperature change nothing (the top token is kept
    whatever they say) and the decode is greedy, or a beam search. A beam cannot sample, a service decodes a
    sampling request alone, and offline inference keeps its chunks as in-process infer cuts them."""
    return sampling_topk != 1


def decoding_limit(spec: ModelSpec, contract: TokenContract | None = None) -> int:
    """The most output tokens one decode may ask for: a transformer's max_positions, a declared model's own bound,
    else MAX_TARGET_LEN (as `seq2onnx serve` and `bench` allow)."""
    return contract_for(spec, contract).max_decoding_length or MAX_TARGET_LEN


def check_decoding_length(spec: ModelSpec, max_decoding_length: Any, contract: TokenContract | None = None) -> int:
    """max_decoding_length (None: the spec's target_len) as an int >= 1 that the model can produce (a transformer:
    output token t reads row t of its position table, so at most max_positions tokens)."""
    default = max_decoding_length is None
    length = check_int("max_decoding_length", spec.target_len if default else max_decoding_length, 1)
    limit = decoding_limit(spec, contract)
    if length > limit:
        given = f"the default, the spec's target_len {length}," if default else int_text(length)
        if spec.is_transformer:
            why = f"this transformer's max_positions {limit} (output token t reads row t of its position table)"
        elif contract_for(spec, contract).max_decoding_length:
            why = f"the {limit} tokens this model can produce"
        else:
            why = f"{limit}, the most tokens one decode produces (as `seq2onnx serve` and `bench` allow)"
        raise InputError(f"max_decoding_length: {given} is more than {why}; pass max_decoding_length <= {limit}")
    return length


def translate_options(steps: TokenSteps, *values: Any) -> tuple[int, float, int, float, float]:
    """translate's options from beam_size to return_attention, in its order, checked: (max_decoding_length,
    length_penalty, sampling_topk, sampling_topp, sampling_temperature) as it reads them. A set of plain values
    (int, float, bool, None) that passed for this model is looked up, not checked again: a service sends the same
    options call after call, and the dozen checks, run cold after a batch-1 graph, cost 15-25 us a call."""
    types = tuple(map(type, values))
    if not PLAIN_TYPES.issuperset(types):  # numpy ints, int subclasses, anything unhashable: checked every time
        return _check_options(steps, *values)
    key = (values, types)  # the types too: True == 1 and 20.0 == 20, which the checks tell apart
    cache = steps.checked_options
    found = cache.get(key)
    if found is None:
        found = _check_options(steps, *values)
        if len(cache) >= CHECKED_OPTIONS:
            cache.clear()
        cache[key] = found
    return found


def _check_options(steps: TokenSteps, beam_size: Any, num_hypotheses: Any, length_penalty: Any,
                   max_decoding_length: Any, min_decoding_length: Any, sampling_topk: Any, sampling_topp: Any,
                   sampling_temperature: Any, seed: Any, return_attention: Any) -> tuple[int, float, int, float, float]:
    """Every check of translate's options, in the order their refusals come."""
    default = max_decoding_length is None
    max_decoding_length = check_decoding_length(steps.spec, max_decoding_length, steps.contract)
    check_int("beam_size", beam_size, 1, MAX_BEAM)
    sampling_topk = check_int("sampling_topk", sampling_topk, 0)
    sampling_topp = check_topp("sampling_topp", sampling_topp)
    sampling_temperature = check_temperature("sampling_temperature", sampling_temperature)
    if beam_size == 1 and samples(sampling_topk):
        n = check_int("num_hypotheses", num_hypotheses, 1)
        if n > 1:  # (check_beam's advice, a wider beam, would meet the refusal of sampling with a beam below)
            raise InputError(f"num_hypotheses: sampling draws one output per text, so num_hypotheses {int_text(n)} "
                             "cannot be met; pass num_hypotheses=1 (and call again for more draws: with another "
                             "seed, or none), or drop the sampling options for an n-best from beam search")
    _, length_penalty = check_beam(beam_size, num_hypotheses, length_penalty)
    check_min_length(min_decoding_length, max_decoding_length,
                     decoding_limit(steps.spec, steps.contract) if default else None)
    if not isinstance(return_attention, (bool, np.bool_)):  # numpy's too, as its ints elsewhere
        raise InputError(f"return_attention: expected True or False, got {brief(return_attention)}")
    if seed is not None:  # taken and unused where nothing is sampled, as CTranslate2's sampling_seed
        check_int("seed", seed, 0, MAX_SEED)
    if beam_size != 1 and samples(sampling_topk):
        raise InputError(f"beam_size: sampling needs beam_size 1, got {brief(beam_size)}; drop the sampling "
                         "options for beam search")
    return max_decoding_length, length_penalty, sampling_topk, sampling_topp, sampling_temperature
