"""Draining a queue on etcd: ``queue_pop_many`` against other poppers."""

from __future__ import annotations

import threading
import uuid

import pytest

from tp_rdzv_etcd import EtcdStore
from tp_rdzv_etcd.local import LocalEtcd
from tp_store import QueueEmptyError

pytestmark = pytest.mark.etcd


def test_concurrent_drains_deliver_every_value_once(etcd1: LocalEtcd) -> None:
    prefix = f"/queues/{uuid.uuid4().hex}/"
    pusher = EtcdStore(etcd1.endpoints, prefix, timeout=60)
    values = [f"v{index}".encode() for index in range(600)]  # more than a transaction's deletes
    for value in values:
        pusher.queue_push("mailbox", value)
    drained: list[list[bytes]] = [[], [], []]
    errors: list[BaseException] = []

    def drain(into: list[bytes], how_many: int) -> None:
        store = pusher.clone()
        try:
            while True:
                if how_many == 1:
                    try:
                        into.append(store.queue_pop("mailbox", block=False))
                    except QueueEmptyError:
                        return
                    continue
                taken = store.queue_pop_many("mailbox", how_many)
                if not taken:
                    return
                into.extend(taken)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            store.close()

    threads = [
        threading.Thread(target=drain, args=(drained[0], 300)),
        threading.Thread(target=drain, args=(drained[1], 200)),
        threading.Thread(target=drain, args=(drained[2], 1)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    everything = [value for batch in drained for value in batch]
    assert sorted(everything) == sorted(values)  # each value once, none lost
    for batch in drained:  # each drainer saw the values in the order they were pushed
        assert batch == sorted(batch, key=values.index)
    assert pusher.queue_len("mailbox") == 0
    pusher.close()
