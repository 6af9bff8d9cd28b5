"""translate_batch's options are checked once per set of plain values a model has seen (runtime.decode_options.
translate_options): a service sends the same options call after call. Every refusal still comes, whatever passed
before: bools against ints, floats against ints, numpy ints, unhashable values."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import TRANSFORMER_MAX_POSITIONS

from runtime import decode_options
from runtime.errors import InputError
from runtime.model import Seq2Seq


@pytest.fixture(scope="module")
def model(transformer_export) -> Seq2Seq:
    return Seq2Seq.load(transformer_export.path, provider="cpu", threads=1)


@pytest.fixture
def checks(monkeypatch) -> list[tuple]:
    """The option sets that were checked in full."""
    seen: list[tuple] = []
    real = decode_options._check_options

    def spy(steps, *values):
        seen.append(values)
        return real(steps, *values)
    monkeypatch.setattr(decode_options, "_check_options", spy)
    return seen


def test_the_same_options_are_checked_once(model: Seq2Seq, checks: list[tuple]) -> None:
    model.token_steps.checked_options.clear()
    first = model.translate_batch(["a b"], beam_size=2, max_decoding_length=4)
    again = model.translate_batch(["c"], beam_size=2, max_decoding_length=4)
    assert len(checks) == 1
    assert len(model.token_steps.checked_options) == 1
    model.translate_batch(["c"], beam_size=2, max_decoding_length=3)  # another set: checked
    assert len(checks) == 2
    assert first and again


@pytest.mark.parametrize("options, named", [
    ({"beam_size": True}, "beam_size"),  # True == 1, hash(True) == hash(1)
    ({"max_decoding_length": 4.0}, "max_decoding_length"),  # 4.0 == 4
    ({"return_attention": 1}, "return_attention"),  # 1 == True
    ({"num_hypotheses": True}, "num_hypotheses"),
    ({"sampling_topk": False}, "sampling_topk"),  # False == 0
])
def test_a_value_equal_to_one_that_passed_is_still_refused(model: Seq2Seq, options: dict, named: str) -> None:
    passing = {"beam_size": 1, "max_decoding_length": 4, "return_attention": True, "num_hypotheses": 1,
               "sampling_topk": 0}
    model.translate_batch(["a"], **{**options, **{k: passing[k] for k in options}})  # its equal passes first
    with pytest.raises(InputError, match=named):
        model.translate_batch(["a"], **options)


def test_numpy_ints_pass_without_being_remembered(model: Seq2Seq, checks: list[tuple]) -> None:
    model.token_steps.checked_options.clear()
    for _ in range(2):
        model.translate_batch(["a"], beam_size=np.int64(2), max_decoding_length=np.int32(3))
    assert len(checks) == 2 and not model.token_steps.checked_options


def test_unhashable_options_are_refused_by_name(model: Seq2Seq) -> None:
    with pytest.raises(InputError, match="beam_size"):
        model.translate_batch(["a"], beam_size=[2])
    with pytest.raises(InputError, match="length_penalty"):
        model.translate_batch(["a"], beam_size=2, length_penalty={"x": 1})


def test_a_refused_set_is_not_remembered(model: Seq2Seq) -> None:
    model.token_steps.checked_options.clear()
    for _ in range(2):
        with pytest.raises(InputError, match="max_decoding_length"):
            model.translate_batch(["a"], max_decoding_length=TRANSFORMER_MAX_POSITIONS + 1)
    assert not model.token_steps.checked_options


def test_the_memory_is_bounded(model: Seq2Seq, monkeypatch) -> None:
    monkeypatch.setattr(decode_options, "CHECKED_OPTIONS", 3)
    model.token_steps.checked_options.clear()
    for penalty in (0.5, 0.75, 1.0, 1.25, 1.5):
        model.translate_batch(["a"], beam_size=2, length_penalty=penalty, max_decoding_length=3)
        assert len(model.token_steps.checked_options) <= 3
