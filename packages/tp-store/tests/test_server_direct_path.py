"""What a client sends as a rule, through a real socket: answered in order, parked, woken.

The server answers the usual requests without its general parser (see
``ServerSession.answer``); these tests hold it to what a client sees: every
request of a packet answered in the order sent, whichever path serves it, a
parked wait woken by another connection, and the server's counters.
"""

from __future__ import annotations

from raw_client import Raw, wait_until

from tp_store.protocol import (
    Add,
    Check,
    CheckReply,
    CompareSet,
    Get,
    MultiGet,
    Ping,
    ReplyKind,
    Set,
    Validate,
    Wait,
    WaitGet,
    WaitReply,
)
from tp_store.server.store_server import ServerThread


def test_a_packet_of_requests_is_answered_in_the_order_sent(server: ServerThread) -> None:
    raw = Raw(server.server.port, validate=False)
    raw.send(
        Validate().encode()
        + Ping(7).encode()
        + Set.frame(b"/k", b"v")
        + Add.frame(b"/n", 2) * 3
        + Get.frame(b"/k")
        + CompareSet.frame(b"/k", b"v", b"w")  # the general path's, between direct ones
        + Get.frame(b"/k")
        + MultiGet((b"/k", b"/n")).encode()
        + Check((b"/k",)).encode()
        + Check((b"/missing",)).encode()
        + WaitGet.frame((b"/n",))
        + Wait.frame((b"/k",))
        + Ping(8).encode()
    )
    assert raw.read_reply(ReplyKind.U32) == 7
    assert [raw.read_reply(ReplyKind.I64) for _ in range(3)] == [2, 4, 6]
    assert raw.read_reply(ReplyKind.BYTES) == b"v"
    assert raw.read_reply(ReplyKind.BYTES) == b"w"
    assert raw.read_reply(ReplyKind.BYTES) == b"w"
    assert raw.read_reply(ReplyKind.VALUES, 2) == [b"w", b"6"]
    assert raw.read_reply(ReplyKind.U8) == CheckReply.READY
    assert raw.read_reply(ReplyKind.U8) == CheckReply.NOT_READY
    assert raw.read_reply(ReplyKind.WAIT_GET, 1) == (WaitReply.STOP_WAITING, [b"6"])
    assert raw.read_reply(ReplyKind.U8) == WaitReply.STOP_WAITING
    assert raw.read_reply(ReplyKind.U32) == 8
    ops = server.server.stats()["ops"]
    assert (ops["validate"], ops["ping"], ops["add"], ops["get"], ops["check"]) == (1, 2, 3, 2, 2)


def test_a_parked_wait_is_woken_by_another_connection_and_the_next_request_served(
    server: ServerThread,
) -> None:
    port = server.server.port
    waiting, writer = Raw(port), Raw(port)
    waiting.send(Wait.frame((b"/late",)))
    wait_until(lambda: server.server.stats()["waiters_parked"] == 1, "the wait is parked")
    writer.send(Set.frame(b"/late", b"v"))
    assert waiting.read_reply(ReplyKind.U8) == WaitReply.STOP_WAITING
    assert waiting.request(Get.frame(b"/late"), ReplyKind.BYTES) == b"v"
    assert server.server.stats()["waiters_parked"] == 0


def test_many_waits_of_one_key_are_all_woken_by_one_set(server: ServerThread) -> None:
    port = server.server.port
    waiters = [Raw(port) for _ in range(50)]
    for raw in waiters:
        raw.ping()  # the handshake is done: the wait below is the direct path's
        raw.send(WaitGet.frame((b"/id",)))
    wait_until(lambda: server.server.stats()["waiters_parked"] == 50, "every wait is parked")
    Raw(port).send(Set.frame(b"/id", b"unique"))
    for raw in waiters:
        assert raw.read_reply(ReplyKind.WAIT_GET, 1) == (WaitReply.STOP_WAITING, [b"unique"])
    assert server.server.stats()["waiters_parked"] == 0


def test_the_handshake_in_one_packet_is_answered_and_admits(server: ServerThread) -> None:
    # What PyTorch's client sends first: VALIDATE and a PING in one write.
    raw = Raw(server.server.port, validate=False)
    assert raw.request(Validate().encode() + Ping(9).encode(), ReplyKind.U32) == 9
    assert raw.request(Add.frame(b"/n", 1), ReplyKind.I64) == 1
    ops = server.server.stats()["ops"]
    assert (ops["validate"], ops["ping"], ops["add"]) == (1, 1, 1)


def test_validate_with_the_start_of_another_request_is_served_when_it_completes(
    server: ServerThread,
) -> None:
    # Ten bytes, as the handshake's, but not a PING after the VALIDATE.
    raw = Raw(server.server.port, validate=False)
    first = Get.frame(b"/missing")
    raw.send(Validate().encode() + first[:5])
    raw.send(first[5:])
    assert raw.read_reply(ReplyKind.BYTES) == b""
    raw.ping()
    assert server.server.stats()["ops"]["validate"] == 1
