"""ServeConfig and build_app take their numbers as the runtime does (numpy's too, stored as Python int and float)
and refuse anything else with an InputError naming the setting: the one-process server, the Ray deployment and
Serve's options all read them."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from runtime.errors import InputError
from serving.config import ServeConfig

from support.serve import DATES


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 3601, True, "30"])
def test_config_refuses_a_bad_body_timeout(value: Any) -> None:
    with pytest.raises(InputError, match=r"^body_timeout_s: expected"):
        ServeConfig(body_timeout_s=value)


@pytest.mark.parametrize("value", [np.int64(2), 4, np.float64(0.5), np.float32(0.5)])
def test_config_takes_numpy_numbers_as_python_ones(value: Any) -> None:
    config = ServeConfig(body_timeout_s=value, max_queue=np.int32(7), workers=np.uint8(1))
    assert type(config.body_timeout_s) is float and config.body_timeout_s == float(value)
    assert type(config.max_queue) is int and config.max_queue == 7 and type(config.workers) is int
    assert json.loads(json.dumps(dataclasses.asdict(config)))["max_queue"] == 7  # as Serve's options take it


@pytest.mark.parametrize("value", [np.float64(4.0), np.bool_(True), np.array([4]), np.float64("nan")])
def test_config_refuses_a_numpy_value_that_is_not_an_integer(value: Any) -> None:
    with pytest.raises(InputError, match=r"^max_queue: expected an integer from 1 to \d+, got "):
        ServeConfig(max_queue=value)


@pytest.mark.parametrize("value", [0, 257, 2.0, True])
def test_config_refuses_a_beam_bound_outside_the_runtime_s(value: Any) -> None:
    with pytest.raises(InputError, match=r"^max_beam_size: expected an integer from 1 to 256, got "):
        ServeConfig(max_beam_size=value)


def test_config_compares_a_number_as_it_stores_it() -> None:
    with pytest.raises(InputError, match=r"^request_timeout_s: expected a number from 0.01 to 3600"):
        ServeConfig(request_timeout_s=np.float32(0.01))  # 0.00999999977648 as a Python float


@pytest.mark.parametrize("low, high, says", [
    (True, True, r"^replicas.low: expected an integer from 1 to 65536, got True"),
    (1.5, 2, r"^replicas.low: expected an integer from 1 to 65536, got 1.5"),
    ("1", "2", r"^replicas.low: expected an integer from 1 to 65536, got '1'"),
    (1, np.float64(3.0), r"^replicas.high: expected an integer from 1 to 65536, got np.float64\(3.0\)"),
    (3, 2, r"^replicas: expected low <= high, got 3 > 2"),
])
def test_replicas_refuse_what_is_not_a_count(low: Any, high: Any, says: str) -> None:
    """Serve got these as given (True, numpy floats), or failed with pydantic's error when the app was built."""
    from serving.config import Replicas

    with pytest.raises(InputError, match=says):
        Replicas(low, high)


@pytest.mark.parametrize("value", [(1, 2), None, 3])
def test_config_refuses_replicas_that_are_not_a_replicas(value: Any) -> None:
    with pytest.raises(InputError, match=r"^replicas: expected a Replicas\(low, high\), got "):
        ServeConfig(replicas=value)


def test_replicas_store_numpy_counts_as_python_ints() -> None:
    from serving.config import Replicas

    replicas = ServeConfig(replicas=Replicas(np.int64(1), np.uint8(3))).replicas
    assert (type(replicas.low), type(replicas.high), replicas.fixed) == (int, int, False)


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), 3601, True, "30", None])
def test_build_app_refuses_a_bad_drain_timeout(value: Any) -> None:
    pytest.importorskip("ray.serve")
    from serving.app import build_app

    with pytest.raises(InputError, match=r"^drain_timeout_s: expected a number from 0 to 3600, got "):
        build_app(DATES, ServeConfig(), value)

