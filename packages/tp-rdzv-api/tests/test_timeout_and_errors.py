"""``RendezvousTimeout`` and the seven exceptions."""

from __future__ import annotations

import pickle
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from tp_rdzv_api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousExhaustedError,
    RendezvousGracefulExitError,
    RendezvousStateError,
    RendezvousTimeout,
    RendezvousTimeoutError,
)

# -- RendezvousTimeout ----------------------------------------------------------------


def test_timeout_defaults() -> None:
    timeout = RendezvousTimeout()
    assert timeout.join == timedelta(seconds=600)
    assert timeout.last_call == timedelta(seconds=30)
    assert timeout.close == timedelta(seconds=30)
    assert timeout.heartbeat == timedelta(seconds=5)


def test_timeout_values_and_partial_defaults() -> None:
    timeout = RendezvousTimeout(join=timedelta(seconds=10), heartbeat=timedelta(seconds=1))
    assert timeout.join == timedelta(seconds=10)
    assert timeout.last_call == timedelta(seconds=30)
    assert timeout.close == timedelta(seconds=30)
    assert timeout.heartbeat == timedelta(seconds=1)


def test_timeout_accepts_seconds() -> None:
    timeout = RendezvousTimeout(join=12, last_call=0.5)  # type: ignore[arg-type]
    assert timeout.join == timedelta(seconds=12)
    assert timeout.last_call == timedelta(milliseconds=500)


@pytest.mark.parametrize("field", ["join", "last_call", "close", "heartbeat"])
@pytest.mark.parametrize("value", [timedelta(0), timedelta(seconds=-1), 0, -3.0])
def test_timeout_rejects_non_positive(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field} timeout must be positive"):
        RendezvousTimeout(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["10", True, float("nan"), float("inf"), [1]])
def test_timeout_rejects_non_durations(value: object) -> None:
    with pytest.raises(ValueError, match=r"^close timeout must be"):
        RendezvousTimeout(close=value)  # type: ignore[arg-type]


def test_timeout_properties_are_read_only() -> None:
    timeout = RendezvousTimeout()
    with pytest.raises(AttributeError):
        timeout.join = timedelta(seconds=1)  # type: ignore[misc]


def test_timeout_equality_and_repr() -> None:
    assert RendezvousTimeout(join=timedelta(seconds=600)) == RendezvousTimeout()
    assert RendezvousTimeout(join=timedelta(seconds=1)) != RendezvousTimeout()
    assert len({RendezvousTimeout(), RendezvousTimeout()}) == 1
    assert repr(RendezvousTimeout()) == (
        "RendezvousTimeout(join=600s, last_call=30s, close=30s, heartbeat=5s)"
    )


# -- exceptions ------------------------------------------------------------------------

SUBCLASSES = [
    RendezvousClosedError,
    RendezvousTimeoutError,
    RendezvousConnectionError,
    RendezvousStateError,
    RendezvousGracefulExitError,
    RendezvousExhaustedError,
]


def test_base_is_an_exception() -> None:
    assert issubclass(RendezvousError, Exception)
    assert not issubclass(RendezvousError, RuntimeError)


@pytest.mark.parametrize("cls", SUBCLASSES)
def test_every_exception_is_a_rendezvous_error(cls: type[Exception]) -> None:
    assert issubclass(cls, RendezvousError)
    assert cls.__doc__


def test_timeout_and_connection_errors_are_also_the_builtin_ones() -> None:
    assert issubclass(RendezvousTimeoutError, TimeoutError)
    assert issubclass(RendezvousConnectionError, ConnectionError)


@pytest.mark.parametrize("cls", [c for c in SUBCLASSES if c is not RendezvousExhaustedError])
def test_plain_exceptions_carry_a_message(cls: type[Exception]) -> None:
    error = cls("what went wrong")
    assert str(error) == "what went wrong"
    assert str(pickle.loads(pickle.dumps(error))) == "what went wrong"


def test_exhausted_error_from_an_object() -> None:
    config = SimpleNamespace(min_nodes=4, joined=2, run_id="job-1")
    error = RendezvousExhaustedError(config, timedelta(seconds=600))
    assert error.config is config
    assert error.timeout == timedelta(seconds=600)
    assert (error.joined, error.min_nodes, error.run_id) == (2, 4, "job-1")
    message = str(error)
    assert "'job-1'" in message
    assert "2 node(s) joined" in message
    assert "at least 4 were needed" in message
    assert "600 s" in message


def test_exhausted_error_from_a_mapping_and_seconds() -> None:
    error = RendezvousExhaustedError({"min_nodes": 3, "joined": 0}, 1.5)
    assert error.timeout == timedelta(seconds=1.5)
    assert error.run_id is None
    assert str(error) == (
        "the rendezvous gave up: 0 node(s) joined but at least 3 were needed (min_nodes); "
        "timed out after waiting 1.5 s (0:00:01.500000)"
    )


def test_exhausted_error_pickles() -> None:
    error = RendezvousExhaustedError({"min_nodes": 2, "joined": 1, "run_id": "r"}, 30)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is RendezvousExhaustedError
    assert str(copy) == str(error)
    assert copy.config == error.config
    assert copy.timeout == error.timeout


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"joined": 1}, "exposing 'min_nodes'"),
        (SimpleNamespace(min_nodes=2), "exposing 'joined'"),
        ({"min_nodes": 2, "joined": "1"}, "'joined' must be an int >= 0"),
        ({"min_nodes": -1, "joined": 0}, "'min_nodes' must be an int >= 0"),
    ],
)
def test_exhausted_error_rejects_a_config_without_counts(config: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        RendezvousExhaustedError(config, 10)


@pytest.mark.parametrize("timeout", ["10", None, True, float("nan")])
def test_exhausted_error_rejects_a_bad_timeout(timeout: Any) -> None:
    with pytest.raises(TypeError, match="timeout must be"):
        RendezvousExhaustedError({"min_nodes": 1, "joined": 0}, timeout)
