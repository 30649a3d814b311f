"""The store keys of a run: the wire format other versions and the CLI read."""

from __future__ import annotations

import re
from pathlib import Path

from tp_rdzv_dynamic import P10dRendezvousBackend, TpRendezvousBackend
from tp_rdzv_dynamic.documents.layout import RunLayout
from tp_store import TCPStore

NOTE = Path(__file__).resolve().parents[3] / "docs" / "design" / "dynamic-rendezvous.md"


def test_every_key_of_a_run_is_where_other_versions_look():
    keys = RunLayout("job-1")
    assert [
        keys.mailbox,
        keys.lease,
        keys.closed,
        keys.closing,
        keys.waiting,
        keys.pending,
        keys.liveness,
        keys.outcome(3),
        keys.answer(3, "host_7_0"),
        keys.roster(3),
        keys.heartbeat("host_7_0"),
        keys.stale(3),
        keys.vacated(3),
        keys.bootstrap(3),
        keys.receipt(keys.new_receipt("host_7_0", 5)),
        keys.round_store(3),
    ] == [
        "tp_rdzv/job-1/mailbox",
        "tp_rdzv/job-1/steward",
        "tp_rdzv/job-1/closed",
        "tp_rdzv/job-1/closing",
        "tp_rdzv/job-1/waiting",
        "tp_rdzv/job-1/pending",
        "tp_rdzv/job-1/liveness",
        "tp_rdzv/job-1/result/3",
        "tp_rdzv/job-1/answer/3/host_7_0",
        "tp_rdzv/job-1/roster/3",
        "tp_rdzv/job-1/hb/host_7_0",
        "tp_rdzv/job-1/stale/3",
        "tp_rdzv/job-1/vacated/3",
        "tp_rdzv/job-1/bootstrap/3",
        "tp_rdzv/job-1/rcpt/host_7_0/5",
        "tp_rdzv/job-1/r3",
    ]


def test_the_backends_keep_the_state_at_the_documented_keys(server: TCPStore):
    assert TpRendezvousBackend(server, "job-1").key == "tp_rdzv/job-1/state"
    assert P10dRendezvousBackend(server, "job-1").key == "torch.rendezvous.job-1"


def test_the_design_note_lists_every_key_and_no_other():
    keys = RunLayout("R")
    built = {
        keys.mailbox,
        keys.lease,
        keys.closed,
        keys.closing,
        keys.waiting,
        keys.pending,
        keys.liveness,
        keys.outcome(0).replace("/0", "/<round>"),
        keys.answer(0, "<node>").replace("/0/", "/<round>/"),
        keys.roster(0).replace("/0", "/<round>"),
        keys.heartbeat("<node>"),
        keys.presence("<node>"),
        keys.stale(0).replace("/0", "/<round>"),
        keys.vacated(0).replace("/0", "/<epoch>"),
        keys.bootstrap(0).replace("/0", "/<round>"),
        keys.receipt("rcpt/<id>"),
    }
    table = re.findall(r"^\| `([^`]+)` \|", NOTE.read_text(), re.MULTILINE)
    documented = {"tp_rdzv/R/" + key for key in table if not key.endswith((".py", "/"))}
    assert documented == built
