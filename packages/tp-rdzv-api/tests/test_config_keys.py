"""The warning about config keys a backend does not read, and the store's security keys."""

from __future__ import annotations

import logging

import pytest

from tp_rdzv_api import RendezvousParameters
from tp_rdzv_api.config_keys import (
    LAUNCHER_KEYS,
    STORE_SECURITY_KEYS,
    store_security,
    unknown_config_keys,
    warn_unknown_config_keys,
)

KNOWN = frozenset({"read_timeout", "tls_ca", "tls_cert", "cacert"})


def params(**config: object) -> RendezvousParameters:
    return RendezvousParameters("demo", "127.0.0.1:1", "run", config=config)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "tp_rdzv_api.config_keys"]


def test_unknown_keys_get_one_warning_naming_them_sorted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    found = warn_unknown_config_keys(params(zeta=1, secret="x", read_timeout=5), "demo", KNOWN)
    assert found == ["secret", "zeta"]
    [record] = warnings_of(caplog)
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "rendezvous config keys 'secret', 'zeta' not understood by backend 'demo' and "
        "ignored; backend 'demo' understands: cacert, read_timeout, tls_ca, tls_cert"
    )
    assert (record.action, record.backend, record.keys) == (  # type: ignore[attr-defined]
        "unknown_config_keys",
        "demo",
        ["secret", "zeta"],
    )


def test_a_likely_typo_gets_the_known_key_it_resembles(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    config = {"tls_cax": "ca.pem", "ca_cert": "ca.pem", "read_timout": 5, "secret": "x"}
    warn_unknown_config_keys(params(**config), "demo", KNOWN)
    [record] = warnings_of(caplog)
    assert record.getMessage().startswith(
        "rendezvous config keys 'ca_cert' (did you mean 'cacert'?), 'read_timout' (did you "
        "mean 'read_timeout'?), 'secret', 'tls_cax' (did you mean 'tls_ca'?) not understood "
        "by backend 'demo' and ignored"
    )


def test_known_keys_and_the_launchers_keys_are_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    # torchrun passes timeout to every backend, whether it reads it or not.
    assert "timeout" in LAUNCHER_KEYS
    config = dict.fromkeys(KNOWN | LAUNCHER_KEYS, "1")
    assert warn_unknown_config_keys(params(**config), "demo", KNOWN) == []
    assert warn_unknown_config_keys(params(), "demo", KNOWN) == []
    assert warnings_of(caplog) == []


def test_a_single_key_is_named_in_the_singular(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    warn_unknown_config_keys(params(secret="x"), "demo", ())
    [record] = warnings_of(caplog)
    assert record.getMessage() == (
        "rendezvous config key 'secret' not understood by backend 'demo' and ignored; "
        "backend 'demo' understands: (no config keys)"
    )


def test_unknown_config_keys_without_logging(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    assert unknown_config_keys(params(b=1, a=2, tls_ca="x"), KNOWN) == ["a", "b"]
    assert warnings_of(caplog) == []


def test_store_security_reads_the_tcp_store_keys() -> None:
    assert STORE_SECURITY_KEYS == ("tls_cert", "tls_key", "tls_ca", "tls_client_ca", "secret_file")
    assert store_security(params(tls_ca=" ca.pem ", secret_file="s", other="x").config) == {
        "tls_ca": "ca.pem",
        "secret_file": "s",
    }
    assert store_security(params().config) == {}


@pytest.mark.parametrize("bad", ["", "  ", 3, True])
def test_store_security_rejects_a_value_that_is_not_a_path(bad: object) -> None:
    with pytest.raises(ValueError, match=r"option 'tls_cert' must be the path of a file"):
        store_security(params(tls_cert=bad).config)
