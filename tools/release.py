"""Check and build every distribution under packages/, released in lockstep under one version.

``nox -s dist`` and .github/workflows/release.yml both run this script, so the checks exist once:

``python tools/release.py check [--tag vX.Y.Z]``
    Every package has the one release version (its hatch version file), every requirement
    (dependencies and extras) naming one of our packages pins it ``==<version>``, each
    ``packages/<dist>/LICENSE`` is a copy of the root LICENSE and, with ``--tag``, the tag is
    ``v<version>``. Prints the version.
``python tools/release.py build DIR``
    ``check``, then DIR emptied and every sdist and wheel built into it with hatch; exactly the
    expected files, ``twine check --strict``, only what belongs in each archive, and each sdist
    building the same wheel.
``python tools/release.py requirements``
    The third-party runtime requirements of all packages, one a line.

Errors are one line each (GitHub annotations under Actions); any exits 1. Standard library
only, but for tomli on Python 3.10, which hatch installs there.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # hatchling depends on tomli before Python 3.11
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

ROOT = Path(__file__).resolve().parent.parent
# The meta-package: its version is the release's.
RELEASE_PACKAGE = "tensorplay-rendezvous"
# What an sdist may hold at its top level (hatchling always adds the repository's .gitignore),
# and what it must.
SDIST_TOPS = {"src", "tests", "README.md", "CHANGELOG.md", "LICENSE", "pyproject.toml"}
SDIST_TOPS |= {"hatch_build.py"}  # tp-store's optional mypyc build
SDIST_TOPS |= {"PKG-INFO", ".gitignore"}
SDIST_REQUIRED = {"README.md", "CHANGELOG.md", "LICENSE", "pyproject.toml"}
WHEEL_SUFFIX = "-py3-none-any.whl"


class ReleaseError(Exception):
    """A failed check; each argument is one line of explanation."""


@dataclass(frozen=True)
class Package:
    """One distribution under packages/, as its pyproject.toml and version file declare it."""

    name: str
    directory: Path
    version: str | None
    dependencies: tuple[str, ...]
    optional_dependencies: dict[str, tuple[str, ...]]
    wheel_packages: tuple[str, ...]

    @property
    def extras(self) -> tuple[str, ...]:
        """The requirements of every extra."""
        return tuple(r for extra in self.optional_dependencies.values() for r in extra)

    def stem(self, version: str) -> str:
        """The file name of its sdist and wheel of ``version``, without the suffix."""
        return f"{self.name.replace('-', '_')}-{version}"


def load_packages(root: Path = ROOT) -> list[Package]:
    """Every package under ``root``/packages, in directory order."""
    packages = []
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        config: dict[str, Any] = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        project, hatch = config["project"], config["tool"]["hatch"]
        about = (pyproject.parent / hatch["version"]["path"]).read_text(encoding="utf-8")
        version = re.search(r'^__version__ = "([^"]+)"', about, re.MULTILINE)
        packages.append(
            Package(
                name=project["name"],
                directory=pyproject.parent,
                version=version[1] if version else None,
                dependencies=tuple(project.get("dependencies", [])),
                optional_dependencies={
                    extra: tuple(requirements)
                    for extra, requirements in project.get("optional-dependencies", {}).items()
                },
                wheel_packages=tuple(hatch["build"]["targets"]["wheel"]["packages"]),
            )
        )
    return packages


def requirement_name(requirement: str) -> str:
    """The normalized project name a requirement string names (PEP 503)."""
    name = re.split(r"[\s\[(<>=!~;@]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def check(packages: Sequence[Package], root: Path = ROOT, tag: str | None = None) -> str:
    """The release version, once versions, pins, LICENSE copies and ``tag`` all agree."""
    ours = {requirement_name(package.name) for package in packages}
    release = next((p.version for p in packages if p.name == RELEASE_PACKAGE), None)
    if release is None:
        raise ReleaseError(f"no version for {RELEASE_PACKAGE}, whose version is the release's")
    errors = []
    license_text = (root / "LICENSE").read_bytes()
    for package in packages:
        where = package.directory.relative_to(root)
        if package.version is None:
            errors.append(f"{package.name} has no __version__ in its hatch version file")
        elif package.version != release:
            errors.append(f"{package.name} is version {package.version}, not {release}")
        for requirement in (*package.dependencies, *package.extras):
            name = requirement_name(requirement)
            pinned = re.fullmatch(rf"{name}(\[[\w,-]+\])?=={re.escape(release)}", requirement)
            if name in ours and pinned is None:
                errors.append(f"{package.name} requires {requirement!r}, not {name}=={release}")
        license_copy = package.directory / "LICENSE"
        if not license_copy.is_file() or license_copy.read_bytes() != license_text:
            errors.append(f"{where}/LICENSE is not a copy of LICENSE")
    if tag is not None and tag != f"v{release}":
        errors.append(f"tag {tag} does not match version {release} (v{release})")
    if errors:
        raise ReleaseError(*errors)
    return release


def run(*command: str | Path, cwd: Path | None = None) -> None:
    """Run ``command`` (a Python module, with this interpreter), echoed; fail if it fails."""
    argv = [sys.executable, "-m", *map(str, command)]
    print("+", *argv[2:], *([f"(in {cwd})"] if cwd else []), flush=True)
    exit_code = subprocess.run(argv, cwd=cwd, check=False).returncode
    if exit_code:
        raise ReleaseError(f"{' '.join(argv[2:])} exited with {exit_code}")


def check_archives(package: Package, stem: str, out: Path) -> list[str]:
    """Errors in ``package``'s sdist and wheel in ``out``, and whether its sdist rebuilds it.

    The sdist holds the package, its tests, README, CHANGELOG, LICENSE, pyproject.toml and
    PKG-INFO; the wheel, the package (with py.typed) and its metadata, the license included.
    """
    errors = []
    sdist_path, wheel_path = out / f"{stem}.tar.gz", out / f"{stem}{WHEEL_SUFFIX}"
    with tarfile.open(sdist_path) as sdist:
        files = {m.name.removeprefix(f"{stem}/") for m in sdist.getmembers() if m.isfile()}
    stray = sorted(f for f in files if f.split("/")[0] not in SDIST_TOPS or "__pycache__" in f)
    missing = sorted(SDIST_REQUIRED - files)
    if stray or missing:
        errors.append(f"{sdist_path.name}: stray {stray}, missing {missing}")
    with zipfile.ZipFile(wheel_path) as wheel:
        names = sorted(wheel.namelist())
    roots = {Path(p).name for p in package.wheel_packages} | {f"{stem}.dist-info"}
    stray = [n for n in names if n.split("/")[0] not in roots or "__pycache__" in n]
    if stray:
        errors.append(f"{wheel_path.name}: stray {stray}")
    if not any(n.endswith("/py.typed") for n in names):
        errors.append(f"{wheel_path.name}: no py.typed")
    if f"{stem}.dist-info/licenses/LICENSE" not in names:
        errors.append(f"{wheel_path.name}: no LICENSE")
    with tempfile.TemporaryDirectory() as rebuilt:
        run("pip", "wheel", "-q", "--no-deps", "-w", rebuilt, sdist_path)
        with zipfile.ZipFile(Path(rebuilt) / wheel_path.name) as wheel:
            if sorted(wheel.namelist()) != names:
                errors.append(f"{sdist_path.name} builds a wheel that differs from {out.name}/'s")
    return errors


def build(packages: Sequence[Package], out: Path, root: Path = ROOT) -> list[Path]:
    """``check``, then every sdist and wheel built into ``out`` (emptied first) and checked."""
    version = check(packages, root)
    out = out.resolve()
    if out == root or out in root.parents:
        raise ReleaseError(f"refusing to empty {out}, which holds the repository")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    for package in packages:
        run("hatch", "build", "-t", "sdist", "-t", "wheel", out, cwd=package.directory)
    stems = [package.stem(version) for package in packages]
    expected = sorted(stem + suffix for stem in stems for suffix in (".tar.gz", WHEEL_SUFFIX))
    built = sorted(path.name for path in out.iterdir())
    if built != expected:
        raise ReleaseError(f"{out} holds {built}, not {expected}")
    run("twine", "check", "--strict", *(out / name for name in built))
    errors = [error for p in packages for error in check_archives(p, p.stem(version), out)]
    if errors:
        raise ReleaseError(*errors)
    return [out / name for name in built]


def requirement_extras(requirement: str) -> list[str]:
    """The extras a requirement string asks for (``tp-store[fast]==1`` gives ``["fast"]``)."""
    match = re.match(r"[^\s\[(<>=!~;@]+\s*\[([^\]]*)\]", requirement)
    return [extra.strip() for extra in match[1].split(",")] if match else []


def third_party_requirements(packages: Sequence[Package]) -> list[str]:
    """The runtime requirements of ``packages`` that are not among them, deduplicated.

    Those of an extra of ours that one of ours depends on (``tp-store[fast]``) count too.
    """
    ours = {requirement_name(package.name): package for package in packages}
    found = []
    for package in packages:
        for requirement in package.dependencies:
            name = requirement_name(requirement)
            if name not in ours:
                found.append(requirement)
                continue
            for extra in requirement_extras(requirement):
                extra_requirements = ours[name].optional_dependencies[extra]
                found += [r for r in extra_requirements if requirement_name(r) not in ours]
    return list(dict.fromkeys(found))


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; 0 on success, 1 (with the errors printed) on failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check", help="versions, pins, LICENSE copies, tag")
    check_parser.add_argument("--tag", help="the release tag, which must be v<version>")
    build_parser = commands.add_parser("build", help="check, then build and check into DIR")
    build_parser.add_argument("dir", type=Path, metavar="DIR", help="emptied first")
    commands.add_parser("requirements", help="third-party runtime requirements, one a line")
    args = parser.parse_args(argv)

    packages = load_packages()
    try:
        if args.command == "check":
            print(check(packages, tag=args.tag))
        elif args.command == "build":
            built = build(packages, args.dir)
            print(f"{len(built)} distributions in {args.dir}, all checked")
        else:
            for requirement in third_party_requirements(packages):
                print(requirement)
    except ReleaseError as failure:
        prefix = "::error::" if os.environ.get("GITHUB_ACTIONS") == "true" else "error: "
        for line in failure.args:
            print(f"{prefix}{line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
