"""The README's and the quickstart's "try it" commands, run as a newcomer runs them.

Each shell block is taken from the page itself (so a changed page is what is
tested), run as written on loopback with this environment's packages, and must
succeed with the output the page shows, within a bound far above what the page
says it takes. What is not run, and why:

- the README's test command: it is the suite this test belongs to (CI runs it);
- ``python3 -m pip install ./packages/*``: the session that runs this test
  installed exactly these packages already.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"
CLI_GUIDE = ROOT / "docs" / "guides" / "cli.md"
#: The port the pages use.
DOCUMENTED_PORT = 29400
#: Far above what the pages show (a round in about a second, the demo in a few seconds),
#: and enough for a loaded 2-core machine.
BOUND = 120.0


def fenced_blocks(text: str, language: str) -> list[str]:
    """The bodies of the fenced blocks of ``language``, in page order."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def block_after(text: str, marker: str, language: str) -> str:
    """The first ``language`` block after ``marker`` on the page."""
    return fenced_blocks(text[text.index(marker) :], language)[0]


def commands(block: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blanks out."""
    joined = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]


def environment() -> dict[str, str]:
    """This interpreter's scripts (``tp-rdzv``, ``python``) first on PATH."""
    scripts = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", "")}


def run(
    command: str, cwd: Path, timeout: float = BOUND
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        command,
        shell=True,
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done, time.monotonic() - started


def run_together(command: str, count: int, cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """``command`` started ``count`` times at once (terminals side by side), all awaited."""
    processes = [
        subprocess.Popen(
            command,
            shell=True,
            cwd=cwd,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=BOUND)
        results.append(subprocess.CompletedProcess(command, process.returncode, out, err))
    return results


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def documented_store(tmp_path: Path) -> Iterator[str]:
    """``tp-rdzv store --port 29400`` as the quickstart starts it; stopped with Ctrl-C."""
    if not port_is_free(DOCUMENTED_PORT):
        pytest.fail(f"port {DOCUMENTED_PORT}, which the pages use, is taken on this machine")
    (store_command,) = [
        c
        for c in commands(block_after(QUICKSTART.read_text(), "Start a store", "sh"))
        if c.startswith("tp-rdzv store")
    ]
    store = subprocess.Popen(
        [*shlex.split(store_command), "--json"],
        cwd=tmp_path,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert store.stdout is not None
        line = store.stdout.readline()  # it says when it listens
        assert '"listening"' in line, (
            line,
            store.stderr.read() if store.poll() is not None else "",
        )
        yield f"127.0.0.1:{DOCUMENTED_PORT}"
    finally:
        store.send_signal(signal.SIGINT)
        store.communicate(timeout=BOUND)


def test_the_readme_main_command_runs_the_demo(tmp_path: Path) -> None:
    text = README.read_text()
    (line,) = commands(block_after(text, "<!-- main-command -->", ""))
    steps = [step.strip() for step in line.split("&&")]
    assert steps[0] == "python3 -m pip install ./packages/*", steps
    for step in steps[1:]:
        done, took = run(step, tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "tp-rdzv demo: OK" in done.stdout, done.stdout
        assert took < BOUND


def test_the_quickstart_node_example_forms_a_round_then_refuses_a_rerun(
    tmp_path: Path, documented_store: str
) -> None:
    text = QUICKSTART.read_text()
    (tmp_path / "node.py").write_text(block_after(text, "Save this as `node.py`", "python"))
    node_commands = [
        c for c in commands(block_after(text, "Start a store", "sh")) if c.startswith("python")
    ]
    assert node_commands == ["python node.py", "python node.py"], node_commands
    first = run_together(node_commands[0], len(node_commands), tmp_path)
    ranks = set()
    for done in first:
        assert done.returncode == 0, done.stderr
        greeting, hello = done.stdout.splitlines()
        found = re.fullmatch(r"rank (\d) of 2; participants: \[\S+, \S+\]", greeting)
        assert found, greeting
        ranks.add(int(found[1]))
        assert hello == f"hello from rank {1 - int(found[1])}"
    assert ranks == {0, 1}
    # What the page says a second run does: the first run's shutdown closed the run.
    again = run_together(node_commands[0], len(node_commands), tmp_path)
    for done in again:
        assert done.returncode != 0
        assert "RendezvousClosedError" in done.stderr, done.stderr


def test_the_cli_guide_join_example_forms_a_round_in_about_a_second(
    tmp_path: Path, documented_store: str
) -> None:
    example = commands(block_after(CLI_GUIDE.read_text(), "\n## join\n", "sh"))[0]
    assert example.startswith(f"tp-rdzv join --endpoint {documented_store} "), example
    agents = [
        subprocess.Popen(
            shlex.split(example),
            cwd=tmp_path,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        seconds = []
        for agent in agents:
            assert agent.stdout is not None
            line = agent.stdout.readline()
            found = re.match(r"round 0: rank [01] of 2 \((\d+\.\d+) s\); participants: ", line)
            assert found, line
            seconds.append(float(found[1]))
        # A round of 2 of at most 4 waits out the last call: the example's 1 s, not the
        # default 30 s (the later of the two agents spends about that in the rendezvous).
        assert min(seconds) < 15, seconds
    finally:
        closed, _ = run(f"tp-rdzv close --endpoint {documented_store} --run-id job1", tmp_path)
        for agent in agents:
            _, err = agent.communicate(timeout=BOUND)
            assert agent.returncode == 0, err
        assert closed.returncode == 0, closed.stderr
