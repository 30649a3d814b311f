"""etcd's messages as protocol buffers in the gateway's JSON shape (``client.messages``)."""

from __future__ import annotations

import base64
import contextlib
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tp_rdzv_etcd import EtcdStore
from tp_rdzv_etcd.client import messages
from tp_rdzv_etcd.client.messages import SCHEMA, Field, decode, encode
from tp_rdzv_etcd.layout import b64
from tp_rdzv_etcd.local import LocalEtcd

_INT64 = st.integers(-(2**63), 2**63 - 1)


def _value(field: Field, depth: int) -> st.SearchStrategy[Any]:
    """A JSON value of ``field`` as the gateway writes it (defaults included)."""
    if field.kind == "message":
        return _body(field.message, depth + 1)
    if field.kind == "bytes":
        return st.binary(max_size=40).map(lambda raw: base64.b64encode(raw).decode())
    if field.kind == "string":
        return st.text(max_size=20)
    if field.kind == "bool":
        return st.booleans()
    if field.kind == "enum":
        return st.sampled_from(field.enum)
    if field.kind == "uint":
        return st.integers(0, 2**64 - 1).map(str)
    return _INT64.map(str)


def _body(message: str, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    """Any body of ``message``, nesting messages at most 4 deep."""
    fields = {
        name: field
        for name, field in SCHEMA[message].items()
        if depth < 4 or field.kind != "message"
    }
    strategies = {
        name: st.lists(_value(field, depth), max_size=3) if field.repeated else _value(field, depth)
        for name, field in fields.items()
    }
    return st.fixed_dictionaries({}, optional=strategies)


def _as_gateway_writes(message: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the numbers and flags at their defaults (the gateway leaves them out)."""
    out: dict[str, Any] = {}
    for name, value in body.items():
        field = SCHEMA[message][name]
        if field.kind == "message":
            if field.repeated:
                if value:
                    out[name] = [_as_gateway_writes(field.message, item) for item in value]
            else:
                out[name] = _as_gateway_writes(field.message, value)
        elif field.repeated:
            if value:
                out[name] = value
        elif field.kind in ("bytes", "string"):
            out[name] = value  # written when given, empty or not (a compare's value may be)
        elif value not in (False, "0", field.enum[0] if field.enum else None):
            out[name] = value
    return out


@pytest.mark.parametrize("message", sorted(SCHEMA))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_message_decodes_to_what_was_encoded(message: str, data: st.DataObject) -> None:
    body = data.draw(_body(message))
    assert decode(message, encode(message, body)) == _as_gateway_writes(message, body)


def test_bytes_the_way_etcd_encodes_them() -> None:
    # A RangeRequest for key "a" with limit 1 and keys_only, as protoc's code writes it.
    assert encode("RangeRequest", {"key": b64(b"a"), "limit": 1, "keys_only": True}) == (
        b"\x0a\x01a\x18\x01\x40\x01"
    )
    # Negative int64s are ten-byte varints; packed repeated enums one length-delimited field.
    assert encode("KeyValue", {"lease": -1}) == b"\x30" + b"\xff" * 9 + b"\x01"
    assert encode("WatchCreateRequest", {"filters": ["NODELETE"]}) == b"\x2a\x01\x01"
    assert decode("KeyValue", b"\x30" + b"\xff" * 9 + b"\x01") == {"lease": "-1"}


def test_unknown_fields_are_skipped() -> None:
    # field 15 as a varint, a fixed64, a fixed32 and bytes, then the key
    raw = b"\x78\x05" + b"\x79" + b"\0" * 8 + b"\x7d" + b"\0" * 4 + b"\x7a\x02hi" + b"\x0a\x01k"
    assert decode("KeyValue", raw) == {"key": b64(b"k")}


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_value_error(data: bytes) -> None:
    for message in ("TxnResponse", "WatchResponse", "RangeResponse"):
        with contextlib.suppress(ValueError):
            decode(message, data)


def test_truncations_and_bad_wire_types_are_value_errors() -> None:
    whole = encode("RangeResponse", {"kvs": [{"key": b64(b"key"), "value": b64(b"value")}]})
    with pytest.raises(ValueError, match="truncated"):
        decode("RangeResponse", whole[:-1])
    with pytest.raises(ValueError, match="wire type 3"):
        decode("RangeResponse", b"\x0b")  # a group start
    with pytest.raises(ValueError, match="varint"):
        decode("RangeResponse", b"\x20" + b"\xff" * 11)
    with pytest.raises(ValueError, match="as bytes"):
        decode("RangeResponse", b"\x22\x00")  # count (a varint) sent length-delimited


def test_nesting_is_bounded() -> None:
    # Transactions' answers inside transactions' answers, deeper than MAX_DEPTH.
    deep = b""
    for _ in range(messages.MAX_DEPTH):
        op = b"\x22" + _len(deep) + deep  # ResponseOp.response_txn
        deep = b"\x1a" + _len(op) + op  # TxnResponse.responses
    with pytest.raises(ValueError, match="nested deeper"):
        decode("TxnResponse", deep)


def _len(raw: bytes) -> bytes:
    return messages._varint(len(raw))


def test_a_length_beyond_the_data_is_refused_before_anything_is_read() -> None:
    # A header claiming 2 GiB, in a message of a megabyte.
    garbage = b"\x0a\xff\xff\xff\xff\x07" + b"\x00" * (1 << 20)
    with pytest.raises(ValueError, match="truncated"):
        decode("RangeResponse", garbage)


def test_unknown_fields_and_kinds_in_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="no field 'nope'"):
        encode("RangeRequest", {"nope": 1})
    with pytest.raises(ValueError, match="none of"):
        encode("RangeRequest", {"sort_order": "SIDEWAYS"})
    with pytest.raises(ValueError, match="base64"):
        encode("RangeRequest", {"key": 5})


@pytest.mark.etcd
def test_both_transports_answer_alike(etcd1: LocalEtcd) -> None:
    """The same requests over gRPC and through the gateway get the same answers."""
    prefix = f"/transports/{uuid.uuid4().hex}/"
    stores = {
        name: EtcdStore(etcd1.endpoints, prefix, transport=name) for name in ("grpc", "gateway")
    }
    first = stores["grpc"]
    for index in range(3):
        first.queue_push("q", f"value {index}")
    first.set("k", "v")
    key = b64(first.prefix)
    end = b64(first.prefix[:-1] + b"0")
    requests: list[tuple[str, dict[str, Any]]] = [
        ("/v3/kv/range", {"key": key, "range_end": end}),
        ("/v3/kv/range", {"key": key, "range_end": end, "count_only": True}),
        ("/v3/kv/range", {"key": key, "range_end": end, "sort_order": "DESCEND", "limit": 2}),
        (
            "/v3/kv/txn",
            {
                "compare": [{"key": key, "target": "CREATE", "result": "EQUAL"}],
                "success": [{"request_range": {"key": key}}],
                "failure": [{"request_range": {"key": key, "range_end": end, "keys_only": True}}],
            },
        ),
    ]
    try:
        for path, body in requests:
            answers = [store._call(path, body) for store in stores.values()]
            for answer in answers:
                _drop_headers(answer)
            assert answers[0] == answers[1], path
    finally:
        for store in stores.values():
            store.close()


def _drop_headers(answer: Any) -> None:
    """Take out the headers (which name the member and its raft term, not the answer)."""
    if isinstance(answer, dict):
        answer.pop("header", None)
        for value in answer.values():
            _drop_headers(value)
    elif isinstance(answer, list):
        for item in answer:
            _drop_headers(item)
