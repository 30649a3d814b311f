"""Every documented name of ``tensorplay.distributed.elastic.rendezvous``, as documented.

The reference is our vendored API page, ``docs/reference/rendezvous-api.md``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import api_reference
import pytest
from api_reference import Entry, Member, describe, reference_parameters

import tensorplay.distributed.elastic.rendezvous as rdzv
import tp_rdzv_api
import tp_rdzv_api.registry
import tp_rdzv_dynamic
import tp_rdzv_static

REFERENCE = api_reference.parse(
    api_reference.find_reference(Path(__file__)).read_text(encoding="utf-8")
)
DOCUMENTED = REFERENCE.entries
IMPLEMENTED = sorted(DOCUMENTED)
MEMBERS = [(entry.name, member) for entry in DOCUMENTED.values() for member in entry.members]
#: Where each re-exported name comes from: the meta-package adds no objects of its own.
SOURCES: dict[str, Any] = {
    "create_handler": tp_rdzv_api.registry,
    "StaticTCPRendezvous": tp_rdzv_static,
    "DynamicRendezvousHandler": tp_rdzv_dynamic,
    "RendezvousSettings": tp_rdzv_dynamic,
    "TpRendezvousBackend": tp_rdzv_dynamic,
    "P10dRendezvousBackend": tp_rdzv_dynamic,
}


# -- the reference itself ---------------------------------------------------------------


def test_the_reference_parses_completely() -> None:
    announced = REFERENCE.announced
    assert announced == {"Functions": 1, "Classes": 9, "Exceptions": 7}
    for section, count in announced.items():
        names = [entry.name for entry in DOCUMENTED.values() if entry.section == section]
        assert len(names) == count, f"{section}: announced {count}, parsed {names}"
    # Only the interface and the exceptions are documented without a parameter list.
    bare = [entry.name for entry in DOCUMENTED.values() if entry.params is None]
    assert [name for name in bare if DOCUMENTED[name].section != "Exceptions"] == [
        "RendezvousHandler"
    ]


# -- the names ----------------------------------------------------------------------------


def test_all_is_exactly_the_documented_names() -> None:
    assert len(rdzv.__all__) == len(set(rdzv.__all__)), "duplicates in __all__"
    assert sorted(rdzv.__all__) == IMPLEMENTED


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_name_is_exported_from_its_implementation(name: str) -> None:
    assert hasattr(rdzv, name), f"{name} is documented but missing"
    source = SOURCES.get(name, tp_rdzv_api)
    assert getattr(rdzv, name) is getattr(source, name), f"{name} is not a plain re-export"


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_signature(name: str) -> None:
    entry = DOCUMENTED[name]
    obj = getattr(rdzv, name)
    if entry.section == "Functions":
        assert inspect.isfunction(obj), f"{name} should be a function"
    else:
        assert inspect.isclass(obj), f"{name} should be a class"
    if entry.section == "Exceptions":
        assert issubclass(obj, rdzv.RendezvousError), f"{name} is not a RendezvousError"
        if entry.params is None:  # documented without a constructor signature
            return
    expected = reference_parameters(entry.params or "")
    assert describe(inspect.signature(obj)) == expected, f"signature of {name}"


@pytest.mark.parametrize(
    ("owner", "member"), MEMBERS, ids=[f"{owner}.{member.name}" for owner, member in MEMBERS]
)
def test_member(owner: str, member: Member) -> None:
    cls = getattr(rdzv, owner)
    assert hasattr(cls, member.name), f"{owner}.{member.name} is documented but missing"
    attribute = inspect.getattr_static(cls, member.name)
    abstract = member.name in getattr(cls, "__abstractmethods__", frozenset())
    if member.kind == "property":
        assert isinstance(attribute, property), f"{owner}.{member.name} should be a property"
        assert not abstract
        return
    if member.kind == "classmethod":
        assert isinstance(attribute, classmethod), f"{owner}.{member.name} should be a classmethod"
        function = attribute.__func__
    elif member.kind == "staticmethod":
        assert isinstance(attribute, staticmethod)
        function = attribute.__func__
    else:
        assert inspect.isfunction(attribute), f"{owner}.{member.name} should be a method"
        function = attribute
        assert abstract is (member.kind == "abstractmethod"), (
            f"{owner}.{member.name} should {'' if member.kind == 'abstractmethod' else 'not '}"
            "be abstract"
        )
    expected = reference_parameters(member.params or "")
    actual = describe(inspect.signature(function), drop_first=member.kind != "staticmethod")
    assert actual == expected, f"signature of {owner}.{member.name}"


@pytest.mark.parametrize("name", [n for n in IMPLEMENTED if DOCUMENTED[n].section == "Classes"])
def test_only_documented_abstract_classes_are_abstract(name: str) -> None:
    entry: Entry = DOCUMENTED[name]
    documented_abstract = any(member.kind == "abstractmethod" for member in entry.members)
    assert inspect.isabstract(getattr(rdzv, name)) is documented_abstract


def test_exceptions_share_one_base() -> None:
    exceptions = [name for name in IMPLEMENTED if DOCUMENTED[name].section == "Exceptions"]
    assert len(exceptions) == 7
    for name in exceptions:
        assert issubclass(getattr(rdzv, name), rdzv.RendezvousError)
    assert issubclass(rdzv.RendezvousError, Exception)
