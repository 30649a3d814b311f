"""A departure the store announced: a node's presence session ended."""

from __future__ import annotations

from dataclasses import dataclass

from .node_desc import _NodeDesc


@dataclass(frozen=True)
class Gone:
    """``node``'s presence session ``token`` ended: the store pushed the session's will.

    The steward takes it as a :class:`~tp_rdzv_dynamic.model.decisions.Leave`
    unless the node is present again through another session (another token):
    it was only paused past its session timeout, and joins again itself.
    """

    node: _NodeDesc
    token: str


#: Tokens are random hex (``secrets.token_hex``); anything longer is not ours.
MAX_TOKEN_LENGTH = 64
