"""Where a store key's data lives in etcd's flat key space.

Every store key ``k`` owns the etcd range ``<prefix><escaped k>/``:

- ``<prefix><escaped k>/v`` holds its value;
- ``<prefix><escaped k>/q/<random id>`` holds one queued value each, oldest
  first by etcd's ``create_revision``;
- ``<prefix><escaped k>/w/...`` holds the wills of store sessions that push
  onto the queue of ``k`` (see :mod:`.wills`): they sort after the value and
  the queue, so ``[home, home + "w")`` is exactly what makes ``k`` exist.

The escaping removes every ``/`` from ``k``, so the range of one key never
contains the range of another; one etcd range (or one watch) therefore covers
"``k`` has a value or a non-empty queue", which is what ``wait`` and ``check``
mean by "exists".
"""

from __future__ import annotations

import base64
import re
import uuid

_ESCAPED = re.compile(rb"%(25|2F)")
_UNESCAPE = {b"25": b"%", b"2F": b"/"}
_VALUE = b"v"
_QUEUE = b"q/"
_WILLS = b"w/"
_WILL_RECORD = b"r/"
_WILL_MARK = b"l/"


def escape(key: bytes) -> bytes:
    """``key`` without ``/`` (and with ``%`` escaped, so the escaping can be undone)."""
    return key.replace(b"%", b"%25").replace(b"/", b"%2F")


def unescape(escaped: bytes) -> bytes:
    """The key :func:`escape` turned into ``escaped``."""
    return _ESCAPED.sub(lambda match: _UNESCAPE[match.group(1)], escaped)


def range_end(prefix: bytes) -> bytes:
    """The etcd ``range_end`` that makes a request cover every key starting with ``prefix``."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return b"\x00"  # etcd's "to the end of the key space"
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def never_created(key: bytes) -> dict[str, str]:
    """A transaction's compare: the etcd ``key`` does not exist."""
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def b64(raw: bytes) -> str:
    """``raw`` as the gateway's JSON carries bytes."""
    return base64.b64encode(raw).decode("ascii")


def unb64(text: str) -> bytes:
    """The bytes a gateway JSON string carries."""
    return base64.b64decode(text)


class KeyLayout:
    """The etcd keys of the store keys under one prefix."""

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix

    def home(self, key: bytes) -> bytes:
        """The range owned by ``key``: its value and its queue."""
        return self.prefix + escape(key) + b"/"

    def family(self, key_prefix: bytes) -> bytes:
        """The start of the etcd range of every store key that starts with ``key_prefix``."""
        return self.prefix + escape(key_prefix)

    def value(self, key: bytes) -> bytes:
        """The etcd key holding the value of ``key``."""
        return self.home(key) + _VALUE

    def queue(self, key: bytes) -> bytes:
        """The range holding the queued values of ``key``."""
        return self.home(key) + _QUEUE

    def new_queue_item(self, key: bytes) -> bytes:
        """A fresh etcd key for one value pushed onto the queue of ``key``."""
        return self.queue(key) + uuid.uuid4().hex.encode()

    def existence_end(self, key: bytes) -> bytes:
        """The ``range_end`` of ``home(key)`` that covers its value and queue, not its wills."""
        return self.home(key) + b"w"  # "q/..." < "v" < "w" < "w/..."

    def wills(self, key: bytes) -> bytes:
        """The range holding the wills that push onto the queue of ``key``."""
        return self.home(key) + _WILLS

    def will_marks(self, key: bytes) -> bytes:
        """The range of the lease-attached marks of those wills."""
        return self.wills(key) + _WILL_MARK

    def will_records(self, key: bytes) -> bytes:
        """The range of the records (the values to push) of those wills."""
        return self.wills(key) + _WILL_RECORD

    def will_record(self, key: bytes, lease: int, number: int) -> bytes:
        """The record of will ``number`` of the session with ``lease``, onto the queue of ``key``.

        A session's wills sort in the order it added them.
        """
        return self.will_records(key) + b"%016x/%08x" % (lease, number)

    def will_mark(self, record: bytes) -> bytes:
        """The mark that goes with the will record ``record`` (same home, same suffix)."""
        head, _, suffix = record.rpartition(_WILLS + _WILL_RECORD)
        return head + _WILLS + _WILL_MARK + suffix

    def store_key(self, etcd_key: bytes) -> bytes | None:
        """The store key whose value ``etcd_key`` holds; ``None`` for anything else."""
        if not etcd_key.startswith(self.prefix) or not etcd_key.endswith(b"/" + _VALUE):
            return None
        escaped = etcd_key[len(self.prefix) : -len(_VALUE) - 1]
        if b"/" in escaped:
            return None  # a queue item whose id happens to end in /v (ours never do)
        return unescape(escaped)
