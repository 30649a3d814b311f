"""The two ends of a connection as state machines, driven against each other with no socket.

A :class:`ClientSession` and a :class:`ServerSession` exchange bytes through
plain function calls: the handshake, the authentication, requests with typed
replies, a parked wait woken by another connection, a cancelled wait, and the
session rules the server enforces before authenticating.
"""

from __future__ import annotations

import pytest

from tp_store.errors import ProtocolError, StoreAuthenticationError
from tp_store.protocol import (
    EXTENSION_OFFER,
    REQUESTS_PER_TURN,
    TRANSITIONS,
    Add,
    AuthRefused,
    Check,
    ClientSession,
    CompareSet,
    Event,
    Get,
    Incomplete,
    Limits,
    Phase,
    Ping,
    ReplyFormat,
    RequestBeforeAuthentication,
    ServerSession,
    Set,
    Turn,
    Validate,
    Wait,
    WaitGet,
    WaitReply,
    advance,
)
from tp_store.server.state import StoreState

SECRET = b"s" * 32


class Pair:
    """A client session and a server session joined by method calls instead of a socket."""

    def __init__(self, state: StoreState, secret: bytes | None, client_secret: bytes | None):
        self.woken: list[Exception | None] = []
        self.ops = [0] * 256
        self.server = ServerSession(
            state,
            Limits(),
            secret=secret,
            stats=dict,  # type: ignore[typeddict-item]
            ops=self.ops,
            woken=self.woken.append,
        )
        self.client = ClientSession("127.0.0.1", 1, client_secret)

    def send(self, data: bytes) -> Turn:
        """Give the server ``data``; hand whatever it replies to the client."""
        self.server.receive(data)
        turn = self.server.serve()
        self.deliver()
        return turn

    def deliver(self) -> None:
        """What the server has in its outbox, handed to the client."""
        for reply in self.server.outbox:
            self.client.receive(reply)
        self.server.outbox.clear()

    def read(self, reply: ReplyFormat[object], count: int = 0) -> object:
        value = self.client.read(reply, count)
        assert not isinstance(value, Incomplete), "the server did not answer"
        return value

    def connect(self) -> None:
        """The handshake (and the authentication, when the client has a secret)."""
        self.send(self.client.hello())
        challenge = self.client.answered(self.read(Ping.reply))  # type: ignore[arg-type]
        if challenge is not None:
            self.send(challenge)
            self.send(self.client.prove(self.read(Get.reply)))  # type: ignore[arg-type]
            self.client.verify(self.read(Get.reply))  # type: ignore[arg-type]


@pytest.fixture
def state() -> StoreState:
    return StoreState()


def test_handshake_without_a_secret_ends_serving_with_the_extensions(state: StoreState) -> None:
    pair = Pair(state, None, None)
    assert pair.server.phase is Phase.HANDSHAKE
    pair.connect()
    assert pair.client.phase is Phase.SERVING
    assert pair.server.phase is Phase.SERVING
    assert pair.client.extended
    assert pair.server.extended


def test_authentication_with_the_same_secret_ends_serving(state: StoreState) -> None:
    pair = Pair(state, SECRET, SECRET)
    pair.send(pair.client.hello())
    assert pair.server.phase is Phase.AUTH
    challenge = pair.client.answered(pair.read(Ping.reply))  # type: ignore[arg-type]
    assert challenge is not None
    assert pair.client.phase is Phase.AUTH
    pair.send(challenge)
    pair.send(pair.client.prove(pair.read(Get.reply)))  # type: ignore[arg-type]
    assert pair.server.phase is Phase.SERVING
    pair.client.verify(pair.read(Get.reply))  # type: ignore[arg-type]
    assert pair.client.phase is Phase.SERVING


def test_a_wrong_secret_is_refused_by_both_ends(state: StoreState) -> None:
    pair = Pair(state, SECRET, b"t" * 32)
    pair.send(pair.client.hello())
    challenge = pair.client.answered(pair.read(Ping.reply))  # type: ignore[arg-type]
    assert challenge is not None
    pair.send(challenge)
    proof = pair.client.prove(pair.read(Get.reply))  # type: ignore[arg-type]
    pair.server.receive(proof)
    with pytest.raises(AuthRefused):
        pair.server.serve()
    pair.deliver()  # the server says no before it closes
    with pytest.raises(StoreAuthenticationError, match="the secrets differ"):
        pair.client.verify(pair.read(Get.reply))  # type: ignore[arg-type]


def test_a_client_without_the_secret_learns_it_from_the_handshake(state: StoreState) -> None:
    pair = Pair(state, SECRET, None)
    pair.send(pair.client.hello())
    with pytest.raises(StoreAuthenticationError, match="requires a secret"):
        pair.client.answered(pair.read(Ping.reply))  # type: ignore[arg-type]


def test_requests_before_authenticating_are_refused_from_their_opcode(state: StoreState) -> None:
    pair = Pair(state, SECRET, None)
    pair.send(pair.client.hello())
    pair.server.receive(Get.frame(b"/k")[:1])  # the opcode byte alone is enough
    with pytest.raises(RequestBeforeAuthentication, match="GET sent before authenticating"):
        pair.server.serve()


def test_only_a_few_requests_may_come_before_authenticating(state: StoreState) -> None:
    pair = Pair(state, SECRET, None)
    pair.server.receive(pair.client.hello() + Ping(1).encode() * 20)
    with pytest.raises(AuthRefused, match="more than 16 requests"):
        pair.server.serve()


def test_replies_come_back_typed_in_the_format_each_request_declares(state: StoreState) -> None:
    pair = Pair(state, None, None)
    pair.connect()
    pair.send(Add.frame(b"/n", 5))
    assert pair.read(Add.reply) == 5
    pair.send(Set.frame(b"/k", b"v"))
    assert pair.server.outbox == []  # SET has no reply
    pair.send(CompareSet.frame(b"/k", b"v", b"w"))
    assert pair.read(CompareSet.reply) == b"w"
    pair.send(WaitGet.frame((b"/k", b"/n")))
    assert pair.read(WaitGet.reply, 2) == (WaitReply.STOP_WAITING, [b"w", b"5"])
    assert pair.ops[Add.opcode] == 1
    assert pair.ops[WaitGet.opcode] == 1


def test_a_parked_wait_is_woken_by_another_connections_write(state: StoreState) -> None:
    waiter, writer = Pair(state, None, None), Pair(state, None, None)
    waiter.connect()
    writer.connect()
    waiter.send(WaitGet.frame((b"/late",)))
    waiter.client.parked()
    assert waiter.server.phase is Phase.WAITING
    assert waiter.client.phase is Phase.WAITING
    assert waiter.server.parked
    assert waiter.server.pending_bytes > 0
    writer.send(Set.frame(b"/late", b"here"))
    assert waiter.woken == [None]  # the I/O layer is told to write the reply
    waiter.deliver()
    assert waiter.read(WaitGet.reply, 1) == (WaitReply.STOP_WAITING, [b"here"])
    waiter.client.woken()
    assert waiter.server.phase is Phase.SERVING
    assert waiter.server.pending_bytes == 0


def test_a_parked_wait_accepts_only_cancel_wait(state: StoreState) -> None:
    pair = Pair(state, None, None)
    pair.connect()
    pair.send(Wait.frame((b"/never",)))
    pair.client.parked()
    with pytest.raises(ProtocolError, match="phase"):
        pair.client.parked()  # one wait at a time, on the client's side too
    pair.send(pair.client.cancel())
    assert pair.read(Wait.reply) == WaitReply.WAIT_CANCELED
    assert pair.server.phase is Phase.SERVING
    assert not pair.server.parked
    pair.server.receive(Wait.frame((b"/never",)) + Get.frame(b"/k"))
    with pytest.raises(ProtocolError, match="GET sent while a wait is pending"):
        pair.server.serve()


def test_a_pipelining_client_yields_its_turn(state: StoreState) -> None:
    pair = Pair(state, None, None)
    pair.connect()
    assert pair.send(Add.frame(b"/n", 1) * (REQUESTS_PER_TURN + 1)) is Turn.YIELD
    assert pair.send(b"") is Turn.IDLE
    values = [pair.read(Add.reply) for _ in range(REQUESTS_PER_TURN + 1)]
    assert values == list(range(1, REQUESTS_PER_TURN + 2))


def test_closing_drops_the_parked_wait(state: StoreState) -> None:
    pair = Pair(state, None, None)
    pair.connect()
    pair.send(Wait.frame((b"/never",)))
    pair.server.close()
    assert pair.server.phase is Phase.CLOSED
    assert not pair.server.parked
    assert not state._waiters  # the state forgot it too


@pytest.mark.parametrize(("phase", "event"), [(p, e) for p in Phase for e in Event])
def test_every_move_is_in_the_one_table(phase: Phase, event: Event) -> None:
    if (phase, event) in TRANSITIONS:
        assert advance(phase, event) is TRANSITIONS[phase, event]
    else:
        with pytest.raises(ProtocolError, match="cannot happen"):
            advance(phase, event)


def test_each_frame_writes_what_its_request_encodes() -> None:
    keys = (b"/a", b"/bb")
    assert Set.frame(b"/k", b"v") == Set(b"/k", b"v").encode()
    assert CompareSet.frame(b"/k", b"", b"d") == CompareSet(b"/k", b"", b"d").encode()
    assert Get.frame(b"/k") == Get(b"/k").encode()
    assert Add.frame(b"/k", -(2**63)) == Add(b"/k", -(2**63)).encode()
    assert Wait.frame(keys) == Wait(keys).encode()
    assert WaitGet.frame(keys) == WaitGet(keys).encode()


HOT_REQUESTS = [
    Set.frame(b"/k", b"v"),
    Add.frame(b"/n", 5),
    Add.frame(b"/n", -2),
    Get.frame(b"/k"),
    Get.frame(b"/missing"),
    Wait.frame((b"/k",)),
    WaitGet.frame((b"/n",)),
    Check((b"/k",)).encode(),
    Check((b"/missing",)).encode(),
    Ping(7).encode(),
]
HANDSHAKE = (Validate().encode(), Ping(EXTENSION_OFFER).encode())


def served(pair: Pair, data: bytes) -> bytes:
    """What the general path replies to ``data`` (its outbox, emptied)."""
    pair.server.receive(data)
    while pair.server.serve() is not Turn.IDLE:
        pass
    reply = b"".join(pair.server.outbox)
    pair.server.outbox.clear()
    return reply


def test_the_direct_path_answers_as_the_general_one(state: StoreState) -> None:
    direct, general = Pair(state, None, None), Pair(StoreState(), None, None)
    for frame in HANDSHAKE:
        assert direct.server.answer(frame) == served(general, frame), frame
    assert direct.server.phase is general.server.phase is Phase.SERVING
    assert direct.server.extended
    for frame in HOT_REQUESTS:
        assert direct.server.answer(frame) == served(general, frame), frame
    assert direct.ops == general.ops
    assert state.data == {b"/k": b"v", b"/n": b"3"}


@pytest.mark.parametrize(
    "frame",
    [
        Add.frame(b"/n", 1)[:-1],  # not whole yet
        Add.frame(b"/n", 1) * 2,  # pipelined
        Wait.frame((b"/k", b"/k")),  # more than one key
        CompareSet.frame(b"/k", b"v", b"w"),  # not a usual request
        Add.frame(b"/n", 1) * (REQUESTS_PER_TURN + 1),  # more than a turn
    ],
)
def test_the_direct_path_leaves_the_rest_to_the_general_one(
    state: StoreState, frame: bytes
) -> None:
    other = StoreState()
    direct, general = Pair(state, None, None), Pair(other, None, None)
    direct.connect()
    general.connect()
    state.set(b"/k", b"v")
    other.set(b"/k", b"v")
    assert direct.server.answer(frame) is None
    assert state.data == {b"/k": b"v"}  # nothing done
    assert served(direct, frame) == served(general, frame)
    assert direct.ops == general.ops
    assert state.data == other.data


def test_a_request_over_a_limit_is_left_to_the_general_path(state: StoreState) -> None:
    pair = Pair(state, None, None)
    pair.connect()
    frame = Set.frame(b"/big", b"x" * (Limits().max_value_bytes + 1))
    assert pair.server.answer(frame) is None
    pair.server.receive(frame)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        pair.server.serve()
    assert not state.data


def test_a_wait_of_a_missing_key_parks_on_the_direct_path(state: StoreState) -> None:
    waiting, writer = Pair(state, None, None), Pair(state, None, None)
    waiting.connect()
    writer.connect()
    assert waiting.server.answer(WaitGet.frame((b"/late",))) == b""
    assert waiting.server.parked
    assert waiting.server.phase is Phase.WAITING
    # While it is parked, what the client sends is the general path's, which refuses it.
    assert waiting.server.answer(Get.frame(b"/late")) is None
    assert writer.server.answer(Set.frame(b"/late", b"v")) == b""
    assert waiting.woken == [None]
    assert not waiting.server.parked
    waiting.deliver()
    assert waiting.read(WaitGet.reply, 1) == (WaitReply.STOP_WAITING, [b"v"])


def test_what_follows_a_wait_parked_on_the_direct_path_is_refused(state: StoreState) -> None:
    pair = Pair(state, None, None)
    pair.connect()
    assert pair.server.answer(Wait.frame((b"/never",))) == b""
    pair.server.receive(Get.frame(b"/k"))
    with pytest.raises(ProtocolError, match="GET sent while a wait is pending"):
        pair.server.serve()


@pytest.mark.parametrize(
    "frame",
    [
        Add.frame(b"/n", 1),  # before VALIDATE
        Validate(1).encode(),  # a wrong magic
    ],
)
def test_the_direct_path_leaves_a_bad_handshake_to_the_general_one(
    state: StoreState, frame: bytes
) -> None:
    pair = Pair(state, None, None)
    assert pair.server.answer(frame) is None
    pair.server.receive(frame)
    with pytest.raises(ProtocolError, match="first message must be VALIDATE"):
        pair.server.serve()
    assert not state.data


def test_the_direct_path_leaves_a_handshake_with_a_secret_to_the_general_one(
    state: StoreState,
) -> None:
    pair = Pair(state, SECRET, SECRET)
    assert pair.server.answer(Validate().encode()) is None
    assert pair.server.phase is Phase.HANDSHAKE
    served(pair, Validate().encode())
    assert pair.server.phase is Phase.AUTH


def test_the_direct_path_waits_behind_a_partial_request(state: StoreState) -> None:
    pair = Pair(state, None, None)
    pair.connect()
    frame = Add.frame(b"/n", 1)
    pair.server.receive(frame[:3])
    assert pair.server.answer(frame) is None
    assert b"/n" not in state.data
    pair.server.receive(frame[3:] + frame)
    assert pair.server.serve() is Turn.IDLE
    pair.deliver()
    assert [pair.read(Add.reply), pair.read(Add.reply)] == [1, 2]
