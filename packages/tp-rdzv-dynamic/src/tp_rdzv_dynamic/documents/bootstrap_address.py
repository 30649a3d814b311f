"""Where the workers of a round find their bootstrap store.

One document at ``bootstrap/<round>`` holds both the address and the port, so a
node reads it in one request (``wait_get``: one round trip on our server, a
range and at most one watch on etcd) instead of a wait on two keys and a read
of each. The same two fields ride in each participant's answer when the
steward hosts the store (see :mod:`.answers`). Other versions of this package
read them: changing them is a change of the wire format.
"""

from __future__ import annotations

import json

from tp_rdzv_api import RendezvousStoreInfo
from tp_rdzv_dynamic.model.node_desc import address_problem
from tp_rdzv_dynamic.quoting import quoted

from .codecs import SCHEMA, _Reader

BOOTSTRAP_FORMAT = "tp-rdzv-bootstrap"


def bootstrap_fields(info: RendezvousStoreInfo) -> str:
    """``info`` as the JSON members ``"addr":...,"port":...`` (``address_problem`` holds none)."""
    return f'"addr":{json.dumps(info.master_addr)},"port":{info.port}'


def encode_bootstrap_address(info: RendezvousStoreInfo) -> bytes:
    """The document naming ``info``'s address and port."""
    return f'{{"format":"{BOOTSTRAP_FORMAT}","schema":{SCHEMA},{bootstrap_fields(info)}}}'.encode()


def decode_bootstrap_address(raw: bytes, where: str) -> RendezvousStoreInfo:
    """The bootstrap store in ``raw``; ``RendezvousStateError`` naming ``where`` if malformed."""
    reader = _Reader(raw, BOOTSTRAP_FORMAT, where)
    return bootstrap_info(reader, reader.document)


def bootstrap_info(reader: _Reader, fields: dict[str, object]) -> RendezvousStoreInfo:
    """The bootstrap store in ``fields`` (of ``reader``'s document), checked.

    The address reaches the workers' environment (``MASTER_ADDR``) and log lines:
    it must be an address a node could have (printable, bounded), as its host's was.
    """
    addr = fields.get("addr")
    if not isinstance(addr, str):
        raise reader.error(f"has a bad 'addr': expected str, got {quoted(addr)}")
    problem = address_problem(addr)
    if problem is not None:
        raise reader.error(f"has a bad 'addr': it {problem}")
    port = fields.get("port")
    if type(port) is not int or not 0 < port < 65536:
        raise reader.error(f"has a bad 'port': expected 1 to 65535, got {quoted(port)}")
    return RendezvousStoreInfo(addr, port)
