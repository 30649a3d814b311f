"""Reading the store secret from a file: bounded, regular files only, warned when shared."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from tp_store.security import MAX_SECRET_FILE_BYTES, read_secret_file


def _secret_file(tmp_path: Path, content: bytes, mode: int) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(("mode", "readers"), [(0o644, "every user"), (0o640, "its group")])
def test_a_secret_file_others_can_read_is_warned_about_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int, readers: str
) -> None:
    path = _secret_file(tmp_path, b"a-long-enough-secret\n", mode)
    with caplog.at_level(logging.WARNING, "tp_store.security"):
        assert read_secret_file(path) == b"a-long-enough-secret"
    assert f"{str(path)!r} can be read by {readers} (mode {oct(mode)})" in caplog.text


def test_a_secret_file_only_its_owner_reads_is_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _secret_file(tmp_path, b"a-long-enough-secret", 0o600)
    with caplog.at_level(logging.WARNING, "tp_store.security"):
        assert read_secret_file(path) == b"a-long-enough-secret"
    assert caplog.records == []


def test_a_secret_file_at_the_size_bound_is_read(tmp_path: Path) -> None:
    path = _secret_file(tmp_path, b"s" * (MAX_SECRET_FILE_BYTES - 1) + b"\n", 0o600)
    assert read_secret_file(path) == b"s" * (MAX_SECRET_FILE_BYTES - 1)


def test_a_secret_file_over_the_size_bound_is_refused(tmp_path: Path) -> None:
    path = _secret_file(tmp_path, b"s" * (MAX_SECRET_FILE_BYTES + 1), 0o600)
    with pytest.raises(ValueError, match=f"over {MAX_SECRET_FILE_BYTES} bytes") as info:
        read_secret_file(path)
    assert str(path) in str(info.value)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    os.mkfifo(path)
    outcome: list[BaseException | bytes] = []

    def read() -> None:
        try:
            outcome.append(read_secret_file(path))
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():
        with open(path, "wb"):  # let the blocked reader go (it waited for a writer)
            pass
        pytest.fail("reading a FIFO blocked until a writer came")
    assert isinstance(outcome[0], ValueError)
    assert "not a regular file" in str(outcome[0])


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="secret file"):
        read_secret_file(tmp_path)
