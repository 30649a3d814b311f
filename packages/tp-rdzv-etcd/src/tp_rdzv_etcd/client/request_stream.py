"""What a gRPC stream call of this client sends: the requests queued for it."""

from __future__ import annotations

import queue
from collections.abc import Iterator


def queued_requests(requests: queue.SimpleQueue[bytes | None]) -> Iterator[bytes]:
    """The requests put on ``requests``, as they come, until a ``None`` ends the stream."""
    while True:
        request = requests.get()
        if request is None:
            return
        yield request
