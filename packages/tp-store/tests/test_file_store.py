"""What ``FileStore`` adds to the contract: PyTorch's records with checksums, integrity,
file safety and cleanup."""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import shutil
import stat
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import store_workers

from tp_store.errors import StoreError, StoreFileError
from tp_store.stores.file_store import FileStore

TIMEOUT = 30.0


def _field(data: bytes) -> bytes:
    return struct.pack("=I", len(data)) + data


def _record(key: bytes, value: bytes) -> bytes:
    return _field(key) + _field(value)


def _batch(*records: bytes) -> bytes:
    """A write as tp-store appends it: the checksum record, then the records."""
    batch = b"".join(records)
    info = struct.pack("=II", len(batch), zlib.crc32(batch))
    return _record(b"-checksum/", info + struct.pack("=I", zlib.crc32(info))) + batch


def test_the_file_is_pytorchs_records_each_write_led_by_a_checksum(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with FileStore(str(path)) as store:
        store.set("k", "v")
        store.delete_key("k")
    assert path.read_bytes() == b"".join(
        [
            _batch(_record(b"refcount/", b"1")),
            _batch(_record(b"/k", b"v")),
            _batch(_record(b"-/k", b"")),
            _batch(_record(b"cleanup/", b"1")),
            _batch(_record(b"refcount/", b"0")),
        ]
    )


def test_records_without_checksum_are_read(tmp_path: Path) -> None:
    # As PyTorch's FileStore (and tp-store 0.1) write them.
    path = tmp_path / "store"
    path.write_bytes(_record(b"refcount/", b"1") + _record(b"/old", b"1"))
    with FileStore(path, timeout=TIMEOUT) as store:
        assert store.get("old") == b"1"
        store.set("new", "2")
    with path.open("ab") as file:
        file.write(_record(b"/later", b"3"))
    with FileStore(path, timeout=TIMEOUT) as store:
        assert [store.get(key) for key in ("old", "new", "later")] == [b"1", b"2", b"3"]


def _one_write(tmp_path: Path) -> bytes:
    """The bytes a ``set`` appends, taken from a scratch file."""
    scratch = tmp_path / "scratch"
    with FileStore(scratch) as store:
        before = scratch.stat().st_size
        store.set("torn", "x" * 40)
        return scratch.read_bytes()[before:]


def _exchange_in_processes(path: Path, pairs: list[tuple[str, str]]) -> list[object]:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(pairs), mp_context=context) as pool:
        futures = [
            pool.submit(store_workers.exchange_through_file_store, str(path), mine, theirs)
            for mine, theirs in pairs
        ]
        return [future.result(timeout=120) for future in futures]


# Cut inside the checksum record's key length, after the checksum record (its
# batch missing), inside the batch, and one byte before its end.
@pytest.mark.parametrize("kept", [3, 30, 41, -1])
def test_a_torn_tail_is_truncated_and_every_handle_and_process_agrees(
    tmp_path: Path, kept: int, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "store"
    first = FileStore(path, timeout=TIMEOUT)
    first.set("before", "1")
    intact = path.stat().st_size
    torn = _one_write(tmp_path)[:kept]
    with path.open("ab") as file:  # a writer that died in mid-write
        file.write(torn)
    with caplog.at_level(logging.WARNING, "tp_store.file_store"):
        second = FileStore(path, timeout=TIMEOUT)
    first.set("from-first", "a")
    second.set("from-second", "b")
    # Writes are synchronous: each handle sees the other's at once.
    assert second.check(["from-first"])
    assert first.check(["from-second"])
    assert [second.get("from-first"), first.get("from-second")] == [b"a", b"b"]
    assert not first.check(["torn"])
    assert f"truncated a torn tail of {len(torn)} bytes at byte {intact}" in caplog.text
    assert str(path) in caplog.text
    keys = ["before", "from-first", "from-second", "p1", "p2"]
    results = _exchange_in_processes(path, [("p1", "p2"), ("p2", "p1")])
    assert results == [(b"p2", keys), (b"p1", keys)]
    for handle in (first, second, FileStore(path, timeout=TIMEOUT)):
        assert sorted(handle.list_keys()) == keys
        handle.close()


_WRITE_PAST_A_FILE_SIZE_LIMIT = """
import os, resource, signal, sys
from tp_store import FileStore, StoreFileError
path, room = sys.argv[1], int(sys.argv[2])
store = FileStore(path)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
limit = os.path.getsize(path) + room
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
try:
    store.set("big", "x" * 10 * room)
except StoreFileError as exc:
    print(exc, flush=True)
os._exit(0)  # as a crash would: no closing record
"""


def test_a_write_cut_short_by_a_full_disk_is_a_store_error_and_its_tail_is_cut(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "store"
    first = FileStore(path, timeout=TIMEOUT)
    first.set("before", "1")
    result = subprocess.run(
        [sys.executable, "-c", _WRITE_PAST_A_FILE_SIZE_LIMIT, str(path), "1000"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert f"cannot write to the FileStore file {str(path)!r}" in result.stdout
    assert "File too large" in result.stdout
    intact = len(path.read_bytes()) - 1000  # the child wrote up to its limit, then failed
    with caplog.at_level(logging.WARNING, "tp_store.file_store"):
        second = FileStore(path, timeout=TIMEOUT)
    assert f"truncated a torn tail of 1000 bytes at byte {intact}" in caplog.text
    assert not first.check(["big"])
    second.set("after", "2")
    assert first.get("after") == b"2"
    assert sorted(first.list_keys()) == sorted(second.list_keys()) == ["after", "before"]
    first.close()
    second.close()


def test_a_torn_tail_seen_by_a_reader_is_truncated_before_the_next_write(tmp_path: Path) -> None:
    path = tmp_path / "store"
    writer = FileStore(path, timeout=TIMEOUT)
    reader = writer.clone()
    intact = path.stat().st_size
    with path.open("ab") as file:
        file.write(_one_write(tmp_path)[:-5])
    assert not reader.check(["torn"])  # under the shared lock, then the exclusive one
    assert path.stat().st_size == intact
    writer.set("after", "1")
    assert reader.get("after") == b"1"
    reader.close()
    writer.close()


def _corrupt(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _offset_of(path: Path, needle: bytes) -> int:
    offset = path.read_bytes().find(needle)
    assert offset > 0
    return offset


# A value byte, the checksum record's key length (which makes the rest look
# torn, but intact batches follow) and a byte of the checksum itself.
@pytest.mark.parametrize("where", ["value", "length", "checksum"])
def test_a_corrupted_byte_is_a_store_error_for_every_new_handle_and_process(
    tmp_path: Path, where: str
) -> None:
    path = tmp_path / "store"
    first = FileStore(path, timeout=TIMEOUT)
    for key in ("a", "b", "c"):
        first.set(key, f"value-of-{key}")
    first.close()
    value_b = _offset_of(path, b"value-of-b")
    header_b = path.read_bytes().rfind(b"-checksum/", 0, value_b)
    size = path.stat().st_size
    offset = {"value": value_b + 3, "length": header_b - 4, "checksum": header_b + 16}[where]
    _corrupt(path, offset)
    with pytest.raises(StoreError, match="corrupt at byte") as info:
        FileStore(path, timeout=TIMEOUT)
    assert str(path) in str(info.value)
    with pytest.raises(StoreError, match="corrupt at byte"):
        _exchange_in_processes(path, [("p1", "p2")])
    assert path.stat().st_size == size  # nothing truncated, nothing appended


def _checksum_record(length: int, checksum: int = 1) -> bytes:
    """A checksum record (its own checksum right) claiming ``length`` bytes of batch."""
    info = struct.pack("=II", length, checksum)
    return _record(b"-checksum/", info + struct.pack("=I", zlib.crc32(info)))


def test_a_crafted_tail_of_overlapping_checksum_records_is_a_prompt_store_error(
    tmp_path: Path,
) -> None:
    # A tail that looks torn (its first batch runs past the end), then 40,000
    # checksum records, each claiming the rest of the file as its batch with a
    # wrong CRC (1 is no CRC of the empty batch either): checked one by one,
    # that is 24 GB of CRC; within the budget it is about a megabyte, and the
    # file is called corrupt rather than truncated.
    path = tmp_path / "store"
    with FileStore(path, timeout=TIMEOUT) as store:
        store.set("before", "1")
    size = path.stat().st_size
    record_size = len(_checksum_record(0))
    count = 40_000
    records = [_checksum_record((count - 1 - i) * record_size) for i in range(count)]
    tail = _checksum_record(count * record_size + 1000) + b"".join(records)
    with path.open("ab") as file:
        file.write(tail)
    with pytest.raises(StoreError, match=f"corrupt at byte {size}"):
        FileStore(path, timeout=TIMEOUT)
    assert path.stat().st_size == size + len(tail)  # nothing truncated


def test_a_handle_whose_file_shrank_says_so(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = FileStore(path, timeout=TIMEOUT)
    store.set("k", "v")
    os.truncate(path, 10)
    with pytest.raises(StoreError, match="shrank"):
        store.set("k", "w")
    with pytest.raises(StoreError, match="shrank"):
        store.close()


def test_the_file_is_created_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "store"
    umask = os.umask(0)
    try:
        FileStore(path).close()
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_symbolic_link_at_the_path_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"precious")
    link = tmp_path / "store"
    link.symlink_to(target)
    with pytest.raises(StoreFileError, match="symbolic link") as info:
        FileStore(link)
    assert str(link) in str(info.value)
    assert target.read_bytes() == b"precious"


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreFileError, match="directory") as info:
        FileStore(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_a_fifo_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store"
    os.mkfifo(path)
    with pytest.raises(StoreFileError, match="not a regular file"):
        FileStore(path)


def test_a_missing_directory_is_a_store_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "store"
    with pytest.raises(StoreFileError) as info:
        FileStore(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, OSError)  # code catching OSError keeps working


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[None]:
    """``path`` unwritable, even by root (the immutable attribute), for the block."""
    if os.geteuid() != 0:
        path.chmod(0o400)
        yield
        return
    if (
        shutil.which("chattr") is None
        or subprocess.run(["chattr", "+i", str(path)], check=False).returncode != 0
    ):
        pytest.skip("root, and chattr +i does not work here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_file_is_a_store_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "store"
    FileStore(path).close()
    with _read_only(path), pytest.raises(StoreFileError, match="cannot open") as info:
        FileStore(path)
    assert str(path) in str(info.value)


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
