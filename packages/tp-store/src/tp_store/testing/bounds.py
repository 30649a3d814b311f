"""Checking that a decoder of untrusted bytes ends fast and small (no pytest needed).

For property tests of every reader of what a store holds: whatever the
bytes, the decoder returns a value or raises its documented error, within a
bound of CPU time and of memory, and its error message stays short.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable

#: The bounds of one decoding: one second of CPU, 64 MiB, a 2,000-character message.
MAX_SECONDS = 1.0
MAX_MEMORY = 64 << 20
MAX_MESSAGE = 2000


def within_bounds(decode: Callable[[], object], errors: tuple[type[Exception], ...]) -> object:
    """What ``decode()`` returns, or the exception among ``errors`` it raises.

    Raises ``AssertionError`` if it took more than :data:`MAX_SECONDS` of this
    thread's CPU time (steady on a loaded machine, unlike the wall clock),
    more than :data:`MAX_MEMORY` of memory at its peak (measured with
    :mod:`tracemalloc`, started and stopped here if it was not on), or if the error's
    message is longer than :data:`MAX_MESSAGE`. Any other exception propagates.
    """
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        started = time.thread_time()
        try:
            result: object = decode()
        except errors as exc:
            result = exc
        seconds = time.thread_time() - started
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:  # as it was: a later test's own measure starts afresh
            tracemalloc.stop()
    assert seconds <= MAX_SECONDS, f"{seconds:.2f} s of CPU"
    assert peak <= MAX_MEMORY, f"{peak >> 20} MiB at the peak"
    if isinstance(result, Exception):
        assert len(str(result)) <= MAX_MESSAGE, f"a {len(str(result))}-character message"
    return result
