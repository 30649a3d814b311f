"""Hostile values of PyTorch's stored state, for tests and benchmarks of what reads it.

Any node can write the state the c10d backend reads (``torch_compat``), so
its reader must refuse these within bounded time and memory. Shipped, like
``tp_store.testing``, so that every package's tests and the benchmarks build
the same values.
"""

from __future__ import annotations

import base64
import pickle
import struct

from tp_rdzv_dynamic.torch_compat.torch_state import (
    TorchNode,
    TorchRendezvousState,
    encode_torch_state,
)

_PLACEHOLDER = "PLACEHOLDER-ADDRESS"


def torch_state_around(opcodes: bytes) -> bytes:
    """PyTorch's stored value of a state whose one participant's address is what
    ``opcodes`` build (they must leave one value on the pickle stack)."""
    state = TorchRendezvousState(participants={TorchNode(_PLACEHOLDER, 1, 0): 0})
    pickled = base64.b64decode(encode_torch_state(state))
    text = _PLACEHOLDER.encode()
    placeholder = pickle.BINUNICODE + struct.pack("<I", len(text)) + text
    if pickled.count(placeholder) != 1:
        raise AssertionError("the encoded state no longer holds its address once, as one string")
    return base64.b64encode(pickled.replace(placeholder, opcodes))


def shared_tuple_tree(levels: int) -> bytes:
    """Opcodes of a tuple of ``levels`` levels, each holding the level below twice
    through the memo: about 8 bytes a level, 2**levels steps for whoever hashes it."""
    out = pickle.SHORT_BINUNICODE + b"\x01x" + pickle.TUPLE1 + pickle.MEMOIZE
    for level in range(levels):
        get = pickle.LONG_BINGET + struct.pack("<I", level)
        out += get + get + pickle.TUPLE2 + pickle.MEMOIZE
    return out


def hash_bomb(levels: int = 64) -> bytes:
    """PyTorch's stored state whose node address is a :func:`shared_tuple_tree`
    (1.5 KB at 64 levels)."""
    return torch_state_around(shared_tuple_tree(levels))
