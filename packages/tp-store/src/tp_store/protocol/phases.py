"""The phases of a store connection, and the one table of how it moves between them.

Both ends of a connection go through the same phases, each tracking them
from its own side (:class:`~tp_store.protocol.server_session.ServerSession`,
:class:`~tp_store.protocol.client_session.ClientSession`)::

    HANDSHAKE --hello---------> SERVING <--woken/cancelled-- WAITING
        |                          ^  \\--parked----------------^
        \\--hello_auth--> AUTH --authenticated
    any --closed--> CLOSED --connected--> HANDSHAKE (a client reconnecting)

The server leaves HANDSHAKE on a valid VALIDATE, the client on the answer to
its handshake PING; AUTH is entered only when the server has a secret (or
the client has one), and left only by a proof both sides accept. A parked
WAIT, WAIT_GET or BARRIER is WAITING until it is answered or cancelled.
"""

from __future__ import annotations

import enum
from typing import Final

from tp_store.errors import ProtocolError


class Phase(enum.Enum):
    """Where a connection is in its life."""

    #: Connected; the server awaits VALIDATE, the client the answer to its PING.
    HANDSHAKE = "handshake"
    #: The authentication exchange: nothing but it (and PING) is served.
    AUTH = "auth"
    #: Requests flow, one at a time.
    SERVING = "serving"
    #: A WAIT, WAIT_GET or BARRIER is parked: only CANCEL_WAIT may be sent.
    WAITING = "waiting"
    #: Over: nothing more is read or sent.
    CLOSED = "closed"

    # Members are singletons: hashed by identity, not by name (Enum's own
    # __hash__ is Python code, and the table is looked up on every wait).
    __hash__ = object.__hash__


class Event(enum.Enum):
    """What moves a connection from one phase to another."""

    #: A (new) connection is open.
    CONNECTED = "connected"

    #: The handshake is done and no authentication is needed.
    HELLO = "hello"
    #: The handshake is done and the client must authenticate first.
    HELLO_AUTH = "hello_auth"
    #: Both sides proved the secret.
    AUTHENTICATED = "authenticated"
    #: A blocking request could not be answered at once.
    PARKED = "parked"
    #: The parked request was answered.
    WOKEN = "woken"
    #: The parked request was cancelled (CANCEL_WAIT).
    CANCELLED = "cancelled"
    #: The connection ended.
    CLOSED = "closed"

    __hash__ = object.__hash__


#: The only moves a connection makes; anything else is a protocol error.
TRANSITIONS: Final[dict[tuple[Phase, Event], Phase]] = {
    (Phase.CLOSED, Event.CONNECTED): Phase.HANDSHAKE,
    (Phase.HANDSHAKE, Event.HELLO): Phase.SERVING,
    (Phase.HANDSHAKE, Event.HELLO_AUTH): Phase.AUTH,
    (Phase.AUTH, Event.AUTHENTICATED): Phase.SERVING,
    (Phase.SERVING, Event.PARKED): Phase.WAITING,
    (Phase.WAITING, Event.WOKEN): Phase.SERVING,
    (Phase.WAITING, Event.CANCELLED): Phase.SERVING,
    **{(phase, Event.CLOSED): Phase.CLOSED for phase in Phase},
}


def advance(phase: Phase, event: Event) -> Phase:
    """The phase ``event`` leads to from ``phase`` (``ProtocolError`` if it cannot happen there)."""
    following = TRANSITIONS.get((phase, event))
    if following is None:
        raise ProtocolError(f"{event.value} cannot happen in the {phase.value} phase")
    return following
