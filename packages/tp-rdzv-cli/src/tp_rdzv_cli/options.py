"""Argument types that range-check numeric options where they are parsed.

argparse turns the ``ArgumentTypeError`` of each into one line naming the
option, and exit status 2; nothing out of range reaches a command.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

#: The longest duration an option takes (a week): sleeps and socket timeouts
#: refuse much longer ones with errors of their own.
MAX_SECONDS = 7 * 24 * 3600.0
#: The most nodes a rendezvous option may name (what a 32-bit count holds).
MAX_NODES = 2**31 - 1

_INTEGER = re.compile(r"[+-]?[0-9]+")


def positive_seconds(text: str) -> float:
    """A finite number of seconds in (0, :data:`MAX_SECONDS`] (``nan`` and ``inf`` refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds above 0 and at most {MAX_SECONDS:g}, got {text!r}"
        )
    return value


def port(text: str) -> int:
    """A TCP port, 0 (pick a free one) to 65535."""
    return integer(0, 65535)(text)


def integer(minimum: int, maximum: int) -> Callable[[str], int]:
    """The type of an integer option in ``minimum..maximum``."""

    def parse(text: str) -> int:
        number = text.strip()
        if not _INTEGER.fullmatch(number):
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r:.40}")
        # Length first: int() refuses more than 4300 digits with a message of its own.
        if len(number.lstrip("+-").lstrip("0")) > 20 or not minimum <= int(number) <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be an integer from {minimum} to {maximum}, got {number:.40}"
            )
        return int(number)

    return parse
