"""Coercion of rendezvous config values, which may come as strings from a command line.

Each function names the option in its ``ValueError`` so that a bad value on a
command line points at the flag to fix.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .timeout import positive_timedelta

#: Spellings of ``True`` (compared after stripping and lower-casing).
TRUE_STRINGS = frozenset({"1", "true", "t", "yes", "y"})
#: Spellings of ``False`` (compared after stripping and lower-casing).
FALSE_STRINGS = frozenset({"0", "false", "f", "no", "n"})

_INT = re.compile(r"[+-]?[0-9]+")
#: Digits an integer option may have: more than any count or size needs, and
#: far fewer than Python's int() refuses (4300), so the message names the option.
MAX_INT_DIGITS = 100
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def to_bool(key: str, value: object) -> bool:
    """``value`` of option ``key`` as a ``bool``.

    Accepted: ``True``/``False``; the ints 1 and 0; the strings in
    :data:`TRUE_STRINGS` and :data:`FALSE_STRINGS`, case-insensitively and
    ignoring surrounding whitespace. Anything else is a ``ValueError``.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value in (0, 1):
            return value == 1
    elif isinstance(value, str):
        text = value.strip().lower()
        if text in TRUE_STRINGS:
            return True
        if text in FALSE_STRINGS:
            return False
    raise ValueError(
        f"rendezvous config option {key!r} must be a boolean "
        f"(1/0, true/false, t/f, yes/no, y/n), got {value!r}"
    )


def to_int(key: str, value: object) -> int:
    """``value`` of option ``key`` as an ``int``.

    Accepted: ints (not ``bool``) and strings of an optionally signed decimal
    integer of at most :data:`MAX_INT_DIGITS` digits, surrounding whitespace
    ignored. Anything else (floats included) is a ``ValueError``.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _INT.fullmatch(value.strip()):
        text = value.strip()
        if len(text.lstrip("+-").lstrip("0")) > MAX_INT_DIGITS:
            raise ValueError(
                f"rendezvous config option {key!r} must be an integer of at most "
                f"{MAX_INT_DIGITS} digits, got one of {len(text)} characters"
            )
        return int(text)
    raise ValueError(f"rendezvous config option {key!r} must be an integer, got {value!r:.200}")


def to_seconds(key: str, value: object) -> timedelta:
    """``value`` of option ``key``, a positive duration in seconds, as a ``timedelta``.

    Accepted: ints and floats (not ``bool``), decimal strings such as ``"30"``
    or ``"1.5"``, and ``timedelta``. Zero, negative, non-finite and
    non-numeric values are a ``ValueError``.
    """
    what = f"rendezvous config option {key!r}"
    if isinstance(value, str):
        text = value.strip()
        if not _NUMBER.fullmatch(text):
            raise ValueError(f"{what} must be a number of seconds, got {value!r:.200}")
        seconds = float(text)
        if seconds <= 0:
            raise ValueError(f"{what} must be positive, got {value!r}")
        if not math.isfinite(seconds):
            # float() makes inf of "1e999" or 5000 digits: quote what was given.
            shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
            raise ValueError(f"{what} is too large a number of seconds: {shown}")
        return positive_timedelta(seconds, what)
    return positive_timedelta(value, what)
