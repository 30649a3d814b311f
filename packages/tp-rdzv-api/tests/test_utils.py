"""``parse_rendezvous_endpoint`` and ``parse_rendezvous_config``."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tp_rdzv_api.utils import parse_rendezvous_config, parse_rendezvous_endpoint

# -- endpoints ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("example.com:1234", ("example.com", 1234)),
        ("example.com", ("example.com", 29400)),
        ("node_1.cluster-a.local:80", ("node_1.cluster-a.local", 80)),
        ("localhost:0", ("localhost", 0)),
        ("127.0.0.1:65535", ("127.0.0.1", 65535)),
        ("10.0.0.1", ("10.0.0.1", 29400)),
        ("  host:5  ", ("host", 5)),
        ("host:00080", ("host", 80)),
        ("[::1]:8080", ("::1", 8080)),
        ("[::1]", ("::1", 29400)),
        ("[fe80::1%eth0]:5", ("fe80::1%eth0", 5)),
        ("[2001:db8::ff00:42:8329]:443", ("2001:db8::ff00:42:8329", 443)),
        ("::1", ("::1", 29400)),
        ("fe80::1", ("fe80::1", 29400)),
        ("::", ("::", 29400)),
        ("::ffff:10.0.0.1", ("::ffff:10.0.0.1", 29400)),
        ("2001:db8::1:80", ("2001:db8::1:80", 29400)),  # two or more colons: an address
        ("", ("localhost", 29400)),
        ("   ", ("localhost", 29400)),
        (None, ("localhost", 29400)),
    ],
)
def test_accepted_endpoints(endpoint: str | None, expected: tuple[str, int]) -> None:
    assert parse_rendezvous_endpoint(endpoint, default_port=29400) == expected


@pytest.mark.parametrize(
    ("endpoint", "reason"),
    [
        ("host:", "the port after ':' is empty"),
        ("host:abc", "the port 'abc' is not a number"),
        ("host:-1", "the port '-1' is not a number"),
        ("host:+80", "the port '+80' is not a number"),
        ("host: 80", "the port ' 80' is not a number"),
        ("host:8.0", "the port '8.0' is not a number"),
        ("host:65536", "the port 65536 is out of range 0..65535"),
        ("host:99999999999", "out of range 0..65535"),
        ("host:" + "9" * 5000, "out of range 0..65535"),  # not int()'s digit-limit message
        (":80", "the host is empty"),
        ("ho st:80", "the host 'ho st' may only contain letters, digits"),
        ("host/path:80", "may only contain letters, digits"),
        ("http://host:80", "several ':' but is not a valid IPv6 address"),
        ("héllo:80", "may only contain letters, digits"),
        ("a" * 254, "longer than 253 characters"),
        ("999.1.1.1:80", "'999.1.1.1' is not a valid IPv4 address"),
        ("1.2.3:80", "'1.2.3' is not a valid IPv4 address"),
        ("[::1", "'[' has no matching ']'"),
        ("[]:80", "the brackets hold no address"),
        ("[]", "the brackets hold no address"),
        ("[example.com]:80", "'example.com' in brackets is not a valid IPv6 address"),
        ("[10.0.0.1]:80", "'10.0.0.1' in brackets is not a valid IPv6 address"),
        ("[::1]80", "expected ':port' after ']', got '80'"),
        ("[::1]:", "the port after ':' is empty"),
        ("[::1]:http", "the port 'http' is not a number"),
        ("[::1]:70000", "out of range"),
        (":::1", "several ':' but is not a valid IPv6 address"),
        ("fe80::1::2", "several ':' but is not a valid IPv6 address"),
        ("host:80:90", "several ':' but is not a valid IPv6 address"),
    ],
)
def test_rejected_endpoints(endpoint: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)) as info:
        parse_rendezvous_endpoint(endpoint, default_port=29400)
    assert str(info.value).startswith(f"invalid rendezvous endpoint {endpoint!r}: ")


def test_default_port_is_validated() -> None:
    with pytest.raises(ValueError, match=r"default_port must be in 0\.\.65535"):
        parse_rendezvous_endpoint("host", default_port=70000)
    with pytest.raises(TypeError, match="default_port must be an int"):
        parse_rendezvous_endpoint("host", default_port="80")  # type: ignore[arg-type]


def test_non_string_endpoint() -> None:
    with pytest.raises(TypeError, match="endpoint must be a str or None"):
        parse_rendezvous_endpoint(80, default_port=1)  # type: ignore[arg-type]


_LABEL = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,10}", fullmatch=True)


@given(
    host=st.lists(_LABEL, min_size=1, max_size=4).map(".".join),
    port=st.integers(0, 65535),
)
def test_host_port_round_trip(host: str, port: int) -> None:
    assert parse_rendezvous_endpoint(f"{host}:{port}", default_port=1) == (host, port)


@given(address=st.ip_addresses(v=6), port=st.integers(0, 65535))
def test_ipv6_round_trip(address: object, port: int) -> None:
    text = str(address)
    assert parse_rendezvous_endpoint(f"[{text}]:{port}", default_port=1) == (text, port)
    if text.count(":") >= 2:
        assert parse_rendezvous_endpoint(text, default_port=7) == (text, 7)


# -- config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("   ", {}),
        ("a=1", {"a": "1"}),
        ("a=1,b=two", {"a": "1", "b": "two"}),
        (" a = 1 , b= 2 ", {"a": "1", "b": "2"}),
        ("url=http://h:1/?x=y", {"url": "http://h:1/?x=y"}),
        ("is_host=true,join_timeout=30", {"is_host": "true", "join_timeout": "30"}),
    ],
)
def test_config_parses(text: str, expected: dict[str, str]) -> None:
    assert parse_rendezvous_config(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a", "item 1 'a' has no '='"),
        ("a=1,b", "item 2 'b' has no '='"),
        ("=1", "item 1 '=1' has an empty key"),
        ("a=", "item 1 'a=' has an empty value"),
        ("a= ", "item 1 'a=' has an empty value"),
        ("a=1,a=2", "item 2 'a=2' repeats the key 'a'"),
        ("a=1,", "item 2 is empty"),
        ("a=1,,b=2", "item 2 is empty"),
        (",a=1", "item 1 is empty"),
    ],
)
def test_config_errors_name_the_item(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)) as info:
        parse_rendezvous_config(text)
    assert str(info.value).startswith(f"invalid rendezvous config {text!r}: ")


def test_config_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        parse_rendezvous_config(None)  # type: ignore[arg-type]


@given(
    st.dictionaries(
        st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True),
        st.from_regex(r"[A-Za-z0-9:/.=]{1,8}", fullmatch=True),
        max_size=6,
    )
)
def test_config_round_trip(config: dict[str, str]) -> None:
    text = ",".join(f"{key}={value}" for key, value in config.items())
    assert parse_rendezvous_config(text) == config
