"""Fuzz a live ``python -m tp_store`` server over the network.

Many connections send random and mutated frames (mutations of valid request
streams: bit flips, truncation, splicing, insertions, length-prefix
corruption, random opcodes, random bytes) while two well-behaved
:class:`~tp_store.TCPStore` clients keep doing round trips (set, get, add,
compare_set, check, wait, multi_set/multi_get, queues, a cross-client
blocking get) and check every answer. At the end the server must be alive and
answering, and the report says what happened::

    python tests/fuzz/fuzz_store_server.py --frames 100000 --seed 1 [--json]

Each fuzz connection draws its frames from its own generator, seeded by the
seed and the connection's number (plain ``random``, for speed), so runs with
one seed send the same frames on the same connection numbers; how many of a
connection's frames go out before the server closes it depends on timing. Importable:
:func:`run_fuzz` returns a :class:`FuzzReport`.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import tp_store
except ImportError:  # run from a checkout without installing: use the monorepo's source
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages" / "tp-store" / "src"))
    import tp_store

from tp_store.errors import StoreError, StoreTimeoutError
from tp_store.protocol import (
    EXTENSION_OFFER,
    MAX_SESSION_TIMEOUT_MS,
    Add,
    Append,
    Barrier,
    CancelWait,
    Check,
    CompareSet,
    DeleteKey,
    Get,
    GetNumKeys,
    ListKeys,
    MultiGet,
    MultiSet,
    Ping,
    QueueLen,
    QueuePop,
    QueuePush,
    Request,
    SessionClose,
    SessionCompareSet,
    SessionOpen,
    SessionSet,
    SessionWill,
    Set,
    Stats,
    Validate,
    Wait,
    WaitGet,
)
from tp_store.tcp_store import TCPStore

LISTENING = re.compile(r"^listening on (?:\[(?P<v6>[^\]]+)\]|(?P<v4>[^:]+)):(?P<port>\d+)$")
#: The server's summary of the warnings about bad connections it did not log.
SUPPRESSED = re.compile(r" tp_store\.server suppressed (\d+) more log line")
#: Seconds any single network step may take before it counts as a hang.
STEP_TIMEOUT = 30.0
_U64 = struct.Struct("<Q")
#: Lengths and counts a corrupted prefix takes: huge, just over PyTorch's limits, or random.
_HOSTILE_SIZES = (
    2**63,
    2**64 - 1,
    2**62,
    2**60,
    2**32,
    2**31,
    8 * 1024 * 1024 + 1,
    8 * 1024 * 1024,
    8 * 1024 + 1,
    128 * 1024 + 1,
    1000,
    0,
)


#: How hostile a connection is (the chance each of its frames is mutated), drawn per connection:
#: some stay valid long enough to reach deep states, others break at once.
_HOSTILITY = (0.0, 0.02, 0.1, 0.3, 0.6, 1.0)


@dataclasses.dataclass
class FuzzReport:
    """What a fuzz run did and what the server survived."""

    seed: int
    frames_requested: int
    frames_sent: int = 0
    bytes_sent: int = 0
    connections_opened: int = 0
    #: Connections the server closed (EOF or reset) while the fuzzer was still using them.
    connections_closed_by_server: int = 0
    #: "closing connection" lines in the server's log (every close the server chose).
    server_close_log_lines: int = 0
    #: The server's own count of connections it closed for protocol errors (its STATS).
    server_protocol_errors: int = 0
    #: Tracebacks and other unexpected lines in the server's log (must be empty).
    server_unexpected_log: list[str] = dataclasses.field(default_factory=list)
    #: 1 if the server process died or stopped answering, else 0.
    server_crashes: int = 0
    #: The exit code (negative: the signal) of a server that crashed; None otherwise.
    server_exit_code: int | None = None
    health_probes: int = 0
    health_probes_failed: int = 0
    wellbehaved_ops_done: int = 0
    wellbehaved_ops_failed: int = 0
    wellbehaved_failures: list[str] = dataclasses.field(default_factory=list)
    #: The slowest call of the well-behaved main client (seconds), and how many took over 1 s.
    wellbehaved_worst_call_s: float = 0.0
    wellbehaved_calls_over_1s: int = 0
    wellbehaved_call_p50_ms: float = 0.0
    wellbehaved_call_p99_ms: float = 0.0
    peak_server_rss_kib: int = 0
    final_server_rss_kib: int = 0
    elapsed_s: float = 0.0
    #: The run ended at its time budget (``seconds``) before ``frames_requested``.
    stopped_by_time: bool = False

    @property
    def ok(self) -> bool:
        return (
            self.server_crashes == 0
            and self.health_probes_failed == 0
            and self.wellbehaved_ops_failed == 0
            and not self.server_unexpected_log
            and (self.frames_sent >= self.frames_requested or self.stopped_by_time)
        )

    def summary(self) -> str:
        rows = [
            ("seed", self.seed),
            ("frames sent", f"{self.frames_sent} ({self.bytes_sent} bytes)"),
            ("connections opened", self.connections_opened),
            ("connections closed by the server", self.connections_closed_by_server),
            ("server 'closing connection' log lines", self.server_close_log_lines),
            ("server-counted protocol errors", self.server_protocol_errors),
            ("unexpected server log lines", len(self.server_unexpected_log)),
            ("server crashes", self.server_crashes),
            ("server exit code after a crash", self.server_exit_code),
            ("health probes failed", f"{self.health_probes_failed} of {self.health_probes}"),
            ("well-behaved ops done", self.wellbehaved_ops_done),
            ("well-behaved ops failed", self.wellbehaved_ops_failed),
            (
                "well-behaved call p50 / p99 / worst",
                f"{self.wellbehaved_call_p50_ms:.2f} ms / {self.wellbehaved_call_p99_ms:.2f} ms"
                f" / {self.wellbehaved_worst_call_s * 1e3:.1f} ms",
            ),
            ("well-behaved calls over 1 s", self.wellbehaved_calls_over_1s),
            ("peak server RSS (VmHWM)", f"{self.peak_server_rss_kib / 1024:.1f} MiB"),
            ("final server RSS", f"{self.final_server_rss_kib / 1024:.1f} MiB"),
            ("elapsed", f"{self.elapsed_s:.1f} s"),
            ("stopped at the time budget", "yes" if self.stopped_by_time else "no"),
            ("verdict", "OK" if self.ok else "FAILED"),
        ]
        width = max(len(name) for name, _ in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        lines += [f"  well-behaved failure: {text}" for text in self.wellbehaved_failures]
        lines += [f"  server log: {text}" for text in self.server_unexpected_log[:10]]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "ok": self.ok}, indent=2)


# ---------------------------------------------------------------------------
# The server process
# ---------------------------------------------------------------------------


class ServerProcess:
    """``python -m tp_store`` on an ephemeral loopback port, its log in a temporary file."""

    def __init__(self) -> None:
        env = dict(os.environ)
        src = str(Path(next(iter(tp_store.__path__))).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        self.log = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tp_store", "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], STEP_TIMEOUT)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        match = LISTENING.match(line)
        if match is None:
            self.stop()
            raise RuntimeError(f"the server did not start: banner {line!r}")
        self.port = int(match["port"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def memory_kib(self) -> tuple[int, int]:
        """(VmHWM, VmRSS) of the server in KiB, from /proc (0 where unavailable)."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return 0, 0
        values = dict(re.findall(r"^(VmHWM|VmRSS):\s+(\d+) kB", status, re.MULTILINE))
        return int(values.get("VmHWM", 0)), int(values.get("VmRSS", 0))

    def stop(self) -> str:
        """SIGTERM (SIGKILL after a while) and return the server's log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STEP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.seek(0)
        text = self.log.read().decode(errors="replace")
        self.log.close()
        return text


def probe(port: int) -> bool:
    """A fresh connection gets a PING answered within the step timeout."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=STEP_TIMEOUT) as sock:
            sock.sendall(Validate().encode() + Ping(0xF022).encode())
            answer = b""
            while len(answer) < 4:
                data = sock.recv(4 - len(answer))
                if not data:
                    return False
                answer += data
            return answer == struct.pack("<I", 0xF022)
    except OSError:
        return False


def final_protocol_errors(port: int) -> int:
    """The server's protocol-error count once every other connection is gone.

    A connection is dropped only after all it sent was served, so the count is
    final then, and must match the server's log line for line.
    """
    store = TCPStore("127.0.0.1", port, timeout=STEP_TIMEOUT)
    try:
        deadline = time.monotonic() + STEP_TIMEOUT
        while (stats := store.server_stats())["connections_open"] > 1:
            if time.monotonic() > deadline:
                break  # the report's mismatch with the log will tell
            time.sleep(0.01)
        return stats["connections_protocol_errors"]
    finally:
        store.close()


# ---------------------------------------------------------------------------
# Frames
# ---------------------------------------------------------------------------


class FrameMaker:
    """Valid requests and hostile mutations of them, from one seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.keys = [b"fz/%d" % i for i in range(48)] + [b"", b"fz/q"]
        self.counters = [b"fz/counter%d" % i for i in range(8)]
        #: Whether the last valid frame may park its connection (WAIT, WAIT_GET, BARRIER).
        self.parks = False
        self.makers: list[tuple[int, Callable[[], Request]]] = [
            (12, lambda: Set(self.key(), self.value())),
            (10, lambda: Get(self.key())),
            (8, lambda: Add(self.counter(), self.delta())),
            (5, lambda: CompareSet(self.key(), self.value(), self.value())),
            (5, lambda: Check(self.key_tuple())),
            (4, lambda: Wait(self.key_tuple())),
            (3, lambda: WaitGet(self.key_tuple())),
            (3, GetNumKeys),
            (5, lambda: DeleteKey(self.key())),
            (5, lambda: Append(self.key(), self.value())),
            (4, lambda: MultiGet(self.key_tuple())),
            (
                4,
                lambda: MultiSet(
                    tuple((self.key(), self.value()) for _ in range(rng.randint(0, 4)))
                ),
            ),
            (4, CancelWait),
            (6, lambda: Ping(rng.getrandbits(32))),
            # STATS is refused until a PING offers the extensions: send both.
            (2, lambda: Ping(EXTENSION_OFFER)),
            (2, Stats),
            (4, lambda: QueuePush(self.key(), self.value())),
            (4, lambda: QueuePop(self.key())),
            (3, lambda: QueueLen(self.key())),
            (1, ListKeys),
            (2, lambda: Barrier(self.counter(), rng.randint(-1, 4))),
            # Store sessions (after the extension offer above): valid timeouts are
            # long, so no session expires while the fuzzer runs.
            (2, lambda: SessionOpen(self.session_timeout())),
            (2, lambda: SessionSet(self.key(), self.value())),
            (1, lambda: SessionCompareSet(self.key(), self.value(), self.value())),
            (2, lambda: SessionWill(self.key(), self.value())),
            (1, SessionClose),
            (1, lambda: Validate(rng.choice([0x3C85F7CE, rng.getrandbits(32)]))),
        ]
        self._weights = [weight for weight, _ in self.makers]
        self._mutations: list[Callable[[bytes], bytes]] = [
            self.flip_bits,
            self.truncate,
            self.splice,
            self.corrupt_length,
            self.random_opcode,
            self.insert_bytes,
            self.random_bytes,
            self.drop_bytes,
        ]

    def key(self) -> bytes:
        rng = self.rng
        if rng.random() < 0.03:
            return rng.randbytes(rng.randint(0, 40))
        return rng.choice(self.keys)

    def item(self) -> tuple[bytes, bytes]:
        return self.key(), self.value()

    def counter(self) -> bytes:
        """A key ADD and BARRIER use: a counter, rarely any key (non-integers close)."""
        return self.key() if self.rng.random() < 0.05 else self.rng.choice(self.counters)

    def key_tuple(self) -> tuple[bytes, ...]:
        return tuple(self.key() for _ in range(self.rng.randint(0, 4)))

    def value(self) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.3:
            return str(rng.randint(-1000, 1000)).encode()  # counters stay addable, mostly
        if roll < 0.98:
            return rng.randbytes(rng.randint(0, 48))
        return rng.randbytes(rng.randint(1000, 16 * 1024))

    def session_timeout(self) -> int:
        """SESSION_OPEN's timeout in ms: an hour or more, or out of range."""
        rng = self.rng
        if rng.random() < 0.2:
            return rng.choice([0, -1, -(2**63), MAX_SESSION_TIMEOUT_MS + 1, 2**63 - 1])
        return rng.randint(3_600_000, MAX_SESSION_TIMEOUT_MS)

    def delta(self) -> int:
        rng = self.rng
        if rng.random() < 0.02:
            return rng.choice([2**63 - 1, -(2**63), 2**62])
        return rng.randint(-100, 100)

    def valid(self) -> bytes:
        maker = self.rng.choices(self.makers, weights=self._weights)[0][1]
        request = maker()
        self.parks = isinstance(request, (Wait, WaitGet, Barrier))
        return request.encode()

    def frame(self, hostility: float = 0.5) -> bytes:
        """A valid request, or with probability ``hostility`` a mutated one."""
        frame = self.valid()
        if self.rng.random() >= hostility:
            return frame
        self.parks = False
        return self.rng.choice(self._mutations)(frame)

    # -- mutations ------------------------------------------------------------
    def flip_bits(self, frame: bytes) -> bytes:
        data = bytearray(frame)
        for _ in range(self.rng.randint(1, 3)):
            data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
        return bytes(data)

    def truncate(self, frame: bytes) -> bytes:
        return frame[: self.rng.randrange(len(frame))] if len(frame) > 1 else b""

    def splice(self, frame: bytes) -> bytes:
        other = self.valid()
        return frame[: self.rng.randint(0, len(frame))] + other[self.rng.randint(0, len(other)) :]

    def corrupt_length(self, frame: bytes) -> bytes:
        rng = self.rng
        # Offset 1 holds the first length or count of most requests; else anywhere.
        offset = 1 if rng.random() < 0.6 or len(frame) < 9 else rng.randrange(len(frame) - 7)
        size = rng.choice(_HOSTILE_SIZES) if rng.random() < 0.8 else rng.getrandbits(64)
        return frame[:offset] + _U64.pack(size) + frame[offset + 8 :]

    def random_opcode(self, frame: bytes) -> bytes:
        return bytes([self.rng.randrange(256)]) + frame[1:]

    def insert_bytes(self, frame: bytes) -> bytes:
        at = self.rng.randint(0, len(frame))
        return frame[:at] + self.rng.randbytes(self.rng.randint(1, 16)) + frame[at:]

    def drop_bytes(self, frame: bytes) -> bytes:
        at = self.rng.randrange(len(frame))
        return frame[:at] + frame[at + self.rng.randint(1, 8) :]

    def random_bytes(self, frame: bytes) -> bytes:
        return self.rng.randbytes(self.rng.randint(1, 64))


# ---------------------------------------------------------------------------
# Well-behaved clients
# ---------------------------------------------------------------------------


class TimedStore:
    """A store whose every call is timed into :attr:`durations` (seconds)."""

    def __init__(self, store: TCPStore) -> None:
        self.untimed = store
        self.durations: list[float] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.untimed, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.durations.append(time.perf_counter() - began)

        return timed


class WellBehaved:
    """Two TCPStore clients checking every answer while the fuzzer runs; the main
    one's calls are timed (the cross one blocks on purpose)."""

    def __init__(self, port: int, seed: int) -> None:
        self.port = port
        self.rng = random.Random(seed ^ 0x5EED)
        self.prefix = f"wb-{uuid.UUID(int=self.rng.getrandbits(128)).hex}"
        self.stop = threading.Event()
        #: Set once the main client has done one whole round of its calls.
        self.running = threading.Event()
        self.lock = threading.Lock()
        self.done = 0
        self.failures: list[str] = []
        self.failed = 0
        self.main_adds = 0
        self.cross_adds = 0
        self.last_seq = -1
        self.durations: list[float] = []
        self.threads = [
            threading.Thread(target=self._guard, args=(self._main,), name="wb-main", daemon=True),
            threading.Thread(target=self._guard, args=(self._cross,), name="wb-cross", daemon=True),
        ]

    def start(self) -> None:
        """Start both clients; returns once the main one has done a whole round.

        Else a short fuzz run on a loaded machine could end before the main
        client's first call, and the final check would look for keys it never
        wrote.
        """
        for thread in self.threads:
            thread.start()
        if not self.running.wait(STEP_TIMEOUT):
            self.fail(f"the main client did not finish a round within {STEP_TIMEOUT:g} s")

    def finish(self, server_alive: Callable[[], bool]) -> None:
        self.stop.set()
        main, cross = self.threads
        self._join(main)
        if not server_alive():  # nothing to release or check, and connects would retry
            self._join(cross)
            return
        # The cross client may be blocked on the next sequence key: release it.
        try:
            store = self._store()
            store.set(f"{self.prefix}/seq{self.last_seq + 1}", b"end")
            store.close()
        except StoreError as exc:
            self.fail(f"releasing the cross client: {exc}")
        self._join(cross)
        self._final_check()

    def _join(self, thread: threading.Thread) -> None:
        thread.join(STEP_TIMEOUT * 2)
        if thread.is_alive():
            self.fail(f"{thread.name} did not finish")

    # -- bookkeeping -------------------------------------------------------------
    def ok(self) -> None:
        with self.lock:
            self.done += 1

    def fail(self, message: str) -> None:
        with self.lock:
            self.failed += 1
            if len(self.failures) < 10:
                self.failures.append(message)

    def check(self, what: str, got: object, expected: object) -> None:
        if got == expected:
            self.ok()
        else:
            self.fail(f"{what}: got {got!r}, expected {expected!r}")

    def _guard(self, body: Callable[[], None]) -> None:
        try:
            body()
        except Exception as exc:  # any escape is a failure of the server under test
            self.fail(f"{threading.current_thread().name} raised {type(exc).__name__}: {exc}")

    def _store(self) -> TCPStore:
        return TCPStore("127.0.0.1", self.port, timeout=STEP_TIMEOUT)

    # -- the two clients ---------------------------------------------------------
    def _main(self) -> None:
        store = TimedStore(self._store())
        self.durations = store.durations
        p = self.prefix
        counter = 0
        i = 0
        try:
            while not self.stop.is_set():
                key, value = f"{p}/k{i % 16}", f"v{i}-{self.rng.getrandbits(32)}".encode()
                store.set(key, value)
                self.check("get after set", store.get(key), value)
                counter += 3
                self.check("add", store.add(f"{p}/counter", 3), counter)
                store.add(f"{p}/shared", 1)
                self.main_adds += 1
                self.ok()
                self.check("compare_set hit", store.compare_set(key, value, b"cas"), b"cas")
                self.check("compare_set miss", store.compare_set(key, b"nope", b"x"), b"cas")
                self.check("check present", store.check([key]), True)
                self.check("check missing", store.check([key, f"{p}/missing"]), False)
                store.wait([key])
                self.ok()
                keys = [f"{p}/m{i}/{j}" for j in range(3)]
                values = [b"%d" % (i * 10 + j) for j in range(3)]
                store.multi_set(keys, values)
                self.check("multi_get", store.multi_get(keys), values)
                for k in keys:
                    store.delete_key(k)
                store.append(f"{p}/log", b"%d," % i)
                store.queue_push(f"{p}/q", value)
                self.check("queue_pop", store.queue_pop(f"{p}/q", block=False), value)
                if i % 25 == 0:
                    self._session_round(store.untimed, i)
                    stats = store.server_stats()
                    self.check("stats count this client", stats["connections_open"] >= 1, True)
                    try:
                        store.untimed.wait([f"{p}/never"], 0.05)
                    except StoreTimeoutError:
                        self.ok()
                    else:
                        self.fail("wait on a missing key returned")
                    self.check("ping after cancelled wait", store.check([key]), True)
                store.set(f"{p}/seq{i}", f"seq-{i}")
                self.last_seq = i
                self.ok()
                self.running.set()
                i += 1
        finally:
            store.close()

    def _session_round(self, store: TCPStore, i: int) -> None:
        """A store session's key, deleted when it closes; its will, pushed then."""
        p = self.prefix
        with store.open_session(STEP_TIMEOUT) as session:
            session.set(f"{p}/present{i}", b"here")
            session.add_will(f"{p}/departures", b"gone%d" % i)
            self.check("session key", store.get(f"{p}/present{i}"), b"here")
        self.check("session key after close", store.check([f"{p}/present{i}"]), False)
        self.check("will", store.queue_pop(f"{p}/departures", block=False), b"gone%d" % i)

    def _cross(self) -> None:
        """Blocking gets of keys the main client sets: the server's wake path under fuzz."""
        store = self._store()
        p = self.prefix
        j = 0
        try:
            while (value := store.get(f"{p}/seq{j}")) != b"end":
                self.check("blocking get", value, f"seq-{j}".encode())
                store.add(f"{p}/shared", 1)
                self.cross_adds += 1
                self.ok()
                j += 1
        finally:
            store.close()

    def _final_check(self) -> None:
        try:
            store = self._store()
        except StoreError as exc:
            self.fail(f"final connect: {exc}")
            return
        try:
            expected = self.main_adds + self.cross_adds
            self.check("shared counter", store.add(f"{self.prefix}/shared", 0), expected)
            log = store.get(f"{self.prefix}/log")
            self.check("append log", log.count(b","), self.last_seq + 1)
        except StoreError as exc:
            self.fail(f"final check: {exc}")
        finally:
            store.close()


# ---------------------------------------------------------------------------
# The fuzzer
# ---------------------------------------------------------------------------


class _Conn:
    """A fuzz connection; its frames come from its own generator, seeded by its number."""

    __slots__ = ("frames_left", "hostility", "maker", "sock")

    def __init__(self, sock: socket.socket, seed: int, number: int, max_frames: int) -> None:
        self.sock = sock
        rng = random.Random(f"{seed}/{number}")
        self.maker = FrameMaker(rng)
        self.frames_left = rng.randint(1, max_frames)
        #: The chance that a frame on this connection is mutated.
        self.hostility = rng.choice(_HOSTILITY)


def run_fuzz(
    frames: int = 10_000,
    seed: int = 1,
    *,
    connections: int = 16,
    max_frames_per_connection: int = 40,
    probe_every: int = 5_000,
    progress: Callable[[str], None] | None = None,
    seconds: float | None = None,
) -> FuzzReport:
    """Start a server, fuzz it with ``frames`` frames (or for ``seconds``), and report."""
    report = FuzzReport(seed=seed, frames_requested=frames)
    pick = random.Random(seed)  # which connection sends next
    numbers = itertools.count()
    started = time.monotonic()
    server = ServerProcess()
    wellbehaved = WellBehaved(server.port, seed)
    pool: list[_Conn] = []
    hung = threading.Event()

    def sample_memory() -> None:
        peak, current = server.memory_kib()  # zeros once the process is gone
        report.peak_server_rss_kib = max(report.peak_server_rss_kib, peak)
        if current:
            report.final_server_rss_kib = current

    def open_conn() -> _Conn | None:
        try:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=STEP_TIMEOUT)
        except OSError:
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        report.connections_opened += 1
        conn = _Conn(sock, seed, next(numbers), max_frames_per_connection)
        # Most connections start properly; some open with a hostile first frame.
        first = Validate().encode() if conn.maker.rng.random() < 0.92 else conn.maker.frame()
        send(conn, first)
        return conn

    def server_closed(conn: _Conn) -> None:
        report.connections_closed_by_server += 1
        conn.sock.close()
        conn.frames_left = 0

    def send(conn: _Conn, frame: bytes) -> None:
        report.frames_sent += 1
        report.bytes_sent += len(frame)
        pieces = [frame]
        rng = conn.maker.rng
        if len(frame) > 2 and rng.random() < 0.1:  # split across segments
            cut = rng.randrange(1, len(frame))
            pieces = [frame[:cut], frame[cut:]]
        try:
            for piece in pieces:
                conn.sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            server_closed(conn)
        except TimeoutError:
            hung.set()  # the server stopped reading for STEP_TIMEOUT seconds
            conn.sock.close()
            conn.frames_left = 0

    def drain() -> None:
        socks = {conn.sock: conn for conn in pool if conn.frames_left > 0}
        if not socks:
            return
        readable, _, _ = select.select(list(socks), [], [], 0)
        for sock in readable:
            try:
                data = sock.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            if not data:
                server_closed(socks[sock])

    def refill() -> bool:
        for index, conn in enumerate(pool):
            if conn.frames_left <= 0:
                conn.sock.close()
                fresh = open_conn()
                if fresh is None:
                    return False
                pool[index] = fresh
        while len(pool) < connections:
            fresh = open_conn()
            if fresh is None:
                return False
            pool.append(fresh)
        return True

    next_drain, next_probe = 8, probe_every
    try:
        wellbehaved.start()
        while report.frames_sent < frames and not hung.is_set():
            if seconds is not None and time.monotonic() - started >= seconds:
                report.stopped_by_time = True
                break
            if not refill():
                report.server_crashes = 1
                break
            conn = pick.choice(pool)
            maker = conn.maker
            if conn.frames_left > 0:
                send(conn, maker.frame(conn.hostility))
                conn.frames_left -= 1
                if maker.parks and conn.frames_left > 0 and maker.rng.random() < 0.7:
                    # Usually cancel a wait that may be parked, as a timed-out client does.
                    send(conn, CancelWait().encode())
                    conn.frames_left -= 1
            if report.frames_sent >= next_drain:
                drain()
                next_drain = report.frames_sent + 8
            if probe_every and report.frames_sent >= next_probe:
                next_probe += probe_every
                report.health_probes += 1
                if not probe(server.port):
                    report.health_probes_failed += 1
                    hung.set()
                sample_memory()
                if progress:
                    progress(
                        f"{report.frames_sent} frames, {report.connections_opened} connections"
                    )
            if not server.alive():
                report.server_crashes = 1
                break
    finally:
        for conn in pool:
            conn.sock.close()
        wellbehaved.finish(server.alive)
        report.health_probes += 1
        if not probe(server.port):
            report.health_probes_failed += 1
            hung.set()
        if server.alive() and not hung.is_set():
            report.server_protocol_errors = final_protocol_errors(server.port)
        if hung.is_set():  # alive but not answering counts as a crash
            report.server_crashes = 1
        if not server.alive():
            report.server_crashes = 1
        sample_memory()
        log = server.stop()
        report.server_exit_code = server.proc.returncode if report.server_crashes else None
    report.wellbehaved_ops_done = wellbehaved.done
    report.wellbehaved_ops_failed = wellbehaved.failed
    report.wellbehaved_failures = wellbehaved.failures
    durations = sorted(wellbehaved.durations)
    if durations:
        report.wellbehaved_worst_call_s = durations[-1]
        report.wellbehaved_calls_over_1s = sum(1 for d in durations if d > 1.0)
        report.wellbehaved_call_p50_ms = durations[len(durations) // 2] * 1e3
        report.wellbehaved_call_p99_ms = durations[int(len(durations) * 0.99)] * 1e3
    for line in log.splitlines():
        if " tp_store.server closing connection from " in line:
            report.server_close_log_lines += 1
        elif suppressed := SUPPRESSED.search(line):  # closing lines the server throttled
            report.server_close_log_lines += int(suppressed[1])
        elif line.strip():
            report.server_unexpected_log.append(line[:300])
    report.elapsed_s = time.monotonic() - started
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="frames to send")
    parser.add_argument(
        "--seconds", type=float, default=None, help="stop after this long, even short of --frames"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the frame generator")
    parser.add_argument("--connections", type=int, default=16, help="concurrent fuzz connections")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    report = run_fuzz(
        args.frames,
        args.seed,
        connections=args.connections,
        progress=None if args.quiet else progress,
        seconds=args.seconds,
    )
    print(report.to_json() if args.json else report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
