"""The public surface: exported names, documented signatures, docstrings, the handler ABC."""

from __future__ import annotations

import inspect
from datetime import timedelta

import pytest

import tp_rdzv_api
from tp_rdzv_api import RendezvousHandler, RendezvousInfo, api, registry, utils
from tp_store import HashStore

DOCUMENTED_CLASSES = [
    "RendezvousHandler",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousStoreInfo",
    "RendezvousTimeout",
]
DOCUMENTED_EXCEPTIONS = [
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousExhaustedError",
    "RendezvousGracefulExitError",
    "RendezvousStateError",
    "RendezvousTimeoutError",
]


def test_all_is_exact_and_importable() -> None:
    assert sorted(tp_rdzv_api.__all__) == tp_rdzv_api.__all__
    for name in tp_rdzv_api.__all__:
        assert hasattr(tp_rdzv_api, name), name
    assert tp_rdzv_api.__version__ == "0.1.0"


@pytest.mark.parametrize("name", DOCUMENTED_CLASSES + DOCUMENTED_EXCEPTIONS)
def test_api_module_holds_the_documented_names(name: str) -> None:
    assert getattr(api, name) is getattr(tp_rdzv_api, name)


def test_seed_imports() -> None:
    assert utils.parse_rendezvous_endpoint is tp_rdzv_api.parse_rendezvous_endpoint
    assert registry.create_handler is tp_rdzv_api.create_handler
    assert registry.register is tp_rdzv_api.register


def _public_members(obj: object) -> list[tuple[str, object]]:
    return [
        (name, member)
        for name, member in vars(obj).items()
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    ]


@pytest.mark.parametrize("name", [n for n in tp_rdzv_api.__all__ if n[0].isupper()])
def test_public_names_have_docstrings(name: str) -> None:
    obj = getattr(tp_rdzv_api, name)
    if not inspect.isclass(obj):
        return  # constants and type aliases
    assert inspect.getdoc(obj), name
    for member_name, member in _public_members(obj):
        assert inspect.getdoc(member), f"{name}.{member_name}"


@pytest.mark.parametrize(
    "function",
    [
        tp_rdzv_api.create_handler,
        tp_rdzv_api.register,
        tp_rdzv_api.parse_rendezvous_config,
        tp_rdzv_api.parse_rendezvous_endpoint,
    ],
)
def test_functions_have_docstrings(function: object) -> None:
    assert inspect.getdoc(function)


def _shape(callable_: object) -> list[tuple[str, object, object]]:
    signature = inspect.signature(callable_)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


P = inspect.Parameter
E = P.empty


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (tp_rdzv_api.create_handler, [("params", P.POSITIONAL_OR_KEYWORD, E)]),
        (
            tp_rdzv_api.RendezvousInfo,
            [
                ("store", P.POSITIONAL_OR_KEYWORD, E),
                ("rank", P.POSITIONAL_OR_KEYWORD, E),
                ("world_size", P.POSITIONAL_OR_KEYWORD, E),
                ("bootstrap_store_info", P.POSITIONAL_OR_KEYWORD, None),
                ("participants", P.POSITIONAL_OR_KEYWORD, None),
                ("wait_list", P.POSITIONAL_OR_KEYWORD, None),
            ],
        ),
        (
            tp_rdzv_api.RendezvousParameters,
            [
                ("backend", P.POSITIONAL_OR_KEYWORD, E),
                ("endpoint", P.POSITIONAL_OR_KEYWORD, E),
                ("run_id", P.POSITIONAL_OR_KEYWORD, E),
                ("args", P.VAR_POSITIONAL, E),
                ("min_nodes", P.KEYWORD_ONLY, None),
                ("max_nodes", P.KEYWORD_ONLY, None),
                ("local_addr", P.KEYWORD_ONLY, None),
                ("node_rank", P.KEYWORD_ONLY, 0),
                ("local_world_size", P.KEYWORD_ONLY, 1),
                ("config", P.KEYWORD_ONLY, None),
                ("kwargs", P.VAR_KEYWORD, E),
            ],
        ),
        (
            tp_rdzv_api.RendezvousParameters.get,
            [
                ("self", P.POSITIONAL_OR_KEYWORD, E),
                ("key", P.POSITIONAL_OR_KEYWORD, E),
                ("default", P.POSITIONAL_OR_KEYWORD, None),
            ],
        ),
        (
            tp_rdzv_api.RendezvousStoreInfo,
            [("master_addr", P.POSITIONAL_OR_KEYWORD, E), ("port", P.POSITIONAL_OR_KEYWORD, E)],
        ),
        (
            tp_rdzv_api.RendezvousStoreInfo.build,
            [
                ("rank", P.POSITIONAL_OR_KEYWORD, E),
                ("store", P.POSITIONAL_OR_KEYWORD, E),
                ("local_addr", P.POSITIONAL_OR_KEYWORD, None),
                ("server_port", P.POSITIONAL_OR_KEYWORD, None),
            ],
        ),
        (
            tp_rdzv_api.RendezvousTimeout,
            [(name, P.POSITIONAL_OR_KEYWORD, None) for name in ("join", "last_call")]
            + [(name, P.POSITIONAL_OR_KEYWORD, None) for name in ("close", "heartbeat")],
        ),
        (
            tp_rdzv_api.RendezvousExhaustedError,
            [("config", P.POSITIONAL_OR_KEYWORD, E), ("timeout", P.POSITIONAL_OR_KEYWORD, E)],
        ),
    ],
)
def test_documented_signatures(target: object, expected: list[tuple[str, object, object]]) -> None:
    assert _shape(target) == expected


@pytest.mark.parametrize("method", ["get_as_bool", "get_as_int"])
def test_coercing_getters_signature(method: str) -> None:
    target = getattr(tp_rdzv_api.RendezvousParameters, method)
    assert _shape(target)[1:] == [
        ("key", P.POSITIONAL_OR_KEYWORD, E),
        ("default", P.POSITIONAL_OR_KEYWORD, None),
    ]


def test_handler_abstract_methods_are_the_documented_ones() -> None:
    assert RendezvousHandler.__abstractmethods__ == {
        "get_backend",
        "get_run_id",
        "is_closed",
        "next_rendezvous",
        "num_nodes_waiting",
        "set_closed",
        "shutdown",
    }
    with pytest.raises(TypeError):
        RendezvousHandler()  # type: ignore[abstract]


class Minimal(RendezvousHandler):
    def get_backend(self) -> str:
        return "minimal"

    def get_run_id(self) -> str:
        return "run"

    def is_closed(self) -> bool:
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        return RendezvousInfo(HashStore(), 0, 1)

    def num_nodes_waiting(self) -> int:
        return 0

    def set_closed(self) -> None:
        pass

    def shutdown(self) -> bool:
        return True


def test_handler_defaults() -> None:
    handler = Minimal()
    assert handler.pre_shutdown() is None  # type: ignore[func-returns-value]
    assert handler.use_agent_store is False
    assert isinstance(RendezvousHandler.__dict__["use_agent_store"], property)


def test_timeouts_are_timedeltas() -> None:
    timeout = tp_rdzv_api.RendezvousTimeout()
    for field in ("join", "last_call", "close", "heartbeat"):
        assert isinstance(getattr(timeout, field), timedelta)
