"""Model-agnostic token decoding strategies over one step function: greedy, beam search and sampling."""
from __future__ import annotations

from .beam import beam_search
from .filters import apply_temperature, filter_logits, top_k_filter, top_p_filter
from .greedy import greedy_search
from .sampling import sample
from .step import BatchAxes, Hypothesis, State, StepFn, StepResult, select

__all__ = [
    "BatchAxes", "Hypothesis", "State", "StepFn", "StepResult", "select",
    "greedy_search", "beam_search", "sample",
    "apply_temperature", "top_k_filter", "top_p_filter", "filter_logits",
]
