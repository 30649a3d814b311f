"""Reads of single keys by the threads of a process, sent to etcd together.

The nodes of a job that share a process read their own keys at the same
moment: woken together by their round's outcome, each reads its answer. Each
read alone is a request etcd serves. Here a read that comes while another is
on its way waits for it, then goes in one transaction of reads with every
read that came meanwhile (at most ``MAX_TXN_OPS``); the first of them sends
it. A read that finds none on its way goes at once: nothing waits on a timer,
and a process that reads one key at a time sends the same requests as before.

A read answers as a read of its own would: the key's range answer, with the
revision the transaction was served at, which is after the read was asked.
When a transaction fails, each of its readers reads alone, so one caller's
deadline or error is never another's.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence

from tp_rdzv_etcd.client.gateway import Json, TlsFiles
from tp_rdzv_etcd.client.per_process import PerProcess
from tp_rdzv_etcd.endpoints import Endpoint

#: Sends the reads of these keys, in one request; their range answers, in order.
SendReads = Callable[[Sequence[bytes]], list[Json]]


class _Read:
    """One caller's read: its key, then its answer, or its turn to send."""

    __slots__ = ("alone", "answer", "done", "key", "sends")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.done = threading.Event()
        self.answer: Json | None = None
        self.sends = False  # woken to send the next batch, its own read first
        self.alone = False  # woken to read alone: the batch it was in failed


class SharedReads:
    """The single-key reads of one process on one cluster (thread-safe)."""

    def __init__(self, most: int) -> None:
        self._most = most
        self._lock = threading.Lock()
        self._queued: collections.deque[_Read] = collections.deque()
        self._sending = False

    def range(self, key: bytes, send: SendReads) -> Json:
        """The range answer of the etcd ``key``, read with whatever else is read
        meanwhile; ``send`` sends this caller's batch if it is the one to.

        Raises what ``send`` raises for a batch this caller sent (or a read of
        its own, when a batch it was in failed).
        """
        read = _Read(key)
        with self._lock:
            if self._sending:
                self._queued.append(read)
            else:
                self._sending = read.sends = True
        if not read.sends:
            try:
                read.done.wait()
            except BaseException:  # interrupted: its turn to send must not be lost
                self._abandon(read)
                raise
            if read.answer is not None:
                return read.answer
            if read.alone:
                return send([key])[0]
        batch = [read, *self._take()]
        try:
            answers = send([queued.key for queued in batch])
            if len(answers) != len(batch):
                raise ValueError(f"{len(batch)} reads sent in one request, {len(answers)} answers")
        except BaseException:
            for queued in batch[1:]:
                queued.alone = True
                queued.done.set()
            raise
        finally:
            self._hand_over()
        for queued, found in zip(batch[1:], answers[1:], strict=True):
            queued.answer = found
            queued.done.set()
        return answers[0]

    def _take(self) -> list[_Read]:
        """The reads queued so far that fit in one batch beside the sender's."""
        with self._lock:
            count = min(len(self._queued), self._most - 1)
            return [self._queued.popleft() for _ in range(count)]

    def _hand_over(self) -> None:
        """The next queued read sends the next batch; none queued, the next caller does."""
        with self._lock:
            if not self._queued:
                self._sending = False
                return
            following = self._queued.popleft()
            following.sends = True
        following.done.set()

    def _abandon(self, read: _Read) -> None:
        """``read``'s caller stopped waiting: out of the queue, or its turn passed on."""
        with self._lock:
            handed = read.sends
            if not handed and read in self._queued:
                self._queued.remove(read)
        if handed:
            self._hand_over()


_READS: PerProcess[tuple[tuple[Endpoint, ...], TlsFiles], SharedReads] = PerProcess()


def shared_reads(endpoints: tuple[Endpoint, ...], tls: TlsFiles, most: int) -> SharedReads:
    """This process's :class:`SharedReads` for the cluster at ``endpoints`` (batches
    of at most ``most`` reads)."""
    return _READS.get((endpoints, tls), lambda: SharedReads(most))
