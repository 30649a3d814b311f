"""Every decoder of store data, fed hostile values: a value or its one documented error,
within a second of CPU time and 64 MiB, and a short error message (``within_bounds``).

The strategies (``hostile_data``) build on real documents and PyTorch states
with parts replaced (deep, wide, shared, wrongly typed, surrogates, huge
numbers, NaN) and on raw bytes. ``TP_HOSTILE_EXAMPLES`` sets the number of
examples: a short run here, a long one in ``nox -s hostile``.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import hostile_data
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tp_rdzv_api import RendezvousStateError
from tp_rdzv_dynamic.documents.answers import decode_answer, decode_roster
from tp_rdzv_dynamic.documents.bootstrap_address import decode_bootstrap_address
from tp_rdzv_dynamic.documents.codecs import (
    Lease,
    decode_liveness,
    decode_message,
    decode_outcome,
    decode_state,
)
from tp_rdzv_dynamic.model.node_desc import node_from_fields
from tp_rdzv_dynamic.torch_compat.torch_state import decode_torch_state
from tp_store.testing.bounds import within_bounds

hostile = settings(
    max_examples=hostile_data.EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module", autouse=True)
def traced_memory() -> Iterator[None]:
    tracemalloc.start()
    yield
    tracemalloc.stop()


@hostile
@given(hostile_data.DOCUMENT_STATES)
def test_a_state_document_decodes_or_is_a_state_error(raw: bytes) -> None:
    within_bounds(lambda: decode_state(raw, "the state key"), (RendezvousStateError,))


@hostile
@given(hostile_data.DOCUMENT_OUTCOMES)
def test_an_outcome_decodes_or_is_a_state_error(raw: bytes) -> None:
    within_bounds(lambda: decode_outcome(raw, "the outcome key"), (RendezvousStateError,))


@hostile
@given(hostile_data.DOCUMENT_ANSWERS)
def test_an_answer_decodes_or_is_a_state_error(raw: bytes) -> None:
    within_bounds(lambda: decode_answer(raw, "the answer key"), (RendezvousStateError,))


@hostile
@given(hostile_data.DOCUMENT_ROSTERS)
def test_a_roster_decodes_or_is_a_state_error(raw: bytes) -> None:
    within_bounds(lambda: decode_roster(raw, "the roster key"), (RendezvousStateError,))


@hostile
@given(hostile_data.DOCUMENT_BOOTSTRAPS)
def test_a_bootstrap_address_decodes_or_is_a_state_error(raw: bytes) -> None:
    within_bounds(
        lambda: decode_bootstrap_address(raw, "the bootstrap key"), (RendezvousStateError,)
    )


@hostile
@given(hostile_data.DOCUMENT_MESSAGES)
def test_a_mailbox_message_decodes_to_keyable_nodes_or_is_a_value_error(raw: bytes) -> None:
    decoded = within_bounds(lambda: decode_message(raw), (ValueError,))
    if isinstance(decoded, tuple) and decoded[0] is not None:
        event, receipt = decoded
        # What the steward makes store keys and values of encodes.
        event.node.key.encode()
        (receipt or "").encode()
        getattr(event, "token", "").encode()


@hostile
@given(hostile_data.DOCUMENT_LIVENESS)
def test_a_liveness_report_decodes_or_is_a_state_error(raw: bytes) -> None:
    within_bounds(lambda: decode_liveness(raw, "the liveness key"), (RendezvousStateError,))


@hostile
@given(hostile_data.LEASE_VALUES)
def test_a_lease_reads_as_a_lease_whatever_it_holds(raw: bytes) -> None:
    lease = within_bounds(lambda: Lease.parse(raw), ())
    assert isinstance(lease, Lease)
    assert lease.epoch >= 0
    assert lease.round >= 0


@hostile
@given(hostile_data.TORCH_VALUES)
def test_a_pytorch_state_decodes_or_is_a_state_error(raw: bytes) -> None:
    state = within_bounds(lambda: decode_torch_state(raw, "PyTorch's key"), (RendezvousStateError,))
    if not isinstance(state, RendezvousStateError):
        for node in [*state.participants, *state.wait_list, *state.last_heartbeats]:  # type: ignore[attr-defined]
            str(node).encode()


@hostile
@given(
    st.one_of(hostile_data.HOSTILE_JSON, st.text(hostile_data._HOSTILE_CHARACTERS)),
    hostile_data.HOSTILE_JSON,
    hostile_data.HOSTILE_JSON,
)
def test_node_fields_make_a_keyable_node_or_a_value_error(
    addr: object, pid: object, local_id: object
) -> None:
    node = within_bounds(lambda: node_from_fields(addr, pid, local_id), (ValueError,))
    if not isinstance(node, ValueError):
        node.key.encode()  # type: ignore[attr-defined]
