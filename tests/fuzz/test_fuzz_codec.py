"""A brief run of the codec fuzzer (``fuzz_codec.py``) for CI; at length: ``nox -s fuzz``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fuzz_codec as fuzz
import pytest

from tp_store.protocol import Get, Ping, Set, Validate

SCRIPT = Path(fuzz.__file__)


#: Examples per property in CI: a few seconds in all.
CI_EXAMPLES = 300


@pytest.mark.parametrize("index", range(4), ids=["bytes", "mutated", "valid", "replies"])
def test_property_holds(index: int) -> None:
    before = fuzz.FIGURES.examples
    fuzz._given_all(CI_EXAMPLES, None)[index]()
    assert fuzz.FIGURES.examples - before >= CI_EXAMPLES // 2


def test_a_valid_stream_split_anywhere_is_parsed_exactly() -> None:
    stream = [Validate(0x3C85F7CE), Set(b"k", b"v" * 300), Get(b"k"), Ping(7)]
    data = b"".join(request.encode() for request in stream)
    for sizes in ([1], [3, 1000], [len(data)]):
        result = fuzz.check_stream(data, sizes, fuzz.DEFAULT_LIMITS)
        assert list(result.requests) == stream
        assert not result.refused


def test_a_stream_over_the_limits_is_refused_from_its_prefix() -> None:
    # A SET whose value claims 2**40 bytes: refused before any value arrives.
    data = Validate(0x3C85F7CE).encode() + bytes([Set(b"", b"").encode()[0]])
    data += (1).to_bytes(8, "little") + b"k" + (2**40).to_bytes(8, "little")
    result = fuzz.check_stream(data, [1], fuzz.SMALL_LIMITS)
    assert result.refused
    assert result.requests == (Validate(0x3C85F7CE),)


def test_the_atheris_entry_point_runs_without_atheris() -> None:
    # The libFuzzer callback is plain Python: it must accept any input.
    for data in (b"", b"\x00", b"\x03\x41" + bytes(range(256)), b"\x02\xff" + b"\x01" * 64):
        fuzz.atheris_one_input(data)


def test_cli_prints_json_figures() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--examples", "200", "--seconds", "60", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(result.stdout)
    assert figures["crashes"] == 0
    assert figures["examples"] >= 200
    assert figures["bytes_fed"] > 0
    assert figures["protocol_errors"] > 0
