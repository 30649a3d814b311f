"""``tp-rdzv status`` and ``close`` stay in the operator's hands whatever the store holds.

A store writer chooses the bytes at PyTorch's state key, which both commands
read first: they must end in one line, and Ctrl-C (SIGINT) must stop them in
every phase. Real ``tp-rdzv`` processes against a real store (or a listener
that never answers, for the phases that wait on the network).
"""

from __future__ import annotations

import base64
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from cli_support import TIMEOUT, Command, one_line_error, run_tp_rdzv, unique_run_id

from tp_rdzv_dynamic.testing import hash_bomb
from tp_store import TCPStore

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


#: A state of 700,000 empty sets (in bounds for size, not for what it builds).
SET_FLOOD = base64.b64encode(pickle.PROTO + b"\x04" + pickle.EMPTY_SET * 700_000)


@pytest.fixture
def run_with(store: str) -> Callable[[bytes], str]:
    """``run_with(value)``: a new run id whose PyTorch state key holds ``value``."""
    host, port = store.rsplit(":", 1)
    client = TCPStore(host, int(port), timeout=30)

    def write(value: bytes) -> str:
        run_id = unique_run_id()
        client.set(f"torch.rendezvous.{run_id}", value)
        return run_id

    return write


@pytest.mark.parametrize("command", ["status", "close"])
@pytest.mark.parametrize("value", [hash_bomb(), SET_FLOOD], ids=["hash-bomb", "set-flood"])
def test_a_hostile_pytorch_state_is_one_line_and_a_failure(store, run_with, command, value):
    run_id = run_with(value)
    result = run_tp_rdzv(command, "--endpoint", store, "--run-id", run_id)
    line = one_line_error(result, EXIT_FAILED)
    assert "is not a PyTorch c10d rendezvous state" in line
    assert len(line) < 1000


@pytest.fixture
def silent_store() -> Iterator[socket.socket]:
    """A listener on loopback that accepts connections and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(TIMEOUT)
        yield listener


def interrupted(command: Command) -> tuple[int, str, float]:
    """Send SIGINT; the exit code, stderr and the seconds the command took to exit."""
    sent = time.monotonic()
    command.signal(signal.SIGINT)
    code, err = command.wait()
    return code, err, time.monotonic() - sent


def assert_few_lines(err: str) -> None:
    assert "Traceback" not in err, err
    assert len(err.splitlines()) <= 2, err


@pytest.mark.parametrize("command", ["status", "close"])
@pytest.mark.parametrize("phase", ["connecting", "awaiting-a-reply"])
def test_ctrl_c_stops_a_command_waiting_on_the_store(tp_rdzv, silent_store, command, phase):
    port = silent_store.getsockname()[1]
    running = tp_rdzv(
        command, "--endpoint", f"127.0.0.1:{port}", "--run-id", "job", "--timeout", "600"
    )
    connection, _ = silent_store.accept()
    with connection:
        if phase == "awaiting-a-reply":
            connection.settimeout(TIMEOUT)
            assert connection.recv(1), "the command sent no request"
        code, err, seconds = interrupted(running)
    assert code == EXIT_INTERRUPTED, err
    assert_few_lines(err)
    print(f"{command} ({phase}) exited {seconds:.2f} s after SIGINT")


@pytest.mark.parametrize("command", ["status", "close"])
@pytest.mark.parametrize("delay", [0.0, 0.1, 0.3, 0.6, 1.0])
def test_ctrl_c_at_any_moment_ends_a_command_in_a_line(tp_rdzv, store, run_with, command, delay):
    # Starting, importing, connecting, reading, decoding the flood: wherever the
    # signal lands, the command ends cleanly (SIGINT before Python installs its
    # handler ends it at once, with no output).
    running = tp_rdzv(command, "--endpoint", store, "--run-id", run_with(SET_FLOOD))
    time.sleep(delay)  # where the signal lands, not a wait for something to happen
    code, err, seconds = interrupted(running)
    assert code in {EXIT_INTERRUPTED, EXIT_FAILED, -signal.SIGINT}, err
    if not in_python_start_up(err):
        assert_few_lines(err)
    print(f"{command} after {delay} s: exit {code}, {seconds:.2f} s after SIGINT")


def test_only_python_s_own_start_up_is_excused() -> None:
    # Seen in CI: SIGINT while CPython set up its standard streams.
    streams = (
        "Fatal Python error: init_sys_streams: can't initialize sys standard streams\n"
        "Python runtime state: core initialized\n"
        "Traceback (most recent call last):\n"
        '  File "<frozen codecs>", line 309, in __init__\n'
        "KeyboardInterrupt\n"
    )
    assert in_python_start_up(streams)
    # A traceback through a command's own code is never excused.
    ours = (
        "Traceback (most recent call last):\n"
        '  File "/x/site-packages/tp_rdzv_cli/cli.py", line 40, in run\n'
        "KeyboardInterrupt\n"
    )
    assert not in_python_start_up(ours)


def test_the_entry_module_loads_nothing_before_it_catches_ctrl_c() -> None:
    # What in_python_start_up excuses: loading tp_rdzv_cli.main itself, which must
    # import nothing beyond its package (the command's modules load under its guard).
    probe = (
        "import sys; before = set(sys.modules); import tp_rdzv_cli.main; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert set(loaded) <= {"tp_rdzv_cli", "tp_rdzv_cli.__about__", "tp_rdzv_cli.main"}, loaded


#: A frame in one of our import packages (an editable install's finder is not one).
_OUR_PACKAGE = re.compile(r"[/\\](tp_rdzv\w*|tp_store|tensorplay)[/\\]")
#: A frame of what Python loads before tp-rdzv's first statement of its own: the
#: module level of the entry module and its package (they import only ``sys``).
_ENTRY_LOADING = re.compile(
    r'[/\\]tp_rdzv_cli[/\\](__init__|__about__|main)\.py", line \d+, in <module>'
)
#: CPython's own fatal error when SIGINT lands in a step of its initialization
#: (``init_sys_streams``, ``init_import_site``, ...), as ``python -c pass`` reports.
_INIT_FAILED = re.compile(r"Fatal Python error: init_\w+: ")


def in_python_start_up(err: str) -> bool:
    """Whether SIGINT landed before any code of ours ran: while CPython initialized
    (a fatal error of its own naming the step, such as its standard streams or
    its ``site`` module, the ``.pth`` hooks of site-packages among its frames),
    or while it loaded ``tp-rdzv``'s entry module (``tp_rdzv_cli.main``, which imports
    nothing but ``sys`` before it catches Ctrl-C): a traceback in which every
    frame of ours is that module level."""
    lines = err.splitlines()
    frames = [line for line in lines if line.lstrip().startswith("File ")]
    ours = [frame for frame in frames if _OUR_PACKAGE.search(frame)]
    return (
        bool(lines)
        and (
            _INIT_FAILED.match(lines[0]) is not None
            or lines[0] == "Traceback (most recent call last):"
        )
        and lines[-1] == "KeyboardInterrupt"
        and all(_ENTRY_LOADING.search(frame) for frame in ours)
    )
