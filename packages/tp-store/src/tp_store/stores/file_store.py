"""``FileStore``: a store shared by every process that opens the same file (POSIX only).

The file is an append-only log of records in the format of PyTorch's
``FileStore``: each record is a key then a value, each a native-endian
``u32`` length followed by the bytes. User keys are stored as ``"/" + key``; a
record whose key starts with ``"-"`` deletes the key that follows;
``refcount/`` and ``cleanup/`` count the handles opened and closed. Queue
records (which PyTorch's ``FileStore`` does not have) use the keys
``queue-push/...`` and ``queue-pop/...``, which PyTorch reads as ordinary
internal keys.

Every write appends one batch of records, led by a checksum record: key
``-checksum/`` (to PyTorch, the deletion of a key nobody has, so it reads the
file as before), value the batch's length, its CRC-32, and the CRC-32 of those
8 bytes. Records without one (written by PyTorch, or by tp-store 0.1) are
read unchecked. A write cut short (a crash, a full disk) leaves a torn tail,
which the next handle to hold the exclusive lock truncates, logging a
warning; other damage (a checksum that does not match, or a torn record
followed by intact batches) raises ``StoreError``: no handle ever reads past
it, so handles never disagree about the content.

Every handle replays the log incrementally into memory. Readers hold a shared
``flock`` while replaying; writers hold an exclusive one from their replay
through their append, which makes read-modify-write operations atomic across
processes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import struct
import threading
import time
import weakref
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, TypeVar

from tp_store.base import DEFAULT_TIMEOUT, Data, Store, Timeout, as_bytes, as_keys
from tp_store.errors import QueueEmptyError, StoreError, StoreFileError
from tp_store.semantics import (
    INT64_MAX,
    compare_set_result,
    counter_after_add,
    int_argument,
    key_text,
    timeout_error,
)

_T = TypeVar("_T")
_Record = tuple[bytes, bytes]

_LENGTH = struct.Struct("=I")
_USER = b"/"
_DELETE = b"-"
_REFCOUNT = b"refcount/"
_CLEANUP = b"cleanup/"
_QUEUE_PUSH = b"queue-push/"
_QUEUE_POP = b"queue-pop/"
#: The key of the record leading each batch: it deletes a key nobody has.
_CHECKSUM = b"-checksum/"
#: Its value: the batch's length and CRC-32, then the CRC-32 of those 8 bytes,
#: so that a damaged length is never taken for a torn batch.
_CHECKSUM_VALUE = struct.Struct("=III")
#: How every checksum record starts: its key, and the length of its value.
_CHECKSUM_HEAD = _LENGTH.pack(len(_CHECKSUM)) + _CHECKSUM + _LENGTH.pack(_CHECKSUM_VALUE.size)
_MAX_BATCH = 0xFFFFFFFF

_FIRST_POLL_DELAY = 0.001
_MAX_POLL_DELAY = 0.05

_log = logging.getLogger("tp_store.file_store")  # the name users configure, from before stores/


def _field(data: bytes, offset: int, limit: int) -> tuple[bytes, int] | None:
    """The field at ``offset`` and the offset after it, or ``None`` if it passes ``limit``."""
    start = offset + _LENGTH.size
    if start > limit:
        return None
    (length,) = _LENGTH.unpack_from(data, offset)
    end = start + length
    if end > limit:
        return None
    return data[start:end], end


def _record_at(data: bytes, offset: int, limit: int) -> tuple[bytes, bytes, int] | None:
    """The record at ``offset`` and the offset after it, or ``None`` if it passes ``limit``."""
    key = _field(data, offset, limit)
    value = None if key is None else _field(data, key[1], limit)
    if key is None or value is None:
        return None
    return key[0], value[0], value[1]


def _encode(records: Iterable[_Record]) -> bytes:
    """One batch: its checksum record, then the records."""
    batch = b"".join(_LENGTH.pack(len(field)) + field for record in records for field in record)
    if len(batch) > _MAX_BATCH:
        raise ValueError(f"one FileStore write is limited to 4 GiB, got {len(batch)} bytes")
    info = struct.pack("=II", len(batch), zlib.crc32(batch))
    return _CHECKSUM_HEAD + info + _LENGTH.pack(zlib.crc32(info)) + batch


class _Damage(NamedTuple):
    """What is wrong at ``offset`` (relative to the bytes parsed)."""

    offset: int
    problem: str
    #: The bytes end before the record or batch does: a write cut short, if
    #: nothing intact follows.
    cut_short: bool


def _batch_span(data: bytes, offset: int) -> tuple[int, int, int] | _Damage:
    """Where the batch of the checksum record at ``offset`` starts and ends, and its CRC.

    Only the checksum record is checked (its own checksum, the batch within
    ``data``), not the batch.
    """
    info = offset + len(_CHECKSUM_HEAD)
    start = info + _CHECKSUM_VALUE.size
    if start > len(data):
        return _Damage(offset, "a checksum record cut short", cut_short=True)
    length, checksum, own_checksum = _CHECKSUM_VALUE.unpack_from(data, info)
    if zlib.crc32(data[info : info + 8]) != own_checksum:
        return _Damage(offset, "a checksum record that fails its own checksum", cut_short=False)
    end = start + length
    if end > len(data):
        return _Damage(offset, "a batch cut short", cut_short=True)
    return start, end, checksum


def _batch_at(data: bytes, offset: int) -> tuple[list[_Record], int] | _Damage:
    """The records of the batch (or of the unchecked record) at ``offset``, and its end."""
    if not data.startswith(_CHECKSUM_HEAD, offset):
        record = _record_at(data, offset, len(data))
        if record is None:
            return _Damage(offset, "a record cut short", cut_short=True)
        key, value, end = record
        if key == _CHECKSUM:
            return _Damage(offset, "a malformed checksum record", cut_short=False)
        return [(key, value)], end  # written by PyTorch or tp-store 0.1: no checksum
    span = _batch_span(data, offset)
    if isinstance(span, _Damage):
        return span
    start, end, checksum = span
    if zlib.crc32(memoryview(data)[start:end]) != checksum:
        return _Damage(offset, "a batch whose checksum does not match", cut_short=False)
    records: list[_Record] = []
    while start < end:
        inner = _record_at(data, start, end)
        if inner is None:
            return _Damage(offset, "a batch whose records do not fill it", cut_short=False)
        records.append(inner[:2])
        start = inner[2]
    return records, end


def _parse(data: bytes) -> tuple[list[_Record], int, _Damage | None]:
    """The records of the intact start of ``data``, where it ends, and the damage after."""
    records: list[_Record] = []
    offset = 0
    while offset < len(data):
        found = _batch_at(data, offset)
        if isinstance(found, _Damage):
            return records, offset, found
        batch, offset = found
        records += batch
    return records, offset, None


def _intact_batch_after(data: bytes, offset: int) -> bool:
    """Whether an intact checksummed batch may start anywhere after ``offset``.

    Each candidate costs a CRC of the batch its checksum record claims, and
    candidates may overlap: the batches checked add up to the bytes after
    ``offset`` at most, so a crafted file cannot make this quadratic. Past
    that budget the answer is yes: the caller reports corruption and
    truncates nothing.
    """
    budget = len(data) - offset
    position = data.find(_CHECKSUM_HEAD, offset + 1)
    while position >= 0:
        span = _batch_span(data, position)
        if not isinstance(span, _Damage):
            budget -= span[1] - span[0]
            if budget < 0 or not isinstance(_batch_at(data, position), _Damage):
                return True
        position = data.find(_CHECKSUM_HEAD, position + 1)
    return False


def _open_error(path: str, exc: OSError) -> StoreFileError:
    if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
        return StoreFileError(
            f"the FileStore file {path!r} is a symbolic link, which a FileStore never "
            "follows (another user could point it anywhere): give the file's real path"
        )
    return StoreFileError(f"cannot open the FileStore file {path!r}: {exc.strerror or exc}")


class _Log:
    """One open descriptor on the log file and this handle's replay of it.

    Kept apart from ``FileStore`` so that a finalizer can release it without
    keeping the store alive.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        # Owner-only (PyTorch's 0644 lets every user read the job's keys), and
        # never through a symbolic link planted at the path.
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            self.fd = os.open(path, flags, 0o600)
        except OSError as exc:
            raise _open_error(path, exc) from exc
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            raise StoreFileError(f"the FileStore file {path!r} is not a regular file")
        # flock() locks belong to the open file, so threads sharing this
        # descriptor need a lock of their own.
        self.lock = threading.Lock()
        self.replayed = 0
        self.values: dict[bytes, bytes] = {}
        self.queues: dict[bytes, deque[bytes]] = {}

    @contextlib.contextmanager
    def synced(self, exclusive: bool = False) -> Iterator[None]:
        """Hold the file lock, shared or exclusive, with the replay up to date."""
        with self.lock:
            if self.fd < 0:
                raise StoreError(f"the FileStore on {self.path!r} is closed")
            if not exclusive and os.fstat(self.fd).st_size == self.replayed:
                # Nothing was appended since the last replay: the memory is current.
                yield
                return
            fcntl.flock(self.fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                if not self._catch_up(may_truncate=exclusive):
                    # A torn tail: only the exclusive lock may cut it (flock
                    # converts the lock; catching up again covers the gap).
                    fcntl.flock(self.fd, fcntl.LOCK_EX)
                    self._catch_up(may_truncate=True)
                yield
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _catch_up(self, may_truncate: bool) -> bool:
        """Replay what was appended since the last replay (file lock held).

        Returns ``False`` when a torn tail is left for the exclusive lock to cut.
        """
        size = os.fstat(self.fd).st_size
        if size < self.replayed:
            raise StoreError(
                f"the FileStore file {self.path!r} shrank to {size} bytes, below the "
                f"{self.replayed} this handle has read: was it truncated or replaced?"
            )
        try:
            data = os.pread(self.fd, size - self.replayed, self.replayed)
        except OSError as exc:
            raise StoreFileError(f"cannot read the FileStore file {self.path!r}: {exc}") from exc
        damage = self._replay(data)
        if damage is None:
            return True
        if not damage.cut_short or _intact_batch_after(data, damage.offset):
            raise StoreError(
                f"the FileStore file {self.path!r} is corrupt at byte {self.replayed}: "
                f"{damage.problem}; handles read no further (remove the file to start afresh)"
            )
        if not may_truncate:
            return False
        try:
            os.ftruncate(self.fd, self.replayed)
        except OSError as exc:
            raise StoreFileError(
                f"cannot truncate the torn tail of the FileStore file {self.path!r}: {exc}"
            ) from exc
        _log.warning(
            "FileStore %r: truncated a torn tail of %d bytes at byte %d (%s: a write cut "
            "short by a crash or a full disk; it was never visible)",
            self.path,
            size - self.replayed,
            self.replayed,
            damage.problem,
        )
        return True

    def _replay(self, data: bytes) -> _Damage | None:
        """Apply the intact records of ``data``, which starts where the replay stopped."""
        records, end, damage = _parse(data)
        self._apply(records)
        self.replayed += end
        return damage

    def _apply(self, records: Iterable[_Record]) -> None:
        for key, value in records:
            if key.startswith(_DELETE):
                self.values.pop(key[len(_DELETE) :], None)
            elif key.startswith(_QUEUE_PUSH):
                self.queues.setdefault(key[len(_QUEUE_PUSH) :], deque()).append(value)
            elif key.startswith(_QUEUE_POP):
                queue = self.queues.get(key[len(_QUEUE_POP) :])
                if queue:
                    queue.popleft()
            else:
                self.values[key] = value

    def append(self, *records: _Record) -> None:
        """Append ``records`` as one batch and apply them (inside ``synced(exclusive=True)``)."""
        blob = _encode(records)
        view = memoryview(blob)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            # What was written is a torn tail: the next exclusive lock cuts it.
            raise StoreFileError(
                f"cannot write to the FileStore file {self.path!r}: {exc}"
            ) from exc
        self._apply(records)
        self.replayed += len(blob)

    def bump(self, key: bytes, amount: int) -> int:
        """Add to the counter at ``key`` (inside ``synced(exclusive=True)``)."""
        total = counter_after_add(key, self.values.get(key), amount)
        self.append((key, str(total).encode()))
        return total

    def exists(self, key: bytes) -> bool:
        """Whether ``key`` holds a value or a non-empty queue (as PyTorch's stores)."""
        return key in self.values or bool(self.queues.get(key))

    def release(self, world_size: int) -> None:
        """Close this handle; the last of ``world_size`` users removes the file, as PyTorch."""
        try:
            with self.synced(exclusive=True):
                finished = self.bump(_CLEANUP, 1)
                users = self.bump(_REFCOUNT, -1)
                if users == 0 and 0 <= world_size <= finished and self._still_at_path():
                    os.remove(self.path)
        finally:
            with self.lock:
                os.close(self.fd)
                self.fd = -1

    def _still_at_path(self) -> bool:
        """Whether ``path`` still names this file (and not one created since)."""
        try:
            named = os.stat(self.path)
        except FileNotFoundError:
            return False
        opened = os.fstat(self.fd)
        return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


class FileStore(Store):
    """A store kept in ``file_name`` and shared by every process that opens it.

    POSIX only: processes exclude each other with ``fcntl.flock``, which also
    requires a file system where ``flock`` works across the machines involved.
    ``world_size`` is PyTorch's: once that many handles have been closed and
    none is open, the last one closing removes the file (-1: never).

    The file holds PyTorch's ``FileStore`` records, each write led by a
    checksum record that PyTorch ignores, and grows with every write. A torn
    tail (a write cut short) is truncated, with a warning; any other damage
    raises :class:`~tp_store.StoreError`. The file is created readable by its
    owner only, and a symbolic link at ``file_name`` is refused: errors
    opening, reading or writing it raise :class:`~tp_store.StoreFileError`,
    naming it.

    Blocking operations poll the file: the standard library has no portable way
    to be told that another process appended to it (and inotify misses remote
    writers on network file systems), so waits re-read it after a backoff that
    starts at 1 ms and doubles up to 50 ms.

    A handle must not be used across ``fork()``: the child shares its file lock.
    Open a new ``FileStore`` in the child instead.
    """

    def __init__(
        self,
        file_name: str | os.PathLike[str],
        world_size: int = -1,
        timeout: Timeout = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(timeout)
        world_size = int_argument(world_size, "world_size", -1, INT64_MAX)
        if world_size == 0:
            raise ValueError("world_size must be -1 (unknown) or positive, got 0")
        self._file_name = os.fspath(file_name)
        self._world_size = world_size
        self._log = _Log(self._file_name)
        with self._log.synced(exclusive=True):
            self._log.bump(_REFCOUNT, 1)
        self._release = weakref.finalize(self, self._log.release, world_size)

    @property
    def file_name(self) -> str:
        """The path of the shared file."""
        return self._file_name

    @property
    def path(self) -> str:
        """The path of the shared file (PyTorch's name for :attr:`file_name`)."""
        return self._file_name

    @property
    def world_size(self) -> int:
        """How many handles must close before the file is removed (-1: never)."""
        return self._world_size

    def has_extended_api(self) -> bool:
        """True: ``append`` is native, and ``multi_get`` and ``multi_set`` are ``get`` and
        ``set`` per key."""
        return True

    def clone(self) -> FileStore:
        """A new handle (with its own descriptor and lock) on the same file."""
        return FileStore(self._file_name, self._world_size, self.timeout)

    def close(self) -> None:
        """Release this handle (also done when it is garbage collected)."""
        self._release()

    def _poll(self, attempt: Callable[[], _T | None], seconds: float) -> _T | None:
        """Call ``attempt`` until it returns a result, or ``None`` after ``seconds``."""
        deadline = time.monotonic() + seconds
        delay = _FIRST_POLL_DELAY
        while (result := attempt()) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, _MAX_POLL_DELAY)
        return result

    def set(self, key: Data, value: Data) -> None:
        """Store ``value`` under ``key``."""
        record = (_USER + as_bytes(key, "key"), as_bytes(value))
        with self._log.synced(exclusive=True):
            self._log.append(record)

    def get(self, key: Data) -> bytes:
        """Return the value of ``key``, waiting up to the default timeout for it."""
        raw_key = as_bytes(key, "key")
        stored = _USER + raw_key
        seconds = self._deadline_seconds(None)

        def attempt() -> bytes | None:
            with self._log.synced():
                return self._log.values.get(stored)

        value = self._poll(attempt, seconds)
        if value is None:
            raise timeout_error([raw_key], seconds)
        return value

    def add(self, key: Data, amount: int) -> int:
        """Add ``amount`` to the decimal counter at ``key`` (missing = 0); return the sum."""
        stored = _USER + as_bytes(key, "key")
        with self._log.synced(exclusive=True):
            return self._log.bump(stored, amount)

    def compare_set(self, key: Data, expected: Data, desired: Data) -> bytes:
        """Set ``key`` to ``desired`` iff it holds ``expected``; return the value after."""
        stored = _USER + as_bytes(key, "key")
        raw_expected, raw_desired = as_bytes(expected, "expected"), as_bytes(desired, "desired")
        with self._log.synced(exclusive=True):
            to_store, result = compare_set_result(
                self._log.values.get(stored), raw_expected, raw_desired
            )
            if to_store is not None:
                self._log.append((stored, to_store))
        return result

    def _missing(self, raw_keys: Sequence[bytes]) -> list[bytes]:
        with self._log.synced():
            return [key for key in raw_keys if not self._log.exists(_USER + key)]

    def wait(self, keys: Sequence[Data], timeout: Timeout | None = None) -> None:
        """Block until every key exists, or raise ``StoreTimeoutError`` naming the missing ones."""
        raw_keys = as_keys(keys)
        seconds = self._deadline_seconds(timeout)
        if self._poll(lambda: None if self._missing(raw_keys) else True, seconds) is None:
            missing = self._missing(raw_keys)
            if missing:
                raise timeout_error(missing, seconds)

    def check(self, keys: Sequence[Data]) -> bool:
        """Whether every key exists, without blocking."""
        return not self._missing(as_keys(keys))

    def delete_key(self, key: Data) -> bool:
        """Delete ``key``; return whether it existed."""
        stored = _USER + as_bytes(key, "key")
        with self._log.synced(exclusive=True):
            existed = stored in self._log.values
            if existed:
                self._log.append((_DELETE + stored, b""))
        return existed

    def num_keys(self) -> int:
        """The number of keys in the file, counting ``refcount/`` as PyTorch does."""
        with self._log.synced():
            return len(self._log.values)

    def append(self, key: Data, value: Data) -> None:
        """Append ``value`` to the value of ``key``, creating it if missing."""
        stored, raw_value = _USER + as_bytes(key, "key"), as_bytes(value)
        with self._log.synced(exclusive=True):
            self._log.append((stored, self._log.values.get(stored, b"") + raw_value))

    def list_keys(self) -> list[str]:
        """The user keys, as ``str`` (without ``refcount/`` and ``cleanup/``)."""
        with self._log.synced():
            keys = list(self._log.values)
        return [key_text(key[len(_USER) :]) for key in keys if key.startswith(_USER)]

    def queue_push(self, key: Data, value: Data) -> None:
        """Push ``value`` onto the queue at ``key``."""
        record = (_QUEUE_PUSH + _USER + as_bytes(key, "key"), as_bytes(value))
        with self._log.synced(exclusive=True):
            self._log.append(record)

    def _try_pop(self, stored: bytes) -> bytes | None:
        with self._log.synced():
            if not self._log.queues.get(stored):
                return None  # the usual answer while polling: no exclusive lock needed
        with self._log.synced(exclusive=True):
            queue = self._log.queues.get(stored)
            if not queue:
                return None
            value = queue[0]
            self._log.append((_QUEUE_POP + stored, b""))
        return value

    def queue_pop(self, key: Data, block: bool = True) -> bytes:
        """Pop the oldest value of the queue at ``key``.

        With ``block`` it waits up to the default timeout (``StoreTimeoutError``);
        without, an empty queue raises ``QueueEmptyError``.
        """
        raw_key = as_bytes(key, "key")
        stored = _USER + raw_key
        if not block:
            value = self._try_pop(stored)
            if value is None:
                raise QueueEmptyError(f"queue {key_text(raw_key)!r} is empty")
            return value
        seconds = self._deadline_seconds(None)
        value = self._poll(lambda: self._try_pop(stored), seconds)
        if value is None:
            raise timeout_error([raw_key], seconds, "a value in queue")
        return value

    def queue_len(self, key: Data) -> int:
        """The number of values in the queue at ``key``."""
        stored = _USER + as_bytes(key, "key")
        with self._log.synced():
            return len(self._log.queues.get(stored, ()))

    def __repr__(self) -> str:
        return f"FileStore({self._file_name!r}, world_size={self._world_size})"
