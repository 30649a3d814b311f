"""``RendezvousParameters``: signature forms, validation, config coercion and timeouts."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from tp_rdzv_api import RendezvousParameters, RendezvousTimeout


def make(**config: Any) -> RendezvousParameters:
    return RendezvousParameters("static", "localhost:29400", "job", config=config)


# -- construction --------------------------------------------------------------------


def test_keyword_form_keeps_every_attribute() -> None:
    params = RendezvousParameters(
        "core",
        "host:1234",
        "job-7",
        min_nodes=2,
        max_nodes=4,
        local_addr="10.0.0.5",
        node_rank=3,
        local_world_size=8,
        config={"is_host": "true"},
    )
    assert params.backend == "core"
    assert params.endpoint == "host:1234"
    assert params.run_id == "job-7"
    assert (params.min_nodes, params.max_nodes) == (2, 4)
    assert params.local_addr == "10.0.0.5"
    assert params.node_rank == 3
    assert params.local_world_size == 8
    assert params.config == {"is_host": "true"}


def test_defaults() -> None:
    params = RendezvousParameters("static", "", "")
    assert (params.min_nodes, params.max_nodes) == (1, 1)
    assert params.local_addr is None
    assert params.node_rank == 0
    assert params.local_world_size == 1
    assert params.config == {}


def test_missing_max_nodes_means_min_nodes() -> None:
    params = RendezvousParameters("static", "h:1", "r", min_nodes=3)
    assert (params.min_nodes, params.max_nodes) == (3, 3)


def test_missing_min_nodes_means_one() -> None:
    params = RendezvousParameters("static", "h:1", "r", max_nodes=5)
    assert (params.min_nodes, params.max_nodes) == (1, 5)


def test_pytorch_positional_form() -> None:
    params = RendezvousParameters("c10d", "h:1", "r", 2, 3, "10.1.1.1", is_host=True)
    assert (params.min_nodes, params.max_nodes, params.local_addr) == (2, 3, "10.1.1.1")
    assert params.config == {"is_host": True}


def test_positional_form_may_stop_early() -> None:
    params = RendezvousParameters("c10d", "h:1", "r", 2)
    assert (params.min_nodes, params.max_nodes, params.local_addr) == (2, 2, None)
    params = RendezvousParameters("c10d", "h:1", "r", 1, 4, local_addr="a")
    assert (params.min_nodes, params.max_nodes, params.local_addr) == (1, 4, "a")


def test_too_many_positional_arguments() -> None:
    with pytest.raises(TypeError, match=r"at most 6 positional arguments .* 7 were given"):
        RendezvousParameters("c10d", "h:1", "r", 1, 2, "addr", "extra")


@pytest.mark.parametrize(
    ("args", "keyword"),
    [
        ((1,), {"min_nodes": 1}),
        ((1, 2), {"max_nodes": 2}),
        ((1, 2, "a"), {"local_addr": "a"}),
    ],
)
def test_positional_given_twice(args: tuple[Any, ...], keyword: dict[str, Any]) -> None:
    (name,) = keyword
    with pytest.raises(TypeError, match=f"multiple values for argument '{name}'"):
        RendezvousParameters("c10d", "h:1", "r", *args, **keyword)


def test_kwargs_are_merged_into_config() -> None:
    params = RendezvousParameters(
        "core", "h:1", "r", config={"a": 1}, join_timeout="5", read_timeout=3
    )
    assert params.config == {"a": 1, "join_timeout": "5", "read_timeout": 3}


def test_config_is_copied() -> None:
    config: dict[str, Any] = {"a": 1}
    params = RendezvousParameters("core", "h:1", "r", config=config)
    config["a"] = 2
    assert params.get("a") == 1


def test_option_given_in_config_and_kwargs() -> None:
    with pytest.raises(TypeError, match="'a' was given both in config and as a keyword"):
        RendezvousParameters("core", "h:1", "r", config={"a": 1}, a=2)


def test_backend_is_stripped() -> None:
    assert RendezvousParameters(" static\n", "h:1", "r").backend == "static"


@pytest.mark.parametrize("backend", ["", "   ", "\t\n"])
def test_empty_backend(backend: str) -> None:
    with pytest.raises(ValueError, match="backend must be a non-empty string"):
        RendezvousParameters(backend, "h:1", "r")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_nodes": 0}, "min_nodes must be >= 1, got 0"),
        ({"min_nodes": -2}, "min_nodes must be >= 1, got -2"),
        ({"min_nodes": 3, "max_nodes": 2}, r"max_nodes \(2\) must be >= min_nodes \(3\)"),
        ({"max_nodes": 0}, "max_nodes must be >= 1, got 0"),
        ({"node_rank": -1}, "node_rank must be >= 0, got -1"),
        ({"local_world_size": 0}, "local_world_size must be >= 1, got 0"),
    ],
)
def test_out_of_range_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RendezvousParameters("static", "h:1", "r", **kwargs)


def test_positional_min_nodes_is_validated() -> None:
    with pytest.raises(ValueError, match="min_nodes must be >= 1"):
        RendezvousParameters("c10d", "h:1", "r", 0, 2)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((5, "h:1", "r"), {}, "backend must be a str"),
        (("static", None, "r"), {}, "endpoint must be a str"),
        (("static", "h:1", 5), {}, "run_id must be a str"),
        (("static", "h:1", "r"), {"min_nodes": "2"}, "min_nodes must be an int"),
        (("static", "h:1", "r"), {"max_nodes": 2.0}, "max_nodes must be an int"),
        (("static", "h:1", "r"), {"min_nodes": True}, "min_nodes must be an int"),
        (("static", "h:1", "r"), {"node_rank": "0"}, "node_rank must be an int"),
        (("static", "h:1", "r"), {"local_addr": 10}, "local_addr must be a str"),
        (("static", "h:1", "r"), {"config": [("a", 1)]}, "config must be a dict"),
        (("static", "h:1", "r"), {"config": {1: "a"}}, "config keys must be str"),
    ],
)
def test_wrong_types(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        RendezvousParameters(*args, **kwargs)


def test_missing_backend_is_a_value_error_as_in_pytorch() -> None:
    with pytest.raises(ValueError, match="backend must be a non-empty string"):
        RendezvousParameters(None, "h:1", "r")  # type: ignore[arg-type]


def test_repr_shows_the_attributes() -> None:
    text = repr(RendezvousParameters("static", "h:1", "r", min_nodes=2, x="y"))
    assert "backend='static'" in text
    assert "min_nodes=2, max_nodes=2" in text
    assert "config={'x': 'y'}" in text


# -- get / get_as_bool / get_as_int ------------------------------------------------------


def test_get() -> None:
    params = make(a=1, none=None)
    assert params.get("a") == 1
    assert params.get("missing") is None
    assert params.get("missing", "d") == "d"
    assert params.get("none", "d") is None  # a present key wins, as dict.get


TRUE_VALUES = [True, 1, "1", "true", "True", "TRUE", "t", "T", "yes", "Yes", "y", "Y", " true "]
FALSE_VALUES = [False, 0, "0", "false", "False", "f", "F", "no", "NO", "n", "N", "\tno\n"]
NOT_BOOLS = [2, -1, 1.0, 0.0, "", " ", "2", "on", "off", "truthy", "nope", b"1", [1], None]


@pytest.mark.parametrize("value", TRUE_VALUES)
def test_get_as_bool_true(value: object) -> None:
    assert make(flag=value).get_as_bool("flag") is True


@pytest.mark.parametrize("value", FALSE_VALUES)
def test_get_as_bool_false(value: object) -> None:
    assert make(flag=value).get_as_bool("flag") is False


@pytest.mark.parametrize("value", [v for v in NOT_BOOLS if v is not None])
def test_get_as_bool_rejects(value: object) -> None:
    with pytest.raises(ValueError, match=r"option 'flag' must be a boolean") as info:
        make(flag=value).get_as_bool("flag")
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("default", [None, True, False])
def test_get_as_bool_missing_gives_default(default: bool | None) -> None:
    assert make().get_as_bool("flag", default) is default
    assert make(flag=None).get_as_bool("flag", default) is default


INTS = [
    (0, 0),
    (7, 7),
    (-3, -3),
    (2**40, 2**40),
    ("0", 0),
    ("42", 42),
    (" 42 ", 42),
    ("+5", 5),
    ("-5", -5),
    ("007", 7),
]
NOT_INTS = [True, False, 1.0, 2.5, "", " ", "1.0", "1e3", "0x10", "ten", "1 2", "1_000", b"1", [1]]


@pytest.mark.parametrize(("value", "expected"), INTS)
def test_get_as_int(value: object, expected: int) -> None:
    assert make(n=value).get_as_int("n") == expected


@pytest.mark.parametrize("value", NOT_INTS)
def test_get_as_int_rejects(value: object) -> None:
    with pytest.raises(ValueError, match=r"option 'n' must be an integer"):
        make(n=value).get_as_int("n")


@pytest.mark.parametrize("value", ["9" * 5000, "-" + "1" * 101])
def test_an_over_long_integer_names_the_option(value: str) -> None:
    # Not Python's "Exceeds the limit (4300 digits)", which names nothing.
    with pytest.raises(ValueError, match=r"option 'n' must be an integer of at most 100 digits"):
        make(n=value).get_as_int("n")


def test_leading_zeros_do_not_count_as_digits() -> None:
    assert make(n="0" * 200 + "42").get_as_int("n") == 42


@pytest.mark.parametrize("value", ["9" * 5000, "1e999"])
def test_an_over_long_duration_names_the_option(value: str) -> None:
    with pytest.raises(ValueError, match=r"option 'join_timeout' is too large"):
        _ = make(join_timeout=value).timeout


@pytest.mark.parametrize("default", [None, 0, 9])
def test_get_as_int_missing_gives_default(default: int | None) -> None:
    assert make().get_as_int("n", default) == default
    assert make(n=None).get_as_int("n", default) == default


# -- timeout ---------------------------------------------------------------------------


def test_timeout_defaults() -> None:
    assert make().timeout == RendezvousTimeout()


def test_timeout_from_config() -> None:
    timeout = make(
        join_timeout="120", last_call_timeout=5, close_timeout=2.5, heartbeat_timeout=" 1.5 "
    ).timeout
    assert timeout.join == timedelta(seconds=120)
    assert timeout.last_call == timedelta(seconds=5)
    assert timeout.close == timedelta(seconds=2.5)
    assert timeout.heartbeat == timedelta(seconds=1.5)


def test_timeout_accepts_timedelta_and_partial_config() -> None:
    timeout = make(join_timeout=timedelta(minutes=1)).timeout
    assert timeout.join == timedelta(minutes=1)
    assert timeout.heartbeat == RendezvousTimeout().heartbeat


@pytest.mark.parametrize(
    "key", ["join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout"]
)
@pytest.mark.parametrize(
    "value", ["abc", "", "0", "-1", 0, -5, 0.0, True, "nan", "inf", float("inf"), [1]]
)
def test_timeout_bad_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"option '{key}'"):
        _ = make(**{key: value}).timeout


def test_convert_keeps_ours_and_copies_pytorch_style_parameters() -> None:
    ours = RendezvousParameters("core", "h:1", "job")
    assert RendezvousParameters.convert(ours) is ours
    # PyTorch's RendezvousParameters: the same attributes, the options in `config`.
    foreign = SimpleNamespace(
        backend="tp",
        endpoint="h:1",
        run_id="job",
        min_nodes=1,
        max_nodes=3,
        local_addr="10.0.0.1",
        config={"last_call_timeout": "1.5", "timeout": 900},
    )
    converted = RendezvousParameters.convert(foreign)
    assert repr(converted) == (
        "RendezvousParameters(backend='tp', endpoint='h:1', run_id='job', min_nodes=1, "
        "max_nodes=3, local_addr='10.0.0.1', node_rank=0, local_world_size=1, "
        "config={'last_call_timeout': '1.5', 'timeout': 900})"
    )
    assert converted.timeout.last_call == timedelta(seconds=1.5)
    converted.config["extra"] = 1
    assert "extra" not in foreign.config  # a copy


def test_convert_checks_what_it_copies() -> None:
    foreign = SimpleNamespace(
        backend="tp", endpoint="h:1", run_id="job", min_nodes=0, max_nodes=1, local_addr=None
    )
    with pytest.raises(TypeError, match=r"\(no config\)"):
        RendezvousParameters.convert(foreign)
    foreign.config = {}
    with pytest.raises(ValueError, match="min_nodes must be >= 1"):
        RendezvousParameters.convert(foreign)
