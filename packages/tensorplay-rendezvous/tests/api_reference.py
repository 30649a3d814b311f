"""Read the documented API out of ``docs/reference/rendezvous-api.md``.

The reference is the Markdown page of the published API: ``## Functions N``,
``## Classes N`` and ``## Exceptions N`` sections, a ``### Name`` per entry,
then ``python`` code blocks: first the declaration (``class
tensorplay.distributed.elastic.rendezvous.Name(params)``), then one block per
documented member (``[abstractmethod |classmethod ]name(params) → type`` or
``property name: type``).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODULE = "tensorplay.distributed.elastic.rendezvous"
REFERENCE = Path("docs") / "reference" / "rendezvous-api.md"

_SECTION = re.compile(r"^## (Functions|Classes|Exceptions) (\d+)\s*$")
_ENTRY = re.compile(r"^### (\w+)\s*$")
_DECLARATION = re.compile(
    r"^(?:(class|exception) )?" + re.escape(MODULE) + r"\.(\w+)(?:\((.*)\))?(?:\s*→\s*(.+))?$"
)
_PROPERTY = re.compile(r"^property (\w+): (.+)$")
_METHOD = re.compile(
    r"^(?:(abstractmethod|classmethod|staticmethod) )?(\w+)\((.*)\)(?:\s*→\s*(.+))?$"
)


@dataclass(frozen=True)
class Member:
    """A documented method or property of a class."""

    name: str
    kind: str  # "property", "method", "abstractmethod", "classmethod" or "staticmethod"
    params: str | None  # None for properties


@dataclass
class Entry:
    """A documented function, class or exception."""

    name: str
    section: str  # "Functions", "Classes" or "Exceptions"
    params: str | None = None  # None when the declaration has no parentheses
    members: list[Member] = field(default_factory=list)


@dataclass
class Reference:
    """Everything the reference documents, with the counts its headings announce."""

    entries: dict[str, Entry]
    announced: dict[str, int]


def find_reference(start: Path) -> Path:
    """``docs/reference/rendezvous-api.md`` of the repository holding ``start``."""
    for directory in start.resolve().parents:
        candidate = directory / REFERENCE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{REFERENCE} not found above {start}: the conformance tests run from a checkout "
        "of the monorepo (the API reference lives at its root)"
    )


def parse(text: str) -> Reference:
    """Parse the reference page."""
    entries: dict[str, Entry] = {}
    announced: dict[str, int] = {}
    section: str | None = None
    entry: Entry | None = None
    block: list[str] | None = None
    for line in text.splitlines():
        if block is not None:
            if line.strip() == "```":
                _code_block(" ".join(part.strip() for part in block), entry)
                block = None
            else:
                block.append(line)
            continue
        if match := _SECTION.match(line):
            section, entry = match[1], None
            announced[section] = int(match[2])
        elif match := _ENTRY.match(line):
            if section is None:
                raise ValueError(f"entry {match[1]!r} outside a section")
            entry = entries[match[1]] = Entry(match[1], section)
        elif line.strip() == "```python":
            if entry is None:
                raise ValueError("a code block outside an entry")
            block = []
    return Reference(entries, announced)


def _code_block(code: str, entry: Entry | None) -> None:
    assert entry is not None
    if match := _DECLARATION.match(code):
        if match[2] != entry.name:
            raise ValueError(f"entry {entry.name!r} declares {match[2]!r}")
        entry.params = match[3]
    elif match := _PROPERTY.match(code):
        entry.members.append(Member(match[1], "property", None))
    elif match := _METHOD.match(code):
        entry.members.append(Member(match[2], match[1] or "method", match[3]))
    else:
        raise ValueError(f"cannot parse the code block of {entry.name!r}: {code!r}")


def reference_parameters(params: str) -> list[tuple[str, str, str]]:
    """:func:`describe` of a documented parameter list."""
    namespace: dict[str, Any] = {}
    # Annotations stay strings (they name types defined elsewhere); defaults are evaluated.
    exec(f"from __future__ import annotations\ndef f({params}): pass", namespace)
    return describe(inspect.signature(namespace["f"]))


def describe(signature: inspect.Signature, drop_first: bool = False) -> list[tuple[str, str, str]]:
    """``(name, kind, repr(default))`` of every parameter of ``signature``.

    The default is compared through ``repr`` so that ``600`` and ``600.0``, or
    ``''`` and ``None``, differ.
    """
    parameters = list(signature.parameters.values())
    if drop_first:
        parameters = parameters[1:]
    return [
        (p.name, p.kind.name, "<none>" if p.default is p.empty else repr(p.default))
        for p in parameters
    ]
