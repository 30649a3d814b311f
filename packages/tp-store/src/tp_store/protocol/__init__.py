"""The TCPStore wire protocol, sans I/O: bytes in and out, no sockets.

The framing is PyTorch's (see ``tcpstore-wire-protocol.md``): an opcode byte,
then fields; integers little-endian; byte strings as a ``u64`` length and the
raw bytes. Our own client and server also understand extension opcodes
(``WAIT_GET``, ``WAIT_ANY``, ``WAIT_KEEPALIVE``, ``STATS``, the
authentication exchange ``AUTH_CHALLENGE`` and ``AUTH_PROOF``, and the store
sessions' ``SESSION_*``), negotiated
through the handshake PING so that a PyTorch peer never sees them.
Malformed input raises :class:`~tp_store.errors.ProtocolError` and nothing
else.

Modules, from the bytes up:

- :mod:`~tp_store.protocol.limits`: the request and memory limits;
- :mod:`~tp_store.protocol.replies`: reply formats, and the readers of replies;
- :mod:`~tp_store.protocol.messages`: the requests, each declaring its layout
  and its reply's format;
- :mod:`~tp_store.protocol.requests`: the server's request parser;
- :mod:`~tp_store.protocol.stats`: the STATS document;
- :mod:`~tp_store.protocol.auth`: the shared-secret challenge-response;
- :mod:`~tp_store.protocol.phases`: a connection's phases and their one
  transition table;
- :mod:`~tp_store.protocol.store_sessions`: the store-session extension's
  rules on a connection (``SESSION_*``);
- :mod:`~tp_store.protocol.server_session` and
  :mod:`~tp_store.protocol.client_session`: each end of a connection as a
  state machine, driven by a thin I/O layer (the server's connections,
  :class:`~tp_store.TCPStore`).

Everything is importable from ``tp_store.protocol`` itself.
"""

from .auth import (
    AUTH_NONCE_BYTES,
    AUTH_PROOF_BYTES,
    MIN_SECRET_BYTES,
    ClientAuthenticator,
    ServerAuthenticator,
    auth_proof,
    check_secret,
)
from .client_session import ClientSession
from .limits import Limits
from .messages import (
    CONNECTION_REFUSED,
    EXTENSION_ACCEPT,
    EXTENSION_ACCEPT_AUTH,
    EXTENSION_OFFER,
    LAYOUTS,
    REQUEST_TYPES,
    VALIDATE_MAGIC,
    Add,
    Append,
    AuthChallenge,
    AuthProof,
    Barrier,
    CancelWait,
    Check,
    CompareSet,
    DeleteKey,
    Field,
    Get,
    GetNumKeys,
    Layout,
    ListKeys,
    Message,
    MultiGet,
    MultiSet,
    Opcode,
    Ping,
    QueueLen,
    QueuePop,
    QueuePush,
    Request,
    SessionClose,
    SessionCompareSet,
    SessionOpen,
    SessionSet,
    SessionWill,
    Set,
    Stats,
    Validate,
    Wait,
    WaitAny,
    WaitGet,
    WaitKeepAlive,
    encode_request,
)
from .phases import TRANSITIONS, Event, Phase, advance
from .replies import (
    BYTES_REPLY,
    FLAG_REPLY,
    INCOMPLETE,
    CheckReply,
    Incomplete,
    Reply,
    ReplyBuffer,
    ReplyFormat,
    ReplyKind,
    ReplyParser,
    WaitReply,
    encode_bytes,
    encode_i64,
    encode_key_list,
    encode_queue_pop,
    encode_u8,
    encode_u32,
    encode_values,
    encode_wait_get,
)
from .requests import (
    BEFORE_AUTH_MESSAGE_BYTES,
    RequestBeforeAuthentication,
    RequestParser,
)
from .server_session import REQUESTS_PER_TURN, AuthRefused, ServerSession, Turn
from .stats import STATS_SCHEMA, ServerStats, SessionStats, decode_stats, encode_stats
from .store_sessions import (
    MAX_SESSION_TIMEOUT_MS,
    MIN_SESSION_TIMEOUT_MS,
    EndCause,
    SessionHandle,
    SessionHost,
)

__all__ = [
    "AUTH_NONCE_BYTES",
    "AUTH_PROOF_BYTES",
    "BEFORE_AUTH_MESSAGE_BYTES",
    "BYTES_REPLY",
    "CONNECTION_REFUSED",
    "EXTENSION_ACCEPT",
    "EXTENSION_ACCEPT_AUTH",
    "EXTENSION_OFFER",
    "FLAG_REPLY",
    "INCOMPLETE",
    "LAYOUTS",
    "MAX_SESSION_TIMEOUT_MS",
    "MIN_SECRET_BYTES",
    "MIN_SESSION_TIMEOUT_MS",
    "REQUESTS_PER_TURN",
    "REQUEST_TYPES",
    "STATS_SCHEMA",
    "TRANSITIONS",
    "VALIDATE_MAGIC",
    "Add",
    "Append",
    "AuthChallenge",
    "AuthProof",
    "AuthRefused",
    "Barrier",
    "CancelWait",
    "Check",
    "CheckReply",
    "ClientAuthenticator",
    "ClientSession",
    "CompareSet",
    "DeleteKey",
    "EndCause",
    "Event",
    "Field",
    "Get",
    "GetNumKeys",
    "Incomplete",
    "Layout",
    "Limits",
    "ListKeys",
    "Message",
    "MultiGet",
    "MultiSet",
    "Opcode",
    "Phase",
    "Ping",
    "QueueLen",
    "QueuePop",
    "QueuePush",
    "Reply",
    "ReplyBuffer",
    "ReplyFormat",
    "ReplyKind",
    "ReplyParser",
    "Request",
    "RequestBeforeAuthentication",
    "RequestParser",
    "ServerAuthenticator",
    "ServerSession",
    "ServerStats",
    "SessionClose",
    "SessionCompareSet",
    "SessionHandle",
    "SessionHost",
    "SessionOpen",
    "SessionSet",
    "SessionStats",
    "SessionWill",
    "Set",
    "Stats",
    "Turn",
    "Validate",
    "Wait",
    "WaitAny",
    "WaitGet",
    "WaitKeepAlive",
    "WaitReply",
    "advance",
    "auth_proof",
    "check_secret",
    "decode_stats",
    "encode_bytes",
    "encode_i64",
    "encode_key_list",
    "encode_queue_pop",
    "encode_request",
    "encode_stats",
    "encode_u8",
    "encode_u32",
    "encode_values",
    "encode_wait_get",
]
