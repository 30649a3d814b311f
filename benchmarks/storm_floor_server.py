#!/usr/bin/env python3
"""A floor for the storm: the least a Python server on uvloop can do for it.

It answers only what ``storm_bench.py``'s workers send (VALIDATE, PING, ADD,
SET, WAIT of one key, GET), each as it arrives, with no limits, no budget, no
counters and no checks: not a store, a measure. What it costs is what uvloop
and the kernel cost a Python server per worker; what our server costs above
it is its own Python. ``storm_bench.py --floor`` runs it beside the others.

Prints ``listening on 127.0.0.1:PORT`` once it listens; runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import struct
from typing import ClassVar

import uvloop

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_VALIDATE, _SET, _GET, _ADD, _WAIT, _PING = 0, 1, 3, 4, 6, 13


class FloorProtocol(asyncio.Protocol):
    # One store for every connection, as a server's.
    data: ClassVar[dict[bytes, bytes]] = {}
    waiting: ClassVar[dict[bytes, list[asyncio.Transport]]] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, chunk: bytes) -> None:
        write = self.transport.write
        while chunk:
            opcode = chunk[0]
            if opcode == _VALIDATE:
                chunk = chunk[5:]
                continue
            if opcode == _PING:
                write(chunk[1:5])
                chunk = chunk[5:]
                continue
            size = _U64.unpack_from(chunk, 1)[0]
            if opcode == _ADD:
                key = chunk[9 : 9 + size]
                total = int(self.data.get(key, b"0")) + _I64.unpack_from(chunk, 9 + size)[0]
                self.data[key] = str(total).encode()
                write(_I64.pack(total))
                chunk = chunk[17 + size :]
            elif opcode == _SET:
                key = chunk[9 : 9 + size]
                length = _U64.unpack_from(chunk, 9 + size)[0]
                self.data[key] = chunk[17 + size : 17 + size + length]
                chunk = chunk[17 + size + length :]
                for transport in self.waiting.pop(key, ()):
                    transport.write(b"\x00")
            elif opcode == _WAIT:  # of one key
                length = _U64.unpack_from(chunk, 9)[0]
                key = chunk[17 : 17 + length]
                chunk = chunk[17 + length :]
                if key in self.data:
                    write(b"\x00")
                else:
                    self.waiting.setdefault(key, []).append(self.transport)
            elif opcode == _GET:
                value = self.data.get(chunk[9 : 9 + size], b"")
                write(_U64.pack(len(value)) + value)
                chunk = chunk[9 + size :]
            else:
                raise ValueError(f"opcode {opcode} is not the storm's")


async def serve() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(FloorProtocol, "127.0.0.1", 0, backlog=16 * 1024)
    print(f"listening on 127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve())
