"""Check that the built site documents every name of the documented rendezvous API.

Usage: python docs/check_reference.py SITE_DIR [API_MARKDOWN]

API_MARKDOWN (default: docs/reference/rendezvous-api.md, the documented API as
published) lists each documented name under a ``### name`` heading, its
signature in the first code block below the heading and one code block per
documented method or property after that. For every name and every member,
the site's ``objects.inv`` (written by mkdocstrings) must have an entry
``<module>.<Name>`` (and ``<module>.<Name>.<member>``) whose page has that
anchor. Exits 1 listing what is missing, 2 when an input cannot be read.
Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_API = Path(__file__).resolve().parent / "reference" / "rendezvous-api.md"

# "## Classes 9": a section of the published page and how many names it has.
_SECTION = re.compile(r"^## (?P<title>\w+) (?P<count>\d+)\s*$")
_NAME = re.compile(r"^### (?P<name>\w+)\s*$")
_FENCE = re.compile(r"^```")
# Words before a member's name in its code block: "abstractmethod get_backend() → str".
_QUALIFIERS = {"abstractmethod", "async", "classmethod", "property", "staticmethod"}
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
# An objects.inv line: "name domain:role priority uri display-name".
_INVENTORY_LINE = re.compile(
    r"^(?P<name>\S+)\s+(?P<domain>\w+):(?P<role>\S+)\s+-?\d+\s+(?P<uri>\S*)"
)


class InputError(Exception):
    """An input file is missing or not in the expected format."""


@dataclass
class DocumentedName:
    """One ``### name`` of the published API: its full path and its members."""

    path: str
    members: list[str] = field(default_factory=list)


def read_documented_api(markdown: str) -> list[DocumentedName]:
    """The documented names, each with its documented members, in page order."""
    names: list[DocumentedName] = []
    blocks: list[list[str]] = []  # the code blocks under the current name
    expected: dict[str, int] = {}  # section title -> the count its heading states
    counted: dict[str, int] = {}
    section = ""
    current = ""
    in_block = False

    def finish() -> None:
        if current:
            names.append(_documented_name(current, blocks))

    for line in markdown.splitlines():
        if _FENCE.match(line):
            in_block = not in_block
            if in_block and current:
                blocks.append([])
            continue
        if in_block:
            if current:
                blocks[-1].append(line)
            continue
        if match := _SECTION.match(line):
            finish()
            current, blocks = "", []
            section = match["title"]
            expected[section] = int(match["count"])
            counted[section] = 0
        elif match := _NAME.match(line):
            finish()
            current, blocks = match["name"], []
            counted[section] = counted.get(section, 0) + 1
    finish()

    if not names:
        raise InputError("no '### name' headings found")
    for title, count in expected.items():
        if counted[title] != count:
            raise InputError(
                f"section '{title}' announces {count} names but {counted[title]} were found"
            )
    return names


def _documented_name(name: str, blocks: list[list[str]]) -> DocumentedName:
    """The full path of ``name`` from its signature block, and its members from the rest."""
    if not blocks or not blocks[0]:
        raise InputError(f"'{name}' has no signature code block")
    signature = " ".join(blocks[0])
    match = re.search(rf"(?P<module>[A-Za-z_][\w.]*)\.{re.escape(name)}\b", signature)
    if match is None:
        raise InputError(f"the signature of '{name}' does not name it: {signature!r}")
    documented = DocumentedName(f"{match['module']}.{name}")
    for block in blocks[1:]:
        words = " ".join(block).split()
        while words and words[0] in _QUALIFIERS:
            words.pop(0)
        member = _IDENTIFIER.match(words[0]) if words else None
        if member is None:
            raise InputError(f"cannot read a member name of '{name}' from {block!r}")
        documented.members.append(member.group())
    return documented


def read_inventory(site: Path) -> dict[str, str]:
    """The Python objects of ``site/objects.inv``: full name -> URI (relative to the site)."""
    path = site / "objects.inv"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    header = data.split(b"\n", 4)
    if len(header) < 5 or not header[0].startswith(b"# Sphinx inventory version 2"):
        raise InputError(f"{path} is not a version 2 Sphinx inventory")
    try:
        body = zlib.decompress(header[4]).decode("utf-8")
    except (zlib.error, UnicodeDecodeError) as exc:
        raise InputError(f"cannot decompress {path}: {exc}") from exc
    objects: dict[str, str] = {}
    for line in body.splitlines():
        match = _INVENTORY_LINE.match(line)
        if match and match["domain"] == "py":
            uri = match["uri"]
            if uri.endswith("$"):
                uri = uri[:-1] + match["name"]
            objects.setdefault(match["name"], uri)
    return objects


def has_anchor(site: Path, uri: str, pages: dict[Path, str]) -> bool:
    """Whether the page of ``uri`` (``page/#anchor``) has an element with that id."""
    page, _, anchor = uri.partition("#")
    path = site / page
    if page == "" or page.endswith("/"):
        path = path / "index.html"
    if path not in pages:
        try:
            pages[path] = path.read_text(encoding="utf-8")
        except OSError:
            pages[path] = ""
    return not anchor or f'id="{anchor}"' in pages[path]


def main(argv: list[str] | None = None) -> int:
    """Check the site; print a summary, or what is missing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built site (mkdocs' site_dir)")
    parser.add_argument(
        "api", type=Path, nargs="?", default=DEFAULT_API, help="the documented API (Markdown)"
    )
    args = parser.parse_args(argv)
    try:
        documented = read_documented_api(args.api.read_text(encoding="utf-8"))
        inventory = read_inventory(args.site)
    except (InputError, OSError) as exc:
        print(f"check_reference: {exc}", file=sys.stderr)
        return 2

    pages: dict[Path, str] = {}
    missing: list[str] = []
    members = 0
    for name in documented:
        for path in [name.path] + [f"{name.path}.{member}" for member in name.members]:
            uri = inventory.get(path)
            if uri is None:
                missing.append(f"{path}: no entry in objects.inv")
            elif not has_anchor(args.site, uri, pages):
                missing.append(f"{path}: {uri} has no such anchor")
        members += len(name.members)

    checked = f"{len(documented)} documented names and {members} documented members"
    if missing:
        print(f"check_reference: {len(missing)} missing from {args.site}:", file=sys.stderr)
        for line in missing:
            print(f"  {line}", file=sys.stderr)
        print(f"check_reference: FAILED ({checked} checked)", file=sys.stderr)
        return 1
    print(f"check_reference: OK, {checked} of {args.api.name} have reference entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
