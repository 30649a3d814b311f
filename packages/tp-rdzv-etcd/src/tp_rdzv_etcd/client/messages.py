"""etcd's v3 messages as protocol buffers, read and written in the JSON gateway's shape.

:class:`~.store.EtcdStore` builds its requests as the JSON gateway takes
them (bytes in base64, 64-bit integers as decimal strings, enums by name)
and reads answers in the shape the gateway gives them. Over gRPC the same
dicts are encoded here as the protocol buffers of etcd's ``rpc.proto`` and
``kv.proto`` (the fields the store uses, numbered as etcd numbers them), and
answers decoded back into the gateway's shape: the store's code is one for
both transports, and no generated code (or pinned ``protobuf`` version) is
needed.

Decoding is bounded: it reads each byte once, nests at most
:data:`MAX_DEPTH` messages deep, skips fields it does not know (as protocol
buffers allow) and raises :class:`ValueError` on anything malformed.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]

#: The deepest nesting a decoded answer may have (a transaction inside a
#: transaction's answer holding key-values is 6 deep).
MAX_DEPTH = 12

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True)
class Field:
    """One field of a message: its number and kind (``bytes``, ``string``, ``int``
    (int64), ``uint`` (uint64), ``bool``, ``enum`` (its names in order) or a message)."""

    number: int
    kind: str
    enum: tuple[str, ...] = ()
    message: str = ""
    repeated: bool = False


def _enum(number: int, *names: str, repeated: bool = False) -> Field:
    return Field(number, "enum", enum=names, repeated=repeated)


def _message(number: int, name: str, *, repeated: bool = False) -> Field:
    return Field(number, "message", message=name, repeated=repeated)


_HEADER = _message(1, "ResponseHeader")
_INT, _BYTES, _BOOL = "int", "bytes", "bool"

#: The messages, by name: their fields by the gateway's JSON names.
SCHEMA: dict[str, dict[str, Field]] = {
    "ResponseHeader": {
        "cluster_id": Field(1, "uint"),
        "member_id": Field(2, "uint"),
        "revision": Field(3, _INT),
        "raft_term": Field(4, "uint"),
    },
    "KeyValue": {
        "key": Field(1, _BYTES),
        "create_revision": Field(2, _INT),
        "mod_revision": Field(3, _INT),
        "version": Field(4, _INT),
        "value": Field(5, _BYTES),
        "lease": Field(6, _INT),
    },
    "RangeRequest": {
        "key": Field(1, _BYTES),
        "range_end": Field(2, _BYTES),
        "limit": Field(3, _INT),
        "revision": Field(4, _INT),
        "sort_order": _enum(5, "NONE", "ASCEND", "DESCEND"),
        "sort_target": _enum(6, "KEY", "VERSION", "CREATE", "MOD", "VALUE"),
        "serializable": Field(7, _BOOL),
        "keys_only": Field(8, _BOOL),
        "count_only": Field(9, _BOOL),
    },
    "RangeResponse": {
        "header": _HEADER,
        "kvs": _message(2, "KeyValue", repeated=True),
        "more": Field(3, _BOOL),
        "count": Field(4, _INT),
    },
    "PutRequest": {
        "key": Field(1, _BYTES),
        "value": Field(2, _BYTES),
        "lease": Field(3, _INT),
        "prev_kv": Field(4, _BOOL),
    },
    "PutResponse": {"header": _HEADER, "prev_kv": _message(2, "KeyValue")},
    "DeleteRangeRequest": {
        "key": Field(1, _BYTES),
        "range_end": Field(2, _BYTES),
        "prev_kv": Field(3, _BOOL),
    },
    "DeleteRangeResponse": {
        "header": _HEADER,
        "deleted": Field(2, _INT),
        "prev_kvs": _message(3, "KeyValue", repeated=True),
    },
    "RequestOp": {
        "request_range": _message(1, "RangeRequest"),
        "request_put": _message(2, "PutRequest"),
        "request_delete_range": _message(3, "DeleteRangeRequest"),
        "request_txn": _message(4, "TxnRequest"),
    },
    "ResponseOp": {
        "response_range": _message(1, "RangeResponse"),
        "response_put": _message(2, "PutResponse"),
        "response_delete_range": _message(3, "DeleteRangeResponse"),
        "response_txn": _message(4, "TxnResponse"),
    },
    "Compare": {
        "result": _enum(1, "EQUAL", "GREATER", "LESS", "NOT_EQUAL"),
        "target": _enum(2, "VERSION", "CREATE", "MOD", "VALUE", "LEASE"),
        "key": Field(3, _BYTES),
        "version": Field(4, _INT),
        "create_revision": Field(5, _INT),
        "mod_revision": Field(6, _INT),
        "value": Field(7, _BYTES),
        "lease": Field(8, _INT),
        "range_end": Field(64, _BYTES),
    },
    "TxnRequest": {
        "compare": _message(1, "Compare", repeated=True),
        "success": _message(2, "RequestOp", repeated=True),
        "failure": _message(3, "RequestOp", repeated=True),
    },
    "TxnResponse": {
        "header": _HEADER,
        "succeeded": Field(2, _BOOL),
        "responses": _message(3, "ResponseOp", repeated=True),
    },
    "LeaseGrantRequest": {"TTL": Field(1, _INT), "ID": Field(2, _INT)},
    "LeaseGrantResponse": {
        "header": _HEADER,
        "ID": Field(2, _INT),
        "TTL": Field(3, _INT),
        "error": Field(4, "string"),
    },
    "LeaseRevokeRequest": {"ID": Field(1, _INT)},
    "LeaseKeepAliveRequest": {"ID": Field(1, _INT)},
    "LeaseKeepAliveResponse": {"header": _HEADER, "ID": Field(2, _INT), "TTL": Field(3, _INT)},
    "LeaseRevokeResponse": {"header": _HEADER},
    "WatchRequest": {
        "create_request": _message(1, "WatchCreateRequest"),
        "cancel_request": _message(2, "WatchCancelRequest"),
    },
    "WatchCreateRequest": {
        "key": Field(1, _BYTES),
        "range_end": Field(2, _BYTES),
        "start_revision": Field(3, _INT),
        "progress_notify": Field(4, _BOOL),
        "filters": _enum(5, "NOPUT", "NODELETE", repeated=True),
        "prev_kv": Field(6, _BOOL),
        "watch_id": Field(7, _INT),
    },
    "WatchCancelRequest": {"watch_id": Field(1, _INT)},
    "WatchResponse": {
        "header": _HEADER,
        "watch_id": Field(2, _INT),
        "created": Field(3, _BOOL),
        "canceled": Field(4, _BOOL),
        "compact_revision": Field(5, _INT),
        "cancel_reason": Field(6, "string"),
        "fragment": Field(7, _BOOL),
        "events": _message(11, "Event", repeated=True),
    },
    "Event": {
        "type": _enum(1, "PUT", "DELETE"),
        "kv": _message(2, "KeyValue"),
        "prev_kv": _message(3, "KeyValue"),
    },
}

_BY_NUMBER: dict[str, dict[int, tuple[str, Field]]] = {
    message: {field.number: (name, field) for name, field in fields.items()}
    for message, fields in SCHEMA.items()
}


# -- encoding -----------------------------------------------------------------------
def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s as protocol buffers carry them
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _scalar(field: Field, name: str, value: Any) -> int | bytes:
    """A JSON value of ``field`` as the varint or the bytes it encodes to."""
    kind = field.kind
    if kind == "bytes":
        if not isinstance(value, str):
            raise ValueError(f"{name}: base64 text expected, got {type(value).__name__}")
        return base64.b64decode(value, validate=True)
    if kind == "string":
        return str(value).encode()
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{name}: a bool expected, got {value!r}")
        return int(value)
    if kind == "enum":
        if isinstance(value, str):
            if value not in field.enum:
                raise ValueError(f"{name}: {value!r} is none of {', '.join(field.enum)}")
            return field.enum.index(value)
        return int(value)
    return int(value)  # int / uint: ints or decimal strings alike


def encode(message: str, body: Mapping[str, Any]) -> bytes:
    """``body`` (in the gateway's JSON shape) as the protocol buffer ``message``.

    Raises ``ValueError`` for a field ``message`` does not have or a value of the wrong kind.
    """
    fields = SCHEMA[message]
    out = bytearray()
    for name, value in body.items():
        field = fields.get(name)
        if field is None:
            raise ValueError(f"{message} has no field {name!r}")
        values = value if field.repeated else [value]
        if field.repeated and not isinstance(value, list):
            raise ValueError(f"{message}.{name}: a list expected")
        if field.kind == "enum" and field.repeated and values:  # packed, as proto3 packs them
            packed = b"".join(_varint(int(_scalar(field, name, item))) for item in values)
            out += _varint(field.number << 3 | _LENGTH) + _varint(len(packed)) + packed
            continue
        for item in values:
            if field.kind == "message":
                if not isinstance(item, Mapping):
                    raise ValueError(f"{message}.{name}: an object expected")
                raw: int | bytes = encode(field.message, item)
            else:
                raw = _scalar(field, f"{message}.{name}", item)
            if isinstance(raw, int):
                out += _varint(field.number << 3 | _VARINT) + _varint(raw)
            else:
                out += _varint(field.number << 3 | _LENGTH) + _varint(len(raw)) + raw
    return bytes(out)


# -- decoding -----------------------------------------------------------------------
def _read_varint(data: bytes, index: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if index >= end or shift > 63:
            raise ValueError("a truncated or oversized varint")
        byte = data[index]
        index += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, index


def _json_scalar(field: Field, number: int | bytes) -> Any:
    """A decoded value of ``field`` as the gateway writes it."""
    kind = field.kind
    if kind == "bytes":
        if not isinstance(number, bytes):
            raise ValueError("a bytes field on the wire as a varint")
        return base64.b64encode(number).decode()
    if kind == "string":
        if not isinstance(number, bytes):
            raise ValueError("a string field on the wire as a varint")
        return number.decode("utf-8", "replace")
    if isinstance(number, bytes):
        raise ValueError(f"a {kind} field on the wire as bytes")
    if kind == "bool":
        return number != 0
    if kind == "enum":
        return field.enum[number] if number < len(field.enum) else number
    if kind == "int" and number >= 1 << 63:
        number -= 1 << 64
    return str(number)  # 64-bit integers: decimal text, as in the gateway's JSON


def decode(message: str, data: bytes) -> Json:
    """The protocol buffer ``message`` in ``data``, in the gateway's JSON shape.

    Fields at their default are left out (as the gateway leaves them out);
    unknown fields are skipped. Raises ``ValueError`` on malformed bytes.
    """
    return _decode(message, data, 0, len(data), 0)


def _decode(message: str, data: bytes, index: int, end: int, depth: int) -> Json:
    if depth > MAX_DEPTH:
        raise ValueError(f"messages nested deeper than {MAX_DEPTH}")
    fields = _BY_NUMBER[message]
    out: Json = {}
    while index < end:
        tag, index = _read_varint(data, index, end)
        number, wire_type = tag >> 3, tag & 7
        payload: int | bytes
        if wire_type == _VARINT:
            payload, index = _read_varint(data, index, end)
            start = -1
        elif wire_type == _LENGTH:
            length, index = _read_varint(data, index, end)
            if length > end - index:
                raise ValueError("a truncated field (longer than its message)")
            start, index = index, index + length
            payload = b""
        elif wire_type in (_FIXED64, _FIXED32):
            index += 8 if wire_type == _FIXED64 else 4
            if index > end:
                raise ValueError("a truncated fixed-size field")
            continue  # etcd's messages have none: an unknown field
        else:
            raise ValueError(f"wire type {wire_type} (groups are not used by etcd)")
        known = fields.get(number)
        if known is None:
            continue
        name, field = known
        if field.kind == "message":
            if start < 0:
                raise ValueError(f"{message}.{name} on the wire as a varint")
            value: Any = _decode(field.message, data, start, index, depth + 1)
        elif start >= 0 and field.kind == "enum" and field.repeated:
            packed: list[Any] = []
            at = start
            while at < index:
                item, at = _read_varint(data, at, index)
                packed.append(_json_scalar(field, item))
            out.setdefault(name, []).extend(packed)
            continue
        else:
            value = _json_scalar(field, data[start:index] if start >= 0 else payload)
        if field.repeated:
            out.setdefault(name, []).append(value)
        elif not _is_default(field, value):
            out[name] = value
    return out


def _is_default(field: Field, value: Any) -> bool:
    """Whether a scalar holds its default, which the gateway's JSON leaves out."""
    if field.kind == "bool":
        return value is False
    if field.kind in ("int", "uint"):
        return bool(value == "0")
    return field.kind == "enum" and value == field.enum[0]
