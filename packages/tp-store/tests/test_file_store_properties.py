"""A FileStore file holding anything: a FileStore opened on it reads its values or
raises StoreError, in bounded time and memory (``within_bounds``).

Whoever can write the file (its owner; PyTorch's FileStore makes it 0644)
chooses its bytes. The strategies start from real files (the records of real
writes) with bytes flipped, inserted or cut, and from raw bytes.
"""

from __future__ import annotations

import os
import tempfile
import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tp_store.errors import StoreError
from tp_store.stores.file_store import FileStore
from tp_store.testing.bounds import within_bounds

EXAMPLES = int(os.environ.get("TP_HOSTILE_EXAMPLES", "80"))


def _real_file() -> bytes:
    """The bytes of a FileStore file after a few writes of every kind."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "store")
        store = FileStore(path, 1)
        store.set("key", "value")
        store.add("counter", 3)
        store.compare_set("key", "value", "other")
        store.queue_push("queue", b"\x00\xff" * 10)
        store.queue_pop("queue")
        store.delete_key("counter")
        with open(path, "rb") as file:
            data = file.read()
        store.close()
        return data


REAL = _real_file()


@st.composite
def damaged_files(draw: st.DrawFn) -> bytes:
    """A real file with a few bytes changed, inserted or cut."""
    data = bytearray(REAL)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "insert", "cut"]))
        if kind == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[at : at + draw(st.integers(1, 16))]
    return bytes(data)


#: Lengths that claim far more than the file holds, checksummed or not.
_CLAIMS = st.integers(0, 0xFFFFFFFF).map(lambda length: length.to_bytes(4, "little"))
FILES = st.one_of(
    damaged_files(),
    st.binary(max_size=4096),
    st.tuples(_CLAIMS, st.binary(max_size=64)).map(lambda parts: parts[0] + parts[1]),
    st.integers(0, 1 << 20).map(lambda size: zlib.compress(b"\x00" * size)),
)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(FILES)
def test_a_file_store_on_any_file_reads_or_is_a_store_error(tmp_path, data):
    path = tmp_path / "store"
    path.write_bytes(data)

    def read() -> object:
        store = FileStore(str(path), 1)
        try:
            return store.check(["key"]) and store.get("key"), store.num_keys()
        finally:
            store.close()

    within_bounds(read, (StoreError,))
