"""The value rules of PyTorch's stores, shared by every store implementation.

Pure functions on ``bytes``: no locking, no I/O. Each store applies them to its
own data so that ``compare_set``, ``add`` and timeouts behave identically
everywhere.
"""

from __future__ import annotations

import operator
import re
import reprlib
from collections.abc import Sequence
from typing import SupportsIndex

from .errors import StoreTimeoutError

#: The range of PyTorch's ``int64_t`` counters (and of the wire protocol's ADD).
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_DECIMAL = re.compile(rb"[+-]?[0-9]+")


def int_argument(value: object, what: str, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """``value`` as an ``int`` in ``low..high`` (by default PyTorch's signed 64-bit range).

    Raises ``TypeError`` naming ``what`` unless ``value`` is an integer (a
    ``bool`` is refused: ``True`` is never meant as a count), and
    ``ValueError`` naming ``what`` and the range when it is outside.
    """
    if type(value) is int:  # the common case, without the slow protocol check
        number = value
    elif isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got the bool {value}")
    elif not isinstance(value, SupportsIndex):
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {reprlib.repr(value)}")
    else:
        number = operator.index(value)
    if not low <= number <= high:
        bounds = "the signed 64-bit range" if (low, high) == (INT64_MIN, INT64_MAX) else "range"
        # str() of an int over 4300 digits raises: show its size instead.
        shown = str(number) if number.bit_length() <= 256 else f"a {number.bit_length()}-bit int"
        raise ValueError(f"{what} must be in {bounds} {low}..{high}, got {shown}")
    return number


def check_sequence(items: object, what: str) -> None:
    """Raise ``TypeError`` naming ``what`` unless ``items`` is a sequence of keys or values.

    A lone ``str`` or ``bytes`` is refused: it would be taken as one key per
    character (PyTorch refuses it too).
    """
    if isinstance(items, (str, bytes, bytearray, memoryview)):
        raise TypeError(
            f"{what} must be a list, got a single {type(items).__name__} "
            f"{reprlib.repr(items)} (write [{reprlib.repr(items)}])"
        )
    if not isinstance(items, Sequence):
        raise TypeError(f"{what} must be a list, got {type(items).__name__}")


def check_multi_set(keys: Sequence[object], values: Sequence[object]) -> None:
    """Raise ``TypeError`` unless ``multi_set`` got two lists (see :func:`check_sequence`),
    ``ValueError`` unless they are as long."""
    check_sequence(keys, "keys")
    check_sequence(values, "values")
    if len(keys) != len(values):
        raise ValueError(
            f"multi_set needs as many values as keys, got {len(keys)} keys and {len(values)} values"
        )


def key_text(key: bytes) -> str:
    """A key as ``str``; bytes that are not UTF-8 survive as surrogate escapes."""
    return key.decode("utf-8", "surrogateescape")


def compare_set_result(
    current: bytes | None, expected: bytes, desired: bytes
) -> tuple[bytes | None, bytes]:
    """Apply PyTorch's ``compare_set`` rule to the current value (``None`` = missing).

    Returns ``(to_store, result)``: ``to_store`` is the value to write, or
    ``None`` when the store must be left untouched; ``result`` is what
    ``compare_set`` returns. The three cases:

    - missing and ``expected`` empty: create with ``desired``, return ``desired``;
    - missing and ``expected`` non-empty: write nothing, return ``expected``;
    - present: write ``desired`` iff ``current == expected``; return the value after.
    """
    if current is None:
        if expected:
            return None, expected
        return desired, desired
    if current == expected:
        return desired, desired
    return None, current


def parse_counter(key: bytes, value: bytes | None) -> int:
    """The integer a counter holds: ASCII decimal text; missing or empty count as 0.

    Raises ``ValueError`` naming ``key`` for any other value.
    """
    if not value:
        return 0
    if _DECIMAL.fullmatch(value) is None:
        raise ValueError(
            f"key {key_text(key)!r} holds {value[:40]!r}, which is not a decimal integer counter"
        )
    return int(value)


def counter_after_add(key: bytes, value: bytes | None, amount: int) -> int:
    """The counter at ``key`` once ``amount`` is added (PyTorch's ``add``).

    Raises ``TypeError`` for a non-integer amount and ``ValueError`` for one
    outside int64 (both naming ``amount``), ``ValueError`` (naming the key) for
    a non-integer current value and ``OverflowError`` when the sum leaves int64.
    """
    total = parse_counter(key, value) + int_argument(amount, "amount")
    if not INT64_MIN <= total <= INT64_MAX:
        raise OverflowError(f"adding {amount} to key {key_text(key)!r} leaves the int64 range")
    return total


def timeout_error(
    keys: Sequence[bytes], seconds: float, waiting_for: str = "keys"
) -> StoreTimeoutError:
    """The error of a blocking operation that gave up after ``seconds``, naming ``keys``."""
    names = [key_text(key) for key in keys]
    listed = ", ".join(repr(name) for name in names)
    return StoreTimeoutError(
        f"timed out after {seconds:g} s waiting for {waiting_for} {listed}", names
    )
