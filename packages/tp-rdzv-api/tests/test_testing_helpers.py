"""tp_rdzv_api.testing: the helpers backend tests use to check their config keys."""

from __future__ import annotations

import logging

import pytest

from tp_rdzv_api import RendezvousParameters
from tp_rdzv_api.config_keys import warn_unknown_config_keys
from tp_rdzv_api.testing import RecordingConfig, config_key_warnings


def test_recording_config_records_every_way_a_key_is_read() -> None:
    config = RecordingConfig({"a": 1, "b": 2}, c=3)
    assert config.get("a") == 1
    assert config["b"] == 2
    assert "missing" not in config
    assert config.get("absent", 7) == 7
    assert config.read == {"a", "b", "missing", "absent"}
    assert dict(config) == {"a": 1, "b": 2, "c": 3}


def test_config_key_warnings_keeps_only_the_unknown_key_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    logging.getLogger("somewhere.else").warning("unrelated")
    params = RendezvousParameters("mine", "h:1", "run", 1, 1, colour="blue")
    warn_unknown_config_keys(params, "mine", {"shape"})
    [message] = config_key_warnings(caplog.records)
    assert "'colour'" in message
    assert "backend 'mine'" in message
