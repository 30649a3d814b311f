"""Where rank 0 of a round tells the other nodes its workers' bootstrap store is.

One document at ``bootstrap/<round>`` holds both the address and the port, so a
node reads it in one request (``wait_get``: one round trip on our server, a
range and at most one watch on etcd) instead of a wait on two keys and a read
of each. Other versions of this package read it: changing it is a change of
the wire format.
"""

from __future__ import annotations

import json

from tp_rdzv_api import RendezvousStoreInfo
from tp_rdzv_dynamic.model.node_desc import address_problem
from tp_rdzv_dynamic.quoting import quoted

from .codecs import SCHEMA, _Reader

BOOTSTRAP_FORMAT = "tp-rdzv-bootstrap"


def encode_bootstrap_address(info: RendezvousStoreInfo) -> bytes:
    """The document naming ``info``'s address and port (``address_problem`` holds none)."""
    return (
        f'{{"format":"{BOOTSTRAP_FORMAT}","schema":{SCHEMA},'
        f'"addr":{json.dumps(info.master_addr)},"port":{info.port}}}'
    ).encode()


def decode_bootstrap_address(raw: bytes, where: str) -> RendezvousStoreInfo:
    """The bootstrap store in ``raw``; ``RendezvousStateError`` naming ``where`` if malformed.

    The address reaches the workers' environment (``MASTER_ADDR``) and log lines:
    it must be an address a node could have (printable, bounded), as rank 0's was.
    """
    reader = _Reader(raw, BOOTSTRAP_FORMAT, where)
    addr = reader.value("addr", str)
    problem = address_problem(addr)
    if problem is not None:
        raise reader.error(f"has a bad 'addr': it {problem}")
    port = reader.value("port", int)
    if not 0 < port < 65536:
        raise reader.error(f"has a bad 'port': expected 1 to 65535, got {quoted(port)}")
    return RendezvousStoreInfo(addr, port)
