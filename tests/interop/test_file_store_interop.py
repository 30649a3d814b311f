"""PyTorch's FileStore and ours share one file (same record format)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed

from tp_store import FileStore

pytestmark = pytest.mark.interop


def test_pytorch_shares_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    ours = FileStore(path, timeout=5)
    theirs = torch.distributed.FileStore(path, -1)
    ours.set("ours", "1")
    theirs.set("theirs", "2")
    assert theirs.get("ours") == b"1"
    assert ours.get("theirs") == b"2"
    assert theirs.add("n", 5) == 5
    assert ours.add("n", 2) == 7
    assert theirs.compare_set("n", "7", "8") == b"8"
    ours.delete_key("ours")
    assert not theirs.check(["ours"])
    assert ours.num_keys() == theirs.num_keys()
    ours.close()
