"""Values from a store quoted in error messages and log lines, within a bound.

A store writer chooses what the rendezvous reads: an 8 MB string quoted whole
would make one error message (and every log line and CLI line repeating it)
8 MB long. Every decoder quotes what it refuses through :func:`quoted`.
"""

from __future__ import annotations

import reprlib

#: The most characters a quoted value takes in a message.
MAX_QUOTED = 200

_REPR = reprlib.Repr()
_REPR.maxstring = MAX_QUOTED
_REPR.maxother = MAX_QUOTED
_REPR.maxlong = 60
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = 8
_REPR.maxlevel = 3


def quoted(value: object) -> str:
    """``repr(value)`` cut to at most :data:`MAX_QUOTED` characters (plus ``...``).

    Long strings, containers and numbers are cut before they are rendered,
    so quoting costs no more than the quote.
    """
    if isinstance(value, bytes | bytearray) and len(value) > MAX_QUOTED:
        value = value[:MAX_QUOTED]  # reprlib renders bytes whole before cutting them
    try:
        text = _REPR.repr(value)
    except (ValueError, RecursionError):  # an int too long to print, a value too deep
        return f"<a {type(value).__name__} too large to quote>"
    return text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + "..."
