"""What ``FileStore`` adds to the contract: PyTorch's file format and file cleanup."""

from __future__ import annotations

import gc
import struct
from pathlib import Path

import pytest

from tp_store.errors import StoreError
from tp_store.file_store import FileStore


def _record(key: bytes, value: bytes) -> bytes:
    return struct.pack("=I", len(key)) + key + struct.pack("=I", len(value)) + value


def test_the_file_is_pytorchs_format(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with FileStore(str(path)) as store:
        store.set("k", "v")
        store.delete_key("k")
    assert path.read_bytes() == b"".join(
        [
            _record(b"refcount/", b"1"),
            _record(b"/k", b"v"),
            _record(b"-/k", b""),
            _record(b"cleanup/", b"1"),
            _record(b"refcount/", b"0"),
        ]
    )


def test_a_record_counts_once_it_is_complete(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = FileStore(path)
    record = _record(b"/late", b"value")
    with path.open("ab") as file:
        file.write(record[:7])
        file.flush()
        assert not store.check(["late"])
        file.write(record[7:])
    assert store.get("late") == b"value"
    store.close()


def test_the_last_of_world_size_handles_removes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "store"
    first = FileStore(path, world_size=2)
    second = first.clone()
    first.close()
    assert path.exists()
    second.close()
    assert not path.exists()


def test_without_world_size_the_file_stays(tmp_path: Path) -> None:
    path = tmp_path / "store"
    FileStore(path).close()
    assert path.exists()


def test_a_collected_handle_is_released(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = FileStore(path, world_size=1)
    del store
    gc.collect()
    assert not path.exists()


def test_a_closed_handle_refuses_work(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.set("k", "v")


@pytest.mark.parametrize("world_size", [0, -2])
def test_world_size_must_be_positive_or_minus_one(tmp_path: Path, world_size: int) -> None:
    with pytest.raises(ValueError, match="world_size"):
        FileStore(tmp_path / "store", world_size)
