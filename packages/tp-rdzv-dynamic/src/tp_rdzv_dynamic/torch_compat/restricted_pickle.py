"""A pickle reader for plain records, in bounded time and memory whatever the bytes.

Python's unpickler is a machine any byte string programs: besides running
code (refused by ``find_class``), a 1.5 KB pickle of tuples sharing tuples
through the memo takes 2**64 steps to hash, in C code that Ctrl-C cannot
stop, and 8 MB of ``EMPTY_SET`` opcodes take 1.5 GB. This reader runs only
the opcodes plain records need (PyTorch's rendezvous state), one at a time in
Python (a signal stops it), and refuses what they never need:

* a memo reference to a container (tuple, dict, set): shared containers are
  what makes a small pickle hash, compare or print in exponential time; a
  record's state is written once, what it shares are records, strings and
  the like;
* a tuple holding a container: tuples (the arguments of a constructor) stay
  flat, so hashing one costs its length;
* more than :data:`MAX_PICKLE_BYTES`, :data:`MAX_OPCODES` opcodes,
  :data:`MAX_CONTAINERS` containers and records, or :data:`MAX_MEMO` memo
  entries: together they bound the memory a pickle can make this reader
  take (tens of MiB at worst; a PyTorch state of 1,000 nodes takes ~1 MiB).

Every refusal, and every malformed pickle, is a :class:`pickle.UnpicklingError`.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable, Mapping
from typing import Any

#: The largest pickle read: a PyTorch rendezvous state of ~10,000 nodes.
MAX_PICKLE_BYTES = 1 << 20
#: The most opcodes run (a node of PyTorch's state takes ~25).
MAX_OPCODES = 250_000
#: The most dicts, sets, tuples and records built (~2 per node): ~11 MiB at most.
MAX_CONTAINERS = 50_000
#: The most memo entries (~6 per node).
MAX_MEMO = 100_000
_CONTAINERS = (tuple, list, dict, set, frozenset)


class Record:
    """What an allowed class of the pickle is read as: built empty, then given its state.

    Subclasses check the state in :meth:`__setstate__` (before anything hashes them).
    """

    def __setstate__(self, state: object) -> None:  # pragma: no cover - subclasses define it
        raise NotImplementedError


def load_records(
    data: bytes,
    records: Mapping[tuple[str, str], type[Record]],
    constructors: Mapping[tuple[str, str], Callable[..., object]],
) -> object:
    """The object pickled in ``data``.

    ``records`` are the classes built by ``NEWOBJ`` and ``BUILD`` (as a
    default ``__reduce_ex__`` pickles an instance); ``constructors`` the
    callables ``REDUCE`` may call (with flat arguments), both by ``(module,
    name)``. Any other global is refused.

    Raises:
        pickle.UnpicklingError: ``data`` is not such a pickle, or is over a bound.
    """
    if len(data) > MAX_PICKLE_BYTES:
        raise pickle.UnpicklingError(
            f"the pickle holds {len(data)} bytes, more than the {MAX_PICKLE_BYTES} allowed"
        )
    return _Machine(data, records, constructors).run()


class _Machine:
    def __init__(
        self,
        data: bytes,
        records: Mapping[tuple[str, str], type[Record]],
        constructors: Mapping[tuple[str, str], Callable[..., object]],
    ) -> None:
        self.data = data
        self.position = 0
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.records = records
        self.constructors = constructors
        self.record_types = tuple(records.values())
        self.constructor_types = tuple(constructors.values())
        self.containers = 0
        self.dispatch: dict[int, Callable[[], None]] = {
            pickle.PROTO[0]: self._proto,
            pickle.FRAME[0]: self._frame,
            pickle.MARK[0]: lambda: self.marks.append(len(self.stack)),
            pickle.POP[0]: self._pop,
            pickle.NONE[0]: lambda: self.stack.append(None),
            pickle.NEWTRUE[0]: lambda: self.stack.append(True),
            pickle.NEWFALSE[0]: lambda: self.stack.append(False),
            pickle.BININT[0]: lambda: self.stack.append(self._unpack("<i")),
            pickle.BININT1[0]: lambda: self.stack.append(self._unpack("<B")),
            pickle.BININT2[0]: lambda: self.stack.append(self._unpack("<H")),
            pickle.LONG1[0]: self._long1,
            pickle.SHORT_BINUNICODE[0]: lambda: self._text("<B"),
            pickle.BINUNICODE[0]: lambda: self._text("<I"),
            pickle.BINUNICODE8[0]: lambda: self._text("<Q"),
            pickle.SHORT_BINBYTES[0]: lambda: self.stack.append(self._sized("<B")),
            pickle.BINBYTES[0]: lambda: self.stack.append(self._sized("<I")),
            pickle.BINBYTES8[0]: lambda: self.stack.append(self._sized("<Q")),
            pickle.EMPTY_TUPLE[0]: lambda: self.stack.append(()),
            pickle.TUPLE1[0]: lambda: self._tuple(self._pop_n(1)),
            pickle.TUPLE2[0]: lambda: self._tuple(self._pop_n(2)),
            pickle.TUPLE3[0]: lambda: self._tuple(self._pop_n(3)),
            pickle.TUPLE[0]: lambda: self._tuple(self._pop_mark()),
            pickle.EMPTY_DICT[0]: lambda: self._container({}),
            pickle.EMPTY_SET[0]: lambda: self._container(set()),
            pickle.SETITEM[0]: lambda: self._set_items(self._pop_n(2)),
            pickle.SETITEMS[0]: lambda: self._set_items(self._pop_mark()),
            pickle.ADDITEMS[0]: self._add_items,
            pickle.MEMOIZE[0]: lambda: self._put(len(self.memo)),
            pickle.BINPUT[0]: lambda: self._put(self._unpack("<B")),
            pickle.LONG_BINPUT[0]: lambda: self._put(self._unpack("<I")),
            pickle.BINGET[0]: lambda: self._get(self._unpack("<B")),
            pickle.LONG_BINGET[0]: lambda: self._get(self._unpack("<I")),
            pickle.STACK_GLOBAL[0]: self._global,
            pickle.NEWOBJ[0]: self._new_object,
            pickle.REDUCE[0]: self._reduce,
            pickle.BUILD[0]: self._build,
        }

    def run(self) -> object:
        data, dispatch = self.data, self.dispatch
        for _ in range(MAX_OPCODES):
            if self.position >= len(data):
                raise pickle.UnpicklingError("the pickle ends without a STOP opcode")
            opcode = data[self.position]
            self.position += 1
            if opcode == pickle.STOP[0]:
                if len(self.stack) != 1 or self.marks:
                    raise pickle.UnpicklingError("the pickle stops with a malformed stack")
                return self.stack[0]
            handler = dispatch.get(opcode)
            if handler is None:
                raise pickle.UnpicklingError(f"refusing the opcode {bytes([opcode])!r}")
            handler()
        raise pickle.UnpicklingError(f"the pickle runs more than {MAX_OPCODES} opcodes")

    # -- reading the bytes ----------------------------------------------------------
    def _take(self, size: int) -> bytes:
        end = self.position + size
        if end > len(self.data):
            raise pickle.UnpicklingError("the pickle ends inside an opcode")
        chunk = self.data[self.position : end]
        self.position = end
        return chunk

    def _unpack(self, layout: str) -> int:
        value: int = struct.unpack(layout, self._take(struct.calcsize(layout)))[0]
        return value

    def _sized(self, layout: str) -> bytes:
        return self._take(self._unpack(layout))

    def _proto(self) -> None:
        if self._unpack("<B") > pickle.HIGHEST_PROTOCOL:
            raise pickle.UnpicklingError("the pickle has an unknown protocol")

    def _frame(self) -> None:
        self._take(8)  # the frame's length: a hint for buffered reading only

    def _long1(self) -> None:
        size = self._unpack("<B")
        if size > 8:  # a pid or a counter, never a number of thousands of digits
            raise pickle.UnpicklingError(f"refusing an integer of {size} bytes")
        self.stack.append(int.from_bytes(self._take(size), "little", signed=True))

    def _text(self, layout: str) -> None:
        try:
            # What pickle does: a str pickled with lone surrogates reads back.
            self.stack.append(self._sized(layout).decode("utf-8", "surrogatepass"))
        except UnicodeDecodeError as exc:
            raise pickle.UnpicklingError(f"a string is not UTF-8 ({exc.reason})") from exc

    # -- the stack --------------------------------------------------------------------
    def _pop(self) -> Any:
        floor = self.marks[-1] if self.marks else 0
        if len(self.stack) <= floor:
            raise pickle.UnpicklingError("the pickle pops an empty stack")
        return self.stack.pop()

    def _pop_n(self, count: int) -> list[Any]:
        items = [self._pop() for _ in range(count)]
        items.reverse()
        return items

    def _pop_mark(self) -> list[Any]:
        if not self.marks:
            raise pickle.UnpicklingError("the pickle has no MARK to collect items from")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def _top(self, kind: type, what: str) -> Any:
        floor = self.marks[-1] if self.marks else 0
        if len(self.stack) <= floor or not isinstance(self.stack[-1], kind):
            raise pickle.UnpicklingError(f"the pickle {what} without a {kind.__name__} to do it to")
        return self.stack[-1]

    # -- containers -------------------------------------------------------------------
    def _container(self, value: object) -> None:
        self.containers += 1
        if self.containers > MAX_CONTAINERS:
            raise pickle.UnpicklingError(
                f"the pickle builds more than {MAX_CONTAINERS} containers and records"
            )
        self.stack.append(value)

    def _tuple(self, items: list[Any]) -> None:
        if any(isinstance(item, _CONTAINERS) for item in items):
            raise pickle.UnpicklingError("refusing a tuple holding a container")
        self._container(tuple(items))

    def _set_items(self, items: list[Any]) -> None:
        if len(items) % 2:
            raise pickle.UnpicklingError("the pickle sets a key without a value")
        target = self._top(dict, "sets items")
        try:
            for index in range(0, len(items), 2):
                target[items[index]] = items[index + 1]
        except TypeError as exc:  # an unhashable key
            raise pickle.UnpicklingError(f"a bad dict key ({exc})") from exc

    def _add_items(self) -> None:
        items = self._pop_mark()
        target = self._top(set, "adds items")
        try:
            target.update(items)
        except TypeError as exc:
            raise pickle.UnpicklingError(f"a bad set member ({exc})") from exc

    # -- the memo ---------------------------------------------------------------------
    def _put(self, index: int) -> None:
        if len(self.memo) >= MAX_MEMO and index not in self.memo:
            raise pickle.UnpicklingError(f"the pickle memoizes more than {MAX_MEMO} values")
        self.memo[index] = self._top(object, "memoizes")

    def _get(self, index: int) -> None:
        if index not in self.memo:
            raise pickle.UnpicklingError(f"the pickle refers to a memo entry {index} never made")
        value = self.memo[index]
        if isinstance(value, _CONTAINERS):
            raise pickle.UnpicklingError(
                f"refusing a memo reference to a {type(value).__name__} (shared containers)"
            )
        self.stack.append(value)

    # -- objects ------------------------------------------------------------------------
    def _global(self) -> None:
        module, name = self._pop_n(2)
        if not isinstance(module, str) or not isinstance(name, str):
            raise pickle.UnpicklingError("the pickle names a global by something not a str")
        found = self.records.get((module, name)) or self.constructors.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"refusing the global {module:.100}.{name:.100}")
        self.stack.append(found)

    def _new_object(self) -> None:
        kind, arguments = self._pop_n(2)
        if not any(kind is allowed for allowed in self.record_types) or arguments != ():
            raise pickle.UnpicklingError("NEWOBJ of something not a record, or with arguments")
        self._container(kind())

    def _reduce(self) -> None:
        function, arguments = self._pop_n(2)
        allowed = any(function is constructor for constructor in self.constructor_types)
        if not allowed or not isinstance(arguments, tuple):
            raise pickle.UnpicklingError("REDUCE of something not an allowed constructor")
        try:
            self.stack.append(function(*arguments))
        except (TypeError, ValueError, OverflowError) as exc:
            raise pickle.UnpicklingError(f"cannot build a {function.__name__} ({exc})") from exc

    def _build(self) -> None:
        state = self._pop()
        self._top(Record, "builds").__setstate__(state)
