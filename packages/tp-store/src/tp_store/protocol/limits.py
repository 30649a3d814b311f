"""The limits a server enforces on requests and on what it stores (and a client on replies)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    """The limits a server enforces on requests and on what it stores.

    The first three are PyTorch's libuv server's. The others bound memory:
    ``max_keys`` counts keys and queued values together (a request that would
    store one more closes its connection), and ``max_message_bytes`` bounds
    one request and one reply (a MULTI_GET of a big value a million times
    would otherwise build its reply in memory). ``max_value_bytes`` also
    bounds what APPEND grows a value to. A store session owns at most
    ``max_session_keys`` keys and holds at most ``max_session_wills`` wills
    (what it holds counts in the server's memory budget). ``max_stored_bytes``
    bounds the bytes of every stored key and value (queued values included)
    together: a write past it closes its connection and changes nothing.
    """

    max_key_bytes: int = 8 * 1024
    max_value_bytes: int = 8 * 1024 * 1024
    max_keys_per_request: int = 128 * 1024
    max_keys: int = 1_000_000
    max_message_bytes: int = 64 * 1024 * 1024
    max_session_keys: int = 1024
    max_session_wills: int = 1024
    max_stored_bytes: int = 1024 * 1024 * 1024

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Limits.{field.name} must be a positive int, got {value!r}")
        # A SET of the biggest key and value must fit in one message.
        smallest = 1 + 16 + self.max_key_bytes + self.max_value_bytes
        if self.max_message_bytes < smallest:
            raise ValueError(
                f"Limits.max_message_bytes must be at least {smallest} (a SET of the biggest "
                f"key and value), got {self.max_message_bytes}"
            )
