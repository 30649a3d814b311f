"""Authentication (the AUTH_CHALLENGE and AUTH_PROOF extension), without I/O.

A shared-secret challenge-response that never puts the secret on the wire::

    client -> AUTH_CHALLENGE(client_nonce)      32 random bytes
    server -> server_nonce                      32 random bytes; empty: no secret here
    client -> AUTH_PROOF(HMAC(secret, "client", server_nonce, client_nonce))
    server -> HMAC(secret, "server", server_nonce, client_nonce)
              or empty bytes and the connection closed when the proof is wrong

Both sides prove they know the secret: the server's proof lets the client
refuse a server that merely accepts everything.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Final

from tp_store.errors import ProtocolError, StoreAuthenticationError

from .messages import AuthChallenge, AuthProof

#: Size of each side's nonce; fixed, so the MAC's input has one parse.
AUTH_NONCE_BYTES: Final = 32
#: Size of a proof (an HMAC-SHA256).
AUTH_PROOF_BYTES: Final = 32
# Binds a proof to this protocol and version: a MAC computed with the same
# secret for anything else can never pass for one.
_AUTH_CONTEXT: Final = b"tp-store auth v1\x00"
_CLIENT_ROLE: Final = b"client"
_SERVER_ROLE: Final = b"server"


def auth_proof(secret: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """HMAC-SHA256 of both nonces under ``secret``, for ``role`` (``b"client"`` or ``b"server"``).

    The role is part of the input so that the server's proof can never be
    replayed as the client's, nor the client's as the server's.
    """
    message = _AUTH_CONTEXT + role + server_nonce + client_nonce
    return hmac.new(secret, message, hashlib.sha256).digest()


#: The shortest secret accepted. One sniffed exchange lets an attacker test
#: guesses offline, so a secret must be long enough not to be guessed: 16
#: random bytes (``openssl rand -hex 16`` gives 32 characters) are plenty.
MIN_SECRET_BYTES: Final = 16


def check_secret(secret: bytes) -> bytes:
    """``secret`` if it can be used, else ``ValueError`` (never echoing the secret)."""
    if not isinstance(secret, bytes):
        raise TypeError(f"a store secret must be bytes, got {type(secret).__name__}")
    if not secret:
        raise ValueError("a store secret must not be empty")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"a store secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}: "
            "a short one can be guessed offline from one sniffed authentication "
            "(make one with: openssl rand -hex 16)"
        )
    return secret


class ClientAuthenticator:
    """The client's side of the authentication exchange, without I/O.

    Send :meth:`challenge`, feed the server's answer to :meth:`prove` and send
    what it returns, then give the server's answer to :meth:`verify`. Every
    failure raises :class:`~tp_store.errors.StoreAuthenticationError`.
    """

    def __init__(self, secret: bytes, nonce: bytes | None = None) -> None:
        self._secret = check_secret(secret)
        self._nonce = os.urandom(AUTH_NONCE_BYTES) if nonce is None else nonce
        if len(self._nonce) != AUTH_NONCE_BYTES:
            raise ValueError(f"the client nonce must be {AUTH_NONCE_BYTES} bytes")
        self._server_nonce: bytes | None = None

    def challenge(self) -> AuthChallenge:
        """The first request: our nonce."""
        return AuthChallenge(self._nonce)

    def prove(self, server_nonce: bytes) -> AuthProof:
        """The second request, our proof, given the server's answer to the challenge."""
        if not server_nonce:
            raise StoreAuthenticationError(
                "the server has no secret configured but this client has one: "
                "refusing to continue unauthenticated"
            )
        if len(server_nonce) != AUTH_NONCE_BYTES:
            raise StoreAuthenticationError(
                f"the server's nonce is {len(server_nonce)} bytes, expected {AUTH_NONCE_BYTES}"
            )
        self._server_nonce = server_nonce
        return AuthProof(auth_proof(self._secret, _CLIENT_ROLE, server_nonce, self._nonce))

    def verify(self, server_proof: bytes) -> None:
        """Check the server's answer to our proof: it must prove the same secret."""
        if self._server_nonce is None:
            raise RuntimeError("verify() called before prove()")
        if not server_proof:
            raise StoreAuthenticationError(
                "the server refused our proof: the secrets differ (authentication failed)"
            )
        expected = auth_proof(self._secret, _SERVER_ROLE, self._server_nonce, self._nonce)
        if not hmac.compare_digest(server_proof, expected):
            raise StoreAuthenticationError(
                "the server could not prove it knows the secret (authentication failed)"
            )


class ServerAuthenticator:
    """The server's side of the authentication exchange for one connection, without I/O.

    With no secret, :meth:`challenge` answers empty bytes (so a client that
    has a secret fails loudly instead of carrying on unauthenticated).
    Requests out of order raise :class:`~tp_store.errors.ProtocolError`.
    """

    def __init__(self, secret: bytes | None, nonce: bytes | None = None) -> None:
        self._secret = None if secret is None else check_secret(secret)
        self._nonce = os.urandom(AUTH_NONCE_BYTES) if nonce is None else nonce
        self._client_nonce: bytes | None = None
        self._done = False

    def challenge(self, client_nonce: bytes) -> bytes:
        """The answer to AUTH_CHALLENGE: the server's nonce, or empty bytes if no secret."""
        if self._client_nonce is not None:
            raise ProtocolError("AUTH_CHALLENGE sent twice")
        if len(client_nonce) != AUTH_NONCE_BYTES:
            raise ProtocolError(
                f"AUTH_CHALLENGE nonce is {len(client_nonce)} bytes, expected {AUTH_NONCE_BYTES}"
            )
        self._client_nonce = client_nonce
        return b"" if self._secret is None else self._nonce

    def check(self, proof: bytes) -> bytes | None:
        """The answer to AUTH_PROOF: the server's proof if the client's is right, else None."""
        if self._client_nonce is None or self._secret is None or self._done:
            raise ProtocolError("AUTH_PROOF sent without a challenge to answer")
        self._done = True
        expected = auth_proof(self._secret, _CLIENT_ROLE, self._nonce, self._client_nonce)
        if not hmac.compare_digest(proof, expected):
            return None
        return auth_proof(self._secret, _SERVER_ROLE, self._nonce, self._client_nonce)
