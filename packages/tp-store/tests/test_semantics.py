"""The value rules every store shares (``tp_store.semantics``)."""

from __future__ import annotations

import pytest

from tp_store.errors import StoreTimeoutError
from tp_store.semantics import (
    INT64_MAX,
    compare_set_result,
    counter_after_add,
    key_text,
    parse_counter,
    timeout_error,
)


@pytest.mark.parametrize(
    ("current", "expected", "desired", "outcome"),
    [
        (None, b"", b"new", (b"new", b"new")),  # missing, empty expected: create
        (None, b"old", b"new", (None, b"old")),  # missing, expected given: untouched
        (b"old", b"old", b"new", (b"new", b"new")),  # match: swap
        (b"cur", b"old", b"new", (None, b"cur")),  # mismatch: untouched
        (b"cur", b"", b"new", (None, b"cur")),  # empty expected never matches a value
        (b"", b"", b"new", (b"new", b"new")),  # ...except the empty value
    ],
)
def test_compare_set_result(
    current: bytes | None,
    expected: bytes,
    desired: bytes,
    outcome: tuple[bytes | None, bytes],
) -> None:
    assert compare_set_result(current, expected, desired) == outcome


@pytest.mark.parametrize(
    ("value", "number"), [(None, 0), (b"", 0), (b"42", 42), (b"-7", -7), (b"+3", 3)]
)
def test_parse_counter_reads_decimal_text(value: bytes | None, number: int) -> None:
    assert parse_counter(b"k", value) == number


@pytest.mark.parametrize("value", [b"abc", b"1.5", b" 1", b"1_000", b"\xd9\xa1", b"0x10"])
def test_parse_counter_rejects_other_text_naming_the_key(value: bytes) -> None:
    with pytest.raises(ValueError, match="'counter'"):
        parse_counter(b"counter", value)


def test_counter_after_add() -> None:
    assert counter_after_add(b"k", b"40", 2) == 42
    assert counter_after_add(b"k", None, -1) == -1
    with pytest.raises(TypeError):
        counter_after_add(b"k", b"1", 1.5)  # type: ignore[arg-type]
    with pytest.raises(OverflowError, match="'k'"):
        counter_after_add(b"k", str(INT64_MAX).encode(), 1)


def test_key_text_keeps_undecodable_bytes() -> None:
    assert key_text("ключ".encode()) == "ключ"
    assert key_text(b"\xff").encode("utf-8", "surrogateescape") == b"\xff"


def test_timeout_error_names_the_keys() -> None:
    error = timeout_error([b"a", b"b"], 0.25)
    assert isinstance(error, StoreTimeoutError)
    assert isinstance(error, TimeoutError)
    assert error.keys == ("a", "b")
    assert str(error) == "timed out after 0.25 s waiting for keys 'a', 'b'"
