"""One dynamic-rendezvous node in its own process, driven line by line.

Run as a script, it builds one handler with ``tp_rdzv_api.create_handler`` from
a JSON spec (the first argument, or the ``TP_DYNAMIC_NODE_SPEC`` environment
variable), prints a ``{"event": "ready", ...}`` line, then obeys one command
per stdin line and answers each with exactly one JSON line on stdout:

=============  ==========================================================
``next``       ``next_rendezvous()``: rank, world_size, participants (as
               ``str``), wait_list, bootstrap ``[addr, port]``, round (the
               handler's ``round`` where it has one), elapsed s
``change S``   ``wait_for_change(S)`` as ``value`` (S: seconds)
``waiting``    ``num_nodes_waiting()`` as ``value``
``closed?``    ``is_closed()`` as ``value``
``close``      ``set_closed()``
``shutdown``   ``shutdown()`` as ``value``
``exchange``   every participant of the last round writes its id through
               ``RendezvousInfo.store`` and reads everyone's (``seen``)
``info``       pid, wall clocks (``time``, ``datetime_now``, ``utcnow``)
``exit``       answers, then leaves at once (``os._exit``)
=============  ==========================================================

A failed call answers ``{"error": ExceptionClassName, "message": ...}`` (plus
``joined``/``min_nodes`` for ``RendezvousExhaustedError``). Every answer
carries ``cmd``, ``seq`` and ``pid``. Only protocol lines go to stdout;
anything else the process prints goes to stderr.

Spec keys: ``backend`` (default ``core``), ``endpoint``, ``run_id``,
``min_nodes``, ``max_nodes``, ``local_addr``, ``node_rank`` (optional),
``config`` (the ``RendezvousParameters`` config), ``clock_skew`` (seconds;
also ``TP_DYNAMIC_NODE_CLOCK_SKEW``), ``log_level`` (e.g. ``DEBUG``, logs to
stderr), ``log_file`` (logs to this file instead) and ``log_format`` (``text``,
or ``json``: one object per line with ``time``, ``level``, ``logger``,
``message`` and every ``extra`` field, such as the structured events'
``action``, ``round`` and ``participants_digest``). A non-zero ``clock_skew``
shifts this process's wall clock (``time.time``, ``time.time_ns``,
``datetime.now``/``utcnow``/``today``) *before* anything of ``tp_rdzv_*`` is
imported, to play a host whose clock is wrong; ``time.monotonic`` is left alone.

Imported as a module (by the tests), it offers :class:`NodeProcess`, the
parent's handle on one such process. The module imports only the standard
library at the top, so the skew is in place before the package loads.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

SPEC_ENV = "TP_DYNAMIC_NODE_SPEC"
SKEW_ENV = "TP_DYNAMIC_NODE_CLOCK_SKEW"
SCRIPT = Path(__file__).resolve()


# ---------------------------------------------------------------------------
# Child side.
# ---------------------------------------------------------------------------


def skew_wall_clock(offset: float) -> None:
    """Shift this process's wall clock by ``offset`` seconds (monotonic untouched)."""
    import datetime as dt

    real_time = time.time
    real_time_ns = time.time_ns
    offset_ns = round(offset * 1e9)
    delta = dt.timedelta(seconds=offset)

    def skewed_time() -> float:
        return real_time() + offset

    def skewed_time_ns() -> int:
        return real_time_ns() + offset_ns

    time.time = skewed_time
    time.time_ns = skewed_time_ns

    real_datetime = dt.datetime

    class _SkewedMeta(type):
        # Plain datetime objects (from arithmetic, parsing) still count as datetimes.
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, real_datetime)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, real_datetime)

    def _rebuild(cls: type, value: dt.datetime) -> Any:
        return cls(
            value.year,
            value.month,
            value.day,
            value.hour,
            value.minute,
            value.second,
            value.microsecond,
            value.tzinfo,
            fold=value.fold,
        )

    class SkewedDatetime(real_datetime, metaclass=_SkewedMeta):
        """``datetime.datetime`` whose "now" is ``offset`` seconds off."""

        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Any:
            return _rebuild(cls, real_datetime.now(tz) + delta)

        @classmethod
        def utcnow(cls) -> Any:
            return _rebuild(cls, real_datetime.now(dt.timezone.utc).replace(tzinfo=None) + delta)

        @classmethod
        def today(cls) -> Any:
            return cls.now()

    dt.datetime = SkewedDatetime  # type: ignore[misc]


def _load_spec(argv: list[str]) -> dict[str, Any]:
    raw = argv[1] if len(argv) > 1 else os.environ.get(SPEC_ENV)
    if not raw:
        raise SystemExit(f"usage: {argv[0]} '<json spec>'  (or set {SPEC_ENV})")
    spec = json.loads(raw)
    if not isinstance(spec, dict):
        raise SystemExit(f"the node spec must be a JSON object, got {raw!r}")
    return spec


def _error(exc: BaseException) -> dict[str, Any]:
    answer: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    for name in ("joined", "min_nodes"):
        value = getattr(exc, name, None)
        if isinstance(value, int):
            answer[name] = value
    return answer


def _configure_logging(spec: dict[str, Any]) -> None:
    """Log at ``log_level`` to stderr or ``log_file``, as text or JSON lines."""
    import logging

    style = spec.get("log_format", "text")
    if style not in ("text", "json"):
        raise SystemExit(f"log_format must be text or json, got {style!r}")
    path = spec.get("log_file")
    # A file handler flushes every record: a node killed with SIGKILL loses at
    # most the line being written, which readers of the file skip.
    handler: logging.Handler = (
        logging.StreamHandler(sys.stderr) if not path else logging.FileHandler(path)
    )
    if style == "json":
        standard = set(vars(logging.LogRecord("", 0, "", 0, "", None, None)))
        standard |= {"message", "asctime", "taskName"}

        class JsonLines(logging.Formatter):
            def format(self, record: logging.LogRecord) -> str:
                document: dict[str, Any] = {
                    "time": record.created,
                    "pid": record.process,
                    "level": record.levelname,
                    "logger": record.name,
                    "thread": record.threadName,
                    "message": record.getMessage(),
                }
                for name, value in vars(record).items():
                    if name not in standard and not name.startswith("_"):
                        document[name] = value
                return json.dumps(document, default=str)

        handler.setFormatter(JsonLines())
    else:
        handler.setFormatter(
            logging.Formatter(
                f"%(relativeCreated)8.0f {os.getpid()} %(threadName)s %(name)s: %(message)s"
            )
        )
    logging.basicConfig(level=str(spec["log_level"]).upper(), handlers=[handler])


def main(argv: list[str]) -> int:
    """Build the handler, then answer commands until ``exit`` or end of input."""
    spec = _load_spec(argv)
    skew = float(spec.get("clock_skew") or os.environ.get(SKEW_ENV) or 0)
    if skew:
        skew_wall_clock(skew)

    # Only protocol lines go to the real stdout.
    out: IO[str] = sys.stdout
    sys.stdout = sys.stderr
    seq = 0

    def emit(answer: dict[str, Any]) -> None:
        answer.setdefault("pid", os.getpid())
        answer["seq"] = seq
        out.write(json.dumps(answer) + "\n")
        out.flush()

    if spec.get("log_level"):
        _configure_logging(spec)

    import datetime as dt
    import hashlib
    import warnings

    import tp_rdzv_api

    started = time.monotonic()
    try:
        extra: dict[str, Any] = {}
        if "node_rank" in spec:
            extra["node_rank"] = spec["node_rank"]
        params = tp_rdzv_api.RendezvousParameters(
            spec.get("backend", "core"),
            spec["endpoint"],
            spec["run_id"],
            min_nodes=spec.get("min_nodes"),
            max_nodes=spec.get("max_nodes"),
            local_addr=spec.get("local_addr"),
            config=dict(spec.get("config", {})),
            **extra,
        )
        handler = tp_rdzv_api.create_handler(params)
    except Exception as exc:
        emit({"event": "ready", **_error(exc), "elapsed": time.monotonic() - started})
        return 2
    emit(
        {
            "event": "ready",
            "backend": handler.get_backend(),
            "run_id": handler.get_run_id(),
            "time": time.time(),
            "elapsed": time.monotonic() - started,
        }
    )

    last: Any = None
    for line in sys.stdin:
        command = line.strip()
        if not command:
            continue
        seq += 1
        answer: dict[str, Any] = {"cmd": command}
        began = time.monotonic()
        try:
            if command == "next":
                info = handler.next_rendezvous()
                last = info
                bootstrap = info.bootstrap_store_info
                answer.update(
                    rank=info.rank,
                    world_size=info.world_size,
                    participants=[str(node) for node in info.participants],
                    wait_list=[str(node) for node in info.wait_list],
                    bootstrap=None
                    if bootstrap is None
                    else [bootstrap.master_addr, bootstrap.port],
                    round=getattr(handler, "round", None),
                )
            elif command.startswith("change "):
                answer["value"] = handler.wait_for_change(float(command.split()[1]))
            elif command == "waiting":
                answer["value"] = handler.num_nodes_waiting()
            elif command == "closed?":
                answer["value"] = handler.is_closed()
            elif command == "close":
                handler.set_closed()
            elif command == "shutdown":
                answer["value"] = handler.shutdown()
            elif command == "exchange":
                if last is None:
                    raise RuntimeError("exchange needs a completed next first")
                names = [str(node) for node in last.participants]
                tag = hashlib.sha1(json.dumps(names).encode()).hexdigest()[:12]
                keys = [f"exchange/{tag}/{rank}" for rank in range(last.world_size)]
                last.store.set(keys[last.rank], names[last.rank])
                last.store.wait(keys, dt.timedelta(seconds=30))
                answer["seen"] = [last.store.get(key).decode() for key in keys]
            elif command == "info":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    utcnow = dt.datetime.utcnow().replace(tzinfo=dt.timezone.utc).timestamp()
                answer.update(
                    time=time.time(),
                    time_ns=time.time_ns(),
                    datetime_now=dt.datetime.now().timestamp(),
                    utcnow=utcnow,
                )
            elif command == "exit":
                emit(answer)
                sys.stderr.flush()
                os._exit(0)
            else:
                raise ValueError(f"unknown command {command!r}")
        except Exception as exc:
            answer.update(_error(exc))
        answer["elapsed"] = time.monotonic() - began
        emit(answer)
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------------------
# Parent side.
# ---------------------------------------------------------------------------


class NodeProcess:
    """The test's handle on one node process: send commands, read answers with deadlines.

    Every answer read gets ``_arrived``: the parent's ``time.monotonic()`` when
    its line came in. Reads never block past their timeout; a timeout or the
    child's death is an ``AssertionError`` carrying the child's stderr tail.
    """

    def __init__(self, name: str, spec: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.spec = spec
        self.ready: dict[str, Any] = {}
        #: ``str()`` of this node in the participants of its last round (set by the tests).
        self.node_id: str | None = None
        child_env = dict(os.environ)
        child_env["PYTHONUNBUFFERED"] = "1"
        child_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=child_env,
        )
        self.pid = self.proc.pid
        self._answers: queue.Queue[tuple[float, dict[str, Any] | None]] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=300)
        self._gone = False
        self._threads = [
            threading.Thread(target=target, name=f"{name}-{target.__name__}", daemon=True)
            for target in (self._pump_stdout, self._pump_stderr)
        ]
        for thread in self._threads:
            thread.start()

    def __repr__(self) -> str:
        return f"<node {self.name} pid={self.pid}>"

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            arrived = time.monotonic()
            try:
                answer = json.loads(raw)
            except ValueError:
                answer = {"error": "Garbage", "message": raw}
            self._answers.put((arrived, answer))
        self._answers.put((time.monotonic(), None))

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self._stderr.append(raw.rstrip("\n"))

    def stderr_tail(self, lines: int = 40) -> str:
        """The last lines the child wrote to stderr."""
        tail = list(self._stderr)[-lines:]
        return "\n".join(tail) if tail else "(nothing on stderr)"

    def describe(self) -> str:
        """Who this is and how it is doing, for assertion messages."""
        code = self.proc.poll()
        state = "running" if code is None else f"exited with {code}"
        return f"{self.name} (pid {self.pid}, {state}); stderr tail:\n{self.stderr_tail()}"

    def send(self, command: str) -> None:
        """Write one command line (does not wait for the answer)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise AssertionError(f"cannot send {command!r}: {self.describe()}") from exc

    def poll(self, timeout: float) -> dict[str, Any] | None:
        """The next answer, or ``None`` if none came within ``timeout`` seconds."""
        if self._gone:
            raise AssertionError(f"no more answers: {self.describe()}")
        try:
            arrived, answer = self._answers.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        if answer is None:
            self._gone = True
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            raise AssertionError(f"the node went away without answering: {self.describe()}")
        answer["_arrived"] = arrived
        return answer

    def read(self, timeout: float, what: str = "an answer") -> dict[str, Any]:
        """The next answer; ``AssertionError`` if none comes within ``timeout`` seconds."""
        answer = self.poll(timeout)
        if answer is None:
            raise AssertionError(
                f"{what} from {self.name} did not come in {timeout:g} s: {self.describe()}"
            )
        return answer

    def request(self, command: str, timeout: float = 30.0) -> dict[str, Any]:
        """Send ``command`` and read its answer."""
        self.send(command)
        return self.read(timeout, f"the answer to {command!r}")

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        """Read the ``ready`` line; fail if the handler could not be built."""
        answer = self.read(timeout, "the ready line")
        assert answer.get("event") == "ready", f"{self.name}: expected ready, got {answer}"
        assert "error" not in answer, f"{self.name} could not build its handler: {answer}"
        self.ready = answer
        return answer

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.proc.poll() is None

    def pause(self) -> None:
        """Freeze the process (``SIGSTOP``): its sockets stay open, it answers nothing."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a frozen process go on (``SIGCONT``)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """``kill -9`` the process and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, grace: float = 0.0) -> None:
        """Ask the process to exit, kill it if it has not within ``grace`` seconds."""
        if self.alive():
            with contextlib.suppress(Exception):
                self.send("exit")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        if self.alive():
            self.kill()
        for thread in self._threads:
            thread.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))


class NodeFleet:
    """The node processes one test started: :meth:`close` makes sure none outlives it."""

    def __init__(self) -> None:
        self.nodes: list[NodeProcess] = []

    def spawn(
        self, name: str, spec: dict[str, Any], env: dict[str, str] | None = None
    ) -> NodeProcess:
        """Start a node process; returns at once, without waiting for its ``ready`` line."""
        node = NodeProcess(name, spec, env)
        self.nodes.append(node)
        return node

    def close(self, grace: float = 2.0) -> None:
        """Ask every node to exit (idle nodes leave at once), then kill the rest."""
        for node in self.nodes:
            if node.alive():
                with contextlib.suppress(AssertionError):
                    node.send("exit")
        deadline = time.monotonic() + grace
        for node in self.nodes:
            node.stop(grace=max(0.0, deadline - time.monotonic()))
