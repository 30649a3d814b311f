"""Single-key reads of a process's threads sent together (``tp_rdzv_etcd.client.shared.reads``):
what each caller gets, the batches they form, and a failed batch; then on a real etcd."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from tp_rdzv_etcd import EtcdStore
from tp_rdzv_etcd.client.gateway import Json
from tp_rdzv_etcd.client.rpc import EtcdRpc
from tp_rdzv_etcd.client.shared.reads import SharedReads
from tp_rdzv_etcd.local import LocalEtcd

_BOUND = 30.0


class _Sender:
    """A ``send`` whose first call is held until released: the reads that come
    meanwhile queue behind it. Records the batches it was given."""

    def __init__(self, fail_batches: bool = False) -> None:
        self.batches: list[list[bytes]] = []
        self.release = threading.Event()
        self.first_sent = threading.Event()
        self._fail_batches = fail_batches

    def __call__(self, keys: Sequence[bytes]) -> list[Json]:
        self.batches.append(list(keys))
        if len(self.batches) == 1:
            self.first_sent.set()
            assert self.release.wait(_BOUND)
        if self._fail_batches and len(keys) > 1:
            raise ConnectionError("the batch failed")
        return [{"kvs": [{"value": key.decode()}]} for key in keys]


def _read_behind_the_first(
    reads: SharedReads,
    sender: _Sender,
    keys: list[bytes],
    send: Callable[[Sequence[bytes]], list[Json]] | None = None,
) -> tuple[dict[bytes, Json], dict[bytes, BaseException]]:
    """Each key read by a thread of its own: the first is sent alone and held
    until every other read has queued behind it. What each got, or raised."""
    got: dict[bytes, Json] = {}
    failed: dict[bytes, BaseException] = {}

    def read(key: bytes) -> None:
        try:
            got[key] = reads.range(key, send or sender)
        except Exception as exc:
            failed[key] = exc

    threads = [threading.Thread(target=read, args=(key,)) for key in keys]
    threads[0].start()
    assert sender.first_sent.wait(_BOUND)
    for thread in threads[1:]:
        thread.start()
    deadline = time.monotonic() + _BOUND
    while len(reads._queued) < len(keys) - 1:
        assert time.monotonic() < deadline, "the reads never all queued"
        time.sleep(0.001)
    sender.release.set()
    for thread in threads:
        thread.join(_BOUND)
    return got, failed


def test_reads_that_come_while_one_is_on_its_way_go_together_after_it() -> None:
    reads, sender = SharedReads(most=4), _Sender()
    keys = [f"k{index}".encode() for index in range(10)]
    got, failed = _read_behind_the_first(reads, sender, keys)
    assert not failed
    assert {key: answer["kvs"][0]["value"] for key, answer in got.items()} == {
        key: key.decode() for key in keys
    }
    # The first alone, then the nine queued in batches of at most four, in the order they came.
    assert [len(batch) for batch in sender.batches] == [1, 4, 4, 1]
    assert sorted(key for batch in sender.batches for key in batch) == sorted(keys)
    assert not reads._sending
    assert not reads._queued


def test_a_read_alone_goes_at_once_each_time() -> None:
    reads = SharedReads(most=128)
    sent: list[list[bytes]] = []

    def send(keys: Sequence[bytes]) -> list[Json]:
        sent.append(list(keys))
        return [{"count": len(sent)} for _ in keys]

    assert [reads.range(b"a", send)["count"] for _ in range(3)] == [1, 2, 3]
    assert sent == [[b"a"]] * 3


def test_when_a_batch_fails_its_sender_sees_the_error_and_the_others_read_alone() -> None:
    reads, sender = SharedReads(most=128), _Sender(fail_batches=True)
    keys = [f"k{index}".encode() for index in range(6)]
    got, failed = _read_behind_the_first(reads, sender, keys)
    # k0 alone, then k1 sends the batch of the five queued: it fails, and k1
    # sees why; k2..k5 each read alone.
    assert sender.batches[:2] == [[b"k0"], keys[1:]]
    assert sorted(sender.batches[2:]) == [[key] for key in keys[2:]]
    assert list(failed) == [b"k1"]
    assert isinstance(failed[b"k1"], ConnectionError)
    assert sorted(got) == [b"k0", *keys[2:]]
    assert not reads._sending


def test_an_answer_missing_from_the_batch_is_an_error_not_a_wrong_value() -> None:
    reads, sender = SharedReads(most=128), _Sender()

    def short(keys: Sequence[bytes]) -> list[Json]:
        answers = sender(keys)
        return answers[:-1] if len(keys) > 1 else answers

    got, failed = _read_behind_the_first(reads, sender, [b"a", b"b", b"c"], short)
    assert isinstance(failed.get(b"b"), ValueError)  # the sender of the short batch
    assert got[b"a"]["kvs"][0]["value"] == "a"
    assert got[b"c"]["kvs"][0]["value"] == "c"  # then read alone


# -- on etcd ---------------------------------------------------------------------


def test_the_nodes_of_a_process_reading_their_answers_at_once_send_few_requests(
    etcd1: LocalEtcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"/reads/{uuid.uuid4().hex}/"
    with EtcdStore(etcd1.endpoints, prefix, timeout=_BOUND, transport="grpc") as writer:
        count = 200
        writer.multi_set([f"answer/{i}" for i in range(count)], [f"seat {i}" for i in range(count)])
        handles = [writer.clone() for _ in range(count)]
        asked: list[str] = []
        call = EtcdRpc.call

        def counted(self: EtcdRpc, path: str, *args: Any, **kwargs: Any) -> Any:
            asked.append(path)
            return call(self, path, *args, **kwargs)

        monkeypatch.setattr(EtcdRpc, "call", counted)
        start = threading.Barrier(count)
        got: dict[int, bytes] = {}

        def read_answer(index: int) -> None:
            start.wait(_BOUND)
            # As a node reads its answer: a compare-and-set from empty to empty.
            got[index] = handles[index].compare_set(f"answer/{index}", "", "")

        threads = [threading.Thread(target=read_answer, args=(i,)) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(_BOUND)
        assert got == {i: f"seat {i}".encode() for i in range(count)}
        # One request per read would be 200.
        assert len(asked) < count // 2, asked
        assert set(asked) <= {"/v3/kv/range", "/v3/kv/txn"}
        # A missing key reads as missing in a batch too (empty, as compare_set says).
        assert writer.compare_set("answer/none", "", "") == b""
        for handle in handles:
            handle.close()
