"""Wills of store sessions on etcd: queue pushes that outlive the session's lease.

When a lease expires or is revoked, etcd deletes the keys attached to it and
does nothing more. So a will is two keys under the home of its queue (see
:mod:`.layout`): a *record* that holds the value to push (attached to no
lease: it must outlive the session) and a *mark* attached to the session's
lease. A record whose mark is gone is *due*: its session has ended.

Every ``EtcdStore`` that reads or waits on a queue first pushes that queue's
due wills: one transaction deletes the record and pushes its value, on the
condition that the record is still there. However many readers race, each
will is pushed once, and a reader that starts long after the session ended
still finds the record. A blocked reader's watch wakes when a mark is deleted
(a session ended); a session's own ``close()`` pushes its wills itself, right
after it revokes its lease.

Finding due wills costs a reader two counts in the transaction it reads the
queue with (a queue has as many records as marks unless a will is due); the
wills themselves are read only when the counts differ.

A session's wills onto one queue are pushed in the order it added them: one
transaction pushes at most one will of each session (etcd gives every key
that one transaction creates the same ``create_revision``, and a queue's
order is the order of creation).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .client.gateway import Json
from .layout import KeyLayout, b64, range_end, unb64

#: A unary gateway request: ``(path, body) -> answer``.
Call = Callable[[str, Json], Json]

#: Wills pushed by one transaction: each is a compare, a delete and a put, and
#: etcd allows 128 operations per list (``--max-txn-ops``).
_WILLS_PER_TXN = 64


@dataclass(frozen=True)
class Will:
    """One will: push ``value`` onto the queue of store key ``queue``."""

    queue: bytes
    record: bytes  # the etcd key of its record
    value: bytes


def count_requests(layout: KeyLayout, key: bytes) -> list[Json]:
    """Two transaction reads: how many will records and marks the queue of ``key`` has.

    Give their answers to :func:`any_due`.
    """
    return [_count(layout.will_records(key)), _count(layout.will_marks(key))]


def any_due(records: Json, marks: Json) -> bool:
    """Whether the answers of :func:`count_requests` show a due will."""
    return _counted(records) != _counted(marks)


def wakes(event: Json, layout: KeyLayout, key: bytes) -> bool:
    """Whether a watch event in the home of ``key`` is news for a reader of ``key``.

    A write of its value or queue is; so is the deletion of a will mark (the
    session ended: a will is due). Other deletions and new wills are not.
    """
    etcd_key = unb64(event.get("kv", {}).get("key", ""))
    deleted = event.get("type") == "DELETE"
    if etcd_key.startswith(layout.wills(key)):
        return deleted and etcd_key.startswith(layout.will_marks(key))
    return not deleted


def push_due(call: Call, layout: KeyLayout, key: bytes) -> bool:
    """Push every due will onto the queue of ``key``, each once whoever else does too.

    Returns whether any was due (pushed here or by another reader meanwhile):
    ``False`` means the counts of :func:`any_due` differ for another reason
    (say, records deleted by hand), and reading again would not change them.
    """
    wills, records = layout.wills(key), layout.will_records(key)
    found = False
    while True:
        answer = call("/v3/kv/range", {"key": b64(wills), "range_end": b64(range_end(wills))})
        due = _due(layout, key, answer.get("kvs", []))
        found = found or bool(due)
        # A session's lease is the first part of its records' suffix.
        rounds = _rounds(due, lambda will: will.record[len(records) :].split(b"/", 1)[0])
        if all(push(call, layout, batch) for batch in rounds):
            return found
        # Another reader pushed some of them meanwhile: see what is still due.


def push_own(call: Call, layout: KeyLayout, wills: Sequence[Will]) -> None:
    """Push the wills of one ended session (those nobody pushed yet), in their order."""
    for batch in _rounds(wills, lambda will: will.queue):
        if not push(call, layout, batch):
            for will in batch:  # some were pushed by a reader: the others one by one
                push(call, layout, [will])


def push(call: Call, layout: KeyLayout, wills: Sequence[Will]) -> bool:
    """Push ``wills`` (of distinct sessions or queues) in one transaction, iff none was pushed.

    Returns whether they were pushed. Retrying it after a lost answer is safe:
    the retry finds the records gone.
    """
    if not wills:
        return True
    answer = call(
        "/v3/kv/txn",
        {
            "compare": [
                {"key": b64(will.record), "target": "VERSION", "result": "GREATER", "version": "0"}
                for will in wills
            ],
            "success": [
                request
                for will in wills
                for request in (
                    {"request_delete_range": {"key": b64(will.record)}},
                    {
                        "request_put": {
                            "key": b64(layout.new_queue_item(will.queue)),
                            "value": b64(will.value),
                        }
                    },
                )
            ],
            "failure": [],
        },
    )
    return bool(answer.get("succeeded"))


def _count(prefix: bytes) -> Json:
    return {
        "request_range": {
            "key": b64(prefix),
            "range_end": b64(range_end(prefix)),
            "count_only": True,
        }
    }


def _counted(response: Json) -> int:
    return int(response.get("response_range", {}).get("count", 0))


def _due(layout: KeyLayout, key: bytes, kvs: Iterable[Json]) -> list[Will]:
    """The due wills among the records and marks ``kvs`` of the queue of ``key``, in key order."""
    marked: set[bytes] = set()
    records: list[tuple[bytes, bytes]] = []
    marks = layout.will_marks(key)
    for kv in kvs:
        etcd_key = unb64(kv["key"])
        if etcd_key.startswith(marks):
            marked.add(etcd_key)
        else:
            records.append((etcd_key, unb64(kv.get("value", ""))))
    return [
        Will(key, record, value)
        for record, value in records
        if layout.will_mark(record) not in marked
    ]


def _rounds(wills: Iterable[Will], group: Callable[[Will], bytes]) -> list[list[Will]]:
    """``wills`` in transactions that hold at most one will of each group, keeping their order."""
    per_group: dict[bytes, list[Will]] = defaultdict(list)
    for will in wills:
        per_group[group(will)].append(will)
    rounds: list[list[Will]] = []
    for members in per_group.values():
        for index, will in enumerate(members):
            if index == len(rounds):
                rounds.append([])
            rounds[index].append(will)
    return [
        round_[start : start + _WILLS_PER_TXN]
        for round_ in rounds
        for start in range(0, len(round_), _WILLS_PER_TXN)
    ]
