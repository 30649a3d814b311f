"""``FileStore``: a store shared by every process that opens the same file (POSIX only).

The file is an append-only log in the format of PyTorch's ``FileStore``: each
record is a key then a value, each a native-endian ``u32`` length followed by
the bytes. User keys are stored as ``"/" + key``; a record whose key starts
with ``"-"`` deletes the key that follows; ``refcount/`` and ``cleanup/``
count the handles opened and closed. Queue records (which PyTorch's
``FileStore`` does not have) use the keys ``queue-push/...`` and
``queue-pop/...``, which PyTorch reads as ordinary internal keys.

Every handle replays the log incrementally into memory. Readers hold a shared
``flock`` while replaying; writers hold an exclusive one from their replay
through their append, which makes read-modify-write operations atomic across
processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from .base import DEFAULT_TIMEOUT, Data, Store, Timeout, as_bytes
from .errors import QueueEmptyError, StoreError
from .semantics import compare_set_result, counter_after_add, key_text, timeout_error

_T = TypeVar("_T")

_LENGTH = struct.Struct("=I")
_USER = b"/"
_DELETE = b"-"
_REFCOUNT = b"refcount/"
_CLEANUP = b"cleanup/"
_QUEUE_PUSH = b"queue-push/"
_QUEUE_POP = b"queue-pop/"

_FIRST_POLL_DELAY = 0.001
_MAX_POLL_DELAY = 0.05


def _encode(records: Iterable[tuple[bytes, bytes]]) -> bytes:
    parts: list[bytes] = []
    for record in records:
        for field in record:
            if len(field) > 0xFFFFFFFF:
                raise ValueError(
                    f"FileStore keys and values are limited to 4 GiB, got {len(field)}"
                )
            parts += (_LENGTH.pack(len(field)), field)
    return b"".join(parts)


def _field(data: bytes, offset: int) -> tuple[bytes, int] | None:
    """The field at ``offset`` and the offset after it, or ``None`` if incomplete."""
    start = offset + _LENGTH.size
    if start > len(data):
        return None
    (length,) = _LENGTH.unpack_from(data, offset)
    end = start + length
    if end > len(data):
        return None
    return data[start:end], end


def _decode(data: bytes) -> Iterator[tuple[bytes, bytes, int]]:
    """The complete records at the start of ``data``, each with the offset it ends at."""
    offset = 0
    while (key := _field(data, offset)) is not None and (value := _field(data, key[1])) is not None:
        offset = value[1]
        yield key[0], value[0], offset


class _Log:
    """One open descriptor on the log file and this handle's replay of it.

    Kept apart from ``FileStore`` so that a finalizer can release it without
    keeping the store alive.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
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
                size = os.fstat(self.fd).st_size
                self._replay(os.pread(self.fd, size - self.replayed, self.replayed))
                yield
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _replay(self, data: bytes) -> None:
        """Apply the complete records of ``data``, which starts where the replay stopped."""
        consumed = 0
        for key, value, end in _decode(data):
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
            consumed = end
        self.replayed += consumed

    def append(self, *records: tuple[bytes, bytes]) -> None:
        """Append ``records`` and apply them (inside ``synced(exclusive=True)``)."""
        blob = _encode(records)
        view = memoryview(blob)
        while view:
            view = view[os.write(self.fd, view) :]
        self._replay(blob)

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
    The file uses PyTorch's ``FileStore`` format and grows with every write.
    ``world_size`` is PyTorch's: once that many handles have been closed and
    none is open, the last one closing removes the file (-1: never).

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
        if world_size == 0 or world_size < -1:
            raise ValueError(f"world_size must be -1 (unknown) or positive, got {world_size}")
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
        raw_keys = [as_bytes(key, "key") for key in keys]
        seconds = self._deadline_seconds(timeout)
        if self._poll(lambda: None if self._missing(raw_keys) else True, seconds) is None:
            missing = self._missing(raw_keys)
            if missing:
                raise timeout_error(missing, seconds)

    def check(self, keys: Sequence[Data]) -> bool:
        """Whether every key exists, without blocking."""
        return not self._missing([as_bytes(key, "key") for key in keys])

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
