"""A PyTorch process driven by the interop tests over stdin/stdout.

PyTorch's C++ store holds the GIL in some calls, so every torch store object
the tests use lives in one of these worker processes, never in the process
that runs our server. The worker reads one JSON request per line from stdin
and answers one JSON line on its private copy of stdout; requests run in
order, so a blocking call simply answers later (tests run blocking calls
concurrently by using several workers).

Requests: ``{"id": n, "op": ..., ...}``; answers: ``{"id": n, "ok": result}``
or ``{"id": n, "error": {"type": ..., "mro": [...], "message": ...}}``.

Ops:
- ``listen``: bind a listening socket on 127.0.0.1:0 and keep it, answer its
  port (so a torch master whose constructor blocks can be found before it
  returns: the next ``store`` with ``"listen_fd": true`` adopts the socket).
- ``store``: create ``torch.distributed.TCPStore`` named ``name`` from
  ``kwargs``; answer its port.
- ``call``: call ``method`` on the store ``name`` with ``args``/``kwargs``.
- ``drop``: forget the store ``name`` (closing its socket or server); ``reset``
  forgets them all.
- ``allreduce``: join a gloo process group through a torch store client and
  all_reduce a tensor holding the rank.

Values travel as ``{"b": base64}`` for bytes and ``{"td": seconds}`` for a
``timedelta``; everything else is plain JSON.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def decode(value: Any) -> Any:
    """Turn the JSON form of an argument back into a Python value."""
    if isinstance(value, dict):
        if "b" in value:
            return base64.b64decode(value["b"])
        if "td" in value:
            return timedelta(seconds=value["td"])
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


def encode(value: Any) -> Any:
    """Turn a result into its JSON form."""
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode()}
    if isinstance(value, timedelta):
        return {"td": value.total_seconds()}
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    return value


class Worker:
    """The stores of this process and the request dispatcher."""

    def __init__(self) -> None:
        self.stores: dict[str, dist.TCPStore] = {}
        self.listener: socket.socket | None = None

    def handle(self, request: dict[str, Any]) -> Any:
        op = request["op"]
        if op == "listen":
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(1024)
            self.listener = listener
            return listener.getsockname()[1]
        if op == "store":
            kwargs = decode(request.get("kwargs", {}))
            if request.get("listen_fd"):
                assert self.listener is not None, "listen must come before listen_fd"
                kwargs["master_listen_fd"] = self.listener.detach()
                self.listener = None
            store = dist.TCPStore(**kwargs)
            self.stores[request["name"]] = store
            return store.port
        if op == "call":
            store = self.stores[request["name"]]
            method = getattr(store, request["method"])
            args = decode(request.get("args", []))
            kwargs = decode(request.get("kwargs", {}))
            return encode(method(*args, **kwargs))
        if op == "drop":
            self.stores.pop(request["name"], None)
            return None
        if op == "reset":
            self.stores.clear()
            return None
        if op == "allreduce":
            return self.allreduce(**request["kwargs"])
        raise ValueError(f"unknown op {op!r}")

    def allreduce(self, host: str, port: int, rank: int, world_size: int, timeout: float) -> Any:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout))
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
        )
        try:
            tensor = torch.tensor([rank], dtype=torch.int64)
            dist.all_reduce(tensor)
            dist.barrier()
            return int(tensor.item())
        finally:
            dist.destroy_process_group()


def main() -> None:
    # Keep the protocol channel private: anything torch (or a stray print)
    # writes to stdout goes to stderr instead.
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    worker = Worker()
    channel.write(json.dumps({"id": 0, "ok": os.getpid()}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            answer: dict[str, Any] = {"id": request["id"], "ok": worker.handle(request)}
        except Exception as exc:  # reported to the test, which decides
            answer = {
                "id": request["id"],
                "error": {
                    "type": type(exc).__name__,
                    "mro": [cls.__name__ for cls in type(exc).__mro__],
                    # torch appends a C++ backtrace; the first line is the message
                    "message": str(exc).split("\nException raised from")[0],
                },
            }
        channel.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
