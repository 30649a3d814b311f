"""Griffe extensions for the API reference (loaded by mkdocstrings, see mkdocs.yml).

- ``NamespaceSubpackages``: ``tensorplay.distributed.elastic`` is a namespace
  package (no ``__init__.py``) inside the regular package
  ``tensorplay.distributed``. Python imports it, but Griffe skips namespace
  packages under regular packages, so ``tensorplay.distributed.elastic.rendezvous``
  would not exist for mkdocstrings. This extension loads such directories
  after the package has been loaded.
- ``SphinxRoles``: our docstrings use Sphinx roles (for example
  ``:class:`~tp_store.TCPStore``` or ``:meth:`shutdown```), which Markdown
  would show verbatim. This extension rewrites each role as inline code
  (``TCPStore``, ``shutdown``) in the rendered docstrings; the source is
  unchanged.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

_SKIPPED_DIRS = {"__pycache__"}


class NamespaceSubpackages(griffe.Extension):
    """Load namespace packages nested in regular packages, as Python imports them."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Walk the freshly loaded package and add the namespace subpackages it skipped."""
        paths = pkg.filepath if isinstance(pkg.filepath, list) else [pkg.filepath]
        for path in paths:
            if path is not None:
                _add_missing(path.parent if path.name == "__init__.py" else path, pkg, loader)


def _add_missing(directory: Path, module: griffe.Module, loader: griffe.GriffeLoader) -> None:
    """Add the namespace subdirectories of ``directory`` (the folder of ``module``)."""
    for child in sorted(directory.iterdir()):
        if not child.is_dir() or child.name in _SKIPPED_DIRS or not child.name.isidentifier():
            continue
        if child.name in module.members:
            member = module.members[child.name]
            if isinstance(member, griffe.Module):
                _add_missing(child, member, loader)
            continue
        if (child / "__init__.py").exists() or not any(child.rglob("*.py")):
            continue
        namespace = griffe.Module(child.name, filepath=[child], parent=module)
        module.set_member(child.name, namespace)
        _load_tree(child, namespace, loader)


def _load_tree(directory: Path, parent: griffe.Module, loader: griffe.GriffeLoader) -> None:
    """Visit every module under ``directory`` as a member of ``parent``."""
    init = directory / "__init__.py"
    for child in sorted(directory.iterdir()):
        if child.is_dir() and child.name not in _SKIPPED_DIRS and child.name.isidentifier():
            if (child / "__init__.py").exists():
                module = _visit(child.name, child / "__init__.py", parent, loader)
            elif any(child.rglob("*.py")):
                module = griffe.Module(child.name, filepath=[child], parent=parent)
            else:
                continue
            parent.set_member(child.name, module)
            _load_tree(child, module, loader)
        elif child.suffix == ".py" and child != init and child.stem.isidentifier():
            parent.set_member(child.stem, _visit(child.stem, child, parent, loader))


def _visit(
    name: str, path: Path, parent: griffe.Module, loader: griffe.GriffeLoader
) -> griffe.Module:
    code = path.read_text(encoding="utf-8-sig")
    loader.lines_collection[path] = code.splitlines(keepends=False)
    return griffe.visit(
        name,
        filepath=path,
        code=code,
        extensions=loader.extensions,
        parent=parent,
        docstring_parser=loader.docstring_parser,
        docstring_options=loader.docstring_options,
        lines_collection=loader.lines_collection,
        modules_collection=loader.modules_collection,
    )


# :meth:`name`, :class:`~pkg.Name`, :func:`.relative`, ... (the Python domain's roles)
_ROLE = re.compile(r":(?:py:)?(?:attr|class|const|data|exc|func|meth|mod|obj):`(?P<target>[^`]+)`")


def _as_code(match: re.Match[str]) -> str:
    target = match.group("target").strip()
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target.lstrip('.')}`"


class SphinxRoles(griffe.Extension):
    """Show Sphinx cross-reference roles as inline code."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Rewrite the roles of every docstring of the package, once it is loaded.

        After loading rather than per object, so that it also sees the docstrings
        other extensions add (griffe-sphinx's ``#:`` comments).
        """
        _rewrite_roles(pkg)


def _rewrite_roles(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        obj.docstring.value = _ROLE.sub(_as_code, obj.docstring.value)
    for member in obj.members.values():
        # Aliases are skipped: their targets are rewritten in the package they live in.
        if isinstance(member, griffe.Object):
            _rewrite_roles(member)
