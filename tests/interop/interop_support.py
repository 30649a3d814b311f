"""Helpers of the interop suite: our server as a process, PyTorch in worker processes.

PyTorch's C++ store holds the GIL in some calls, so a torch client never runs
in the same process as one of our servers: our standalone server is a
``python -m tp_store`` child process, and every torch store (client or master)
lives in a ``torch_worker.py`` child driven over a pipe. Readiness is always
awaited (the server's ``listening on`` line, the worker's hello), never slept.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import pytest

import tp_store

HERE = Path(__file__).resolve().parent
WORKER_SCRIPT = HERE / "torch_worker.py"
#: How long a test waits for any single answer from a child process.
ANSWER_TIMEOUT = 30.0
#: The store timeout given to clients unless a test needs another.
STORE_TIMEOUT = 5.0
LISTENING = re.compile(r"^listening on (?:\[(?P<v6>[^\]]+)\]|(?P<v4>[^:]+)):(?P<port>\d+)$")


def child_env() -> dict[str, str]:
    """The environment of child processes: they import the same tp_store as we do."""
    env = dict(os.environ)
    src = str(Path(next(iter(tp_store.__path__))).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def read_line(stream: IO[str], timeout: float, what: str) -> str:
    """One line from a child's pipe, or a test failure after ``timeout`` seconds."""
    box: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: box.put(stream.readline()), daemon=True).start()
    try:
        return box.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"{what}: no line within {timeout} s")


# -- our standalone server ---------------------------------------------------


@dataclass
class OurServer:
    """A ``python -m tp_store`` child process and where it listens."""

    proc: subprocess.Popen[str]
    host: str
    port: int

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, f"our server died with code {self.proc.returncode}"

    def stop(self) -> int:
        """SIGTERM the server and return its exit code (it must stop promptly)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail("our server ignored SIGTERM for 10 s")


def start_our_server(host: str = "127.0.0.1", env: dict[str, str] | None = None) -> OurServer:
    """Start our standalone server on an ephemeral port and wait for its banner.

    ``env`` is the server's environment (default :func:`child_env`).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "tp_store", "--host", host, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env() if env is None else env,
    )
    assert proc.stdout is not None
    line = read_line(proc.stdout, ANSWER_TIMEOUT, "our server banner").strip()
    match = LISTENING.match(line)
    if match is None:
        proc.kill()
        proc.wait()
        pytest.fail(f"our server printed {line!r}, expected 'listening on HOST:PORT'")
    return OurServer(proc, match["v6"] or match["v4"], int(match["port"]))


# -- PyTorch in worker processes ---------------------------------------------


class RemoteError(Exception):
    """An exception raised by a call in a torch worker."""

    def __init__(self, type_name: str, mro: list[str], message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.mro = mro
        self.message = message

    def is_a(self, name: str) -> bool:
        """Whether the remote exception is an instance of the class ``name``."""
        return name in self.mro


def encode(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {"b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, timedelta):
        return {"td": value.total_seconds()}
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    return value


def decode(value: Any) -> Any:
    if isinstance(value, dict) and "b" in value:
        return base64.b64decode(value["b"])
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


class TorchWorker:
    """A child process holding torch stores; requests run in order, answers are futures."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        self._ids = itertools.count(1)
        self._hello: Future[Any] = Future()
        self._pending: dict[int, Future[Any]] = {0: self._hello}
        self._lock = threading.Lock()
        self._names = itertools.count()
        threading.Thread(target=self._read_answers, daemon=True).start()

    def ready(self) -> None:
        """Wait for the worker's hello (torch imported)."""
        self._hello.result(timeout=60)

    def _read_answers(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            answer = json.loads(line)
            with self._lock:
                future = self._pending.pop(answer["id"])
            if "error" in answer:
                error = answer["error"]
                future.set_exception(RemoteError(error["type"], error["mro"], error["message"]))
            else:
                future.set_result(decode(answer["ok"]))
        with self._lock:
            pending, self._pending = self._pending, {}
        for future in pending.values():
            future.set_exception(RuntimeError("torch worker exited"))

    def submit(self, op: str, **fields: Any) -> Future[Any]:
        """Send a request; its answer arrives in the returned future."""
        future: Future[Any] = Future()
        with self._lock:
            request_id = next(self._ids)
            self._pending[request_id] = future
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": request_id, "op": op, **encode(fields)}) + "\n")
        self.proc.stdin.flush()
        return future

    def request(self, op: str, **fields: Any) -> Any:
        return self.submit(op, **fields).result(timeout=ANSWER_TIMEOUT)

    def store_async(
        self, *, listen_fd: bool = False, **kwargs: Any
    ) -> tuple[TorchStore, Future[Any]]:
        """Create a ``torch.distributed.TCPStore`` without waiting for its constructor."""
        if "timeout" in kwargs and not isinstance(kwargs["timeout"], timedelta):
            kwargs["timeout"] = timedelta(seconds=kwargs["timeout"])
        kwargs.setdefault("timeout", timedelta(seconds=STORE_TIMEOUT))
        name = f"store{next(self._names)}"
        future = self.submit("store", name=name, kwargs=kwargs, listen_fd=listen_fd)
        return TorchStore(self, name), future

    def store(self, **kwargs: Any) -> TorchStore:
        """Create a ``torch.distributed.TCPStore`` in the worker (kwargs as torch's)."""
        store, future = self.store_async(**kwargs)
        store.port = future.result(timeout=ANSWER_TIMEOUT)
        return store

    def listen(self) -> int:
        """Bind a listening socket in the worker for a later ``listen_fd=True`` store."""
        port: int = self.request("listen")
        return port

    def reset(self) -> bool:
        """Drop every store of this worker; False if the worker is stuck or dead."""
        if self.proc.poll() is not None:
            return False
        try:
            self.submit("reset").result(timeout=ANSWER_TIMEOUT)
        except Exception:
            return False
        return True

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class TorchStore:
    """A proxy for a torch store in a worker: ``store.get("k")`` runs there."""

    def __init__(self, worker: TorchWorker, name: str) -> None:
        self.worker = worker
        self.name = name
        self.port: int = 0

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Future[Any]:
        """Call ``method`` in the worker without waiting for it."""
        return self.worker.submit("call", name=self.name, method=method, args=args, kwargs=kwargs)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.submit(method, *args, **kwargs).result(timeout=ANSWER_TIMEOUT)

        return call

    def drop(self) -> None:
        """Destroy the torch store object (closing its connection or server)."""
        self.worker.request("drop", name=self.name)


class WorkerPool:
    """Torch worker processes shared by the whole session, started on demand."""

    def __init__(self) -> None:
        self.workers: list[TorchWorker] = []

    def get(self, count: int) -> list[TorchWorker]:
        fresh = [TorchWorker() for _ in range(count - len(self.workers))]
        for worker in fresh:
            worker.ready()
        self.workers.extend(fresh)
        return self.workers[:count]

    def reset(self) -> None:
        """Drop every store; replace workers that are stuck in a call."""
        for index, worker in enumerate(self.workers):
            if not worker.reset():
                worker.kill()
                replacement = TorchWorker()
                replacement.ready()
                self.workers[index] = replacement

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()
