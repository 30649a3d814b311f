"""Parsing of the strings a user types: rendezvous endpoints and ``k=v,k=v`` configs."""

from __future__ import annotations

import ipaddress
import re
from typing import NoReturn

#: The host used when the endpoint is empty, as in PyTorch.
DEFAULT_HOST = "localhost"

_HOST_NAME = re.compile(r"[A-Za-z0-9._-]+")
_DOTTED_NUMBERS = re.compile(r"[0-9.]+")
_DIGITS = re.compile(r"[0-9]+")
_MAX_HOST_LENGTH = 253


def _fail(endpoint: str, reason: str) -> NoReturn:
    raise ValueError(f"invalid rendezvous endpoint {endpoint!r}: {reason}")


def _parse_port(endpoint: str, text: str) -> int:
    if not text:
        _fail(endpoint, "the port after ':' is empty")
    if not _DIGITS.fullmatch(text):
        _fail(endpoint, f"the port {text!r:.40} is not a number")
    # Compared as text first: int() refuses more than 4300 digits with its own message.
    if len(text.lstrip("0")) > 5 or int(text) > 65535:
        _fail(endpoint, f"the port {text:.40} is out of range 0..65535")
    return int(text)


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _check_host_name(endpoint: str, host: str) -> None:
    if not host:
        _fail(endpoint, "the host is empty")
    if len(host) > _MAX_HOST_LENGTH:
        _fail(endpoint, f"the host is longer than {_MAX_HOST_LENGTH} characters")
    if not _HOST_NAME.fullmatch(host):
        _fail(
            endpoint,
            f"the host {host!r} may only contain letters, digits, '.', '-' and '_' "
            "(write an IPv6 address with a port as [address]:port)",
        )
    if _DOTTED_NUMBERS.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            _fail(endpoint, f"the host {host!r} is not a valid IPv4 address")


def parse_rendezvous_endpoint(endpoint: str | None, default_port: int) -> tuple[str, int]:
    """Split a rendezvous endpoint into ``(host, port)``.

    Accepted forms (surrounding whitespace is ignored):

    - ``host:port`` and ``host``: a host name (letters, digits, ``.``, ``-``,
      ``_``) or an IPv4 address;
    - ``[v6]:port`` and ``[v6]``: an IPv6 address in brackets (returned
      without them);
    - a bare IPv6 address such as ``::1`` or ``fe80::1``: two or more colons
      without brackets always mean an address, with ``default_port``;
    - ``None`` or an empty string: ``("localhost", default_port)``.

    The port must be a decimal number in 0..65535. Every malformed endpoint
    is a ``ValueError`` quoting it.
    """
    if not isinstance(default_port, int) or isinstance(default_port, bool):
        raise TypeError(f"default_port must be an int, got {default_port!r}")
    if not 0 <= default_port <= 65535:
        raise ValueError(f"default_port must be in 0..65535, got {default_port}")
    if endpoint is None:
        return DEFAULT_HOST, default_port
    if not isinstance(endpoint, str):
        raise TypeError(f"a rendezvous endpoint must be a str or None, got {endpoint!r}")
    text = endpoint.strip()
    if not text:
        return DEFAULT_HOST, default_port

    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            _fail(endpoint, "'[' has no matching ']'")
        host, rest = text[1:close], text[close + 1 :]
        if not host:
            _fail(endpoint, "the brackets hold no address")
        if not _is_ipv6(host):
            _fail(endpoint, f"{host!r} in brackets is not a valid IPv6 address")
        if not rest:
            return host, default_port
        if not rest.startswith(":"):
            _fail(endpoint, f"expected ':port' after ']', got {rest!r}")
        return host, _parse_port(endpoint, rest[1:])

    if text.count(":") >= 2:
        if not _is_ipv6(text):
            _fail(
                endpoint,
                "it has several ':' but is not a valid IPv6 address "
                "(write an IPv6 address with a port as [address]:port)",
            )
        return text, default_port

    host, colon, port_text = text.partition(":")
    _check_host_name(endpoint, host)
    return host, _parse_port(endpoint, port_text) if colon else default_port


def parse_rendezvous_config(text: str) -> dict[str, str]:
    """Parse ``key=value,key=value`` into a ``dict`` of strings.

    Whitespace around items, keys and values is stripped; an empty (or blank)
    string gives ``{}``. A value may contain ``=`` (the first one splits).
    An empty item, an item without ``=``, an empty key, an empty value and a
    repeated key are each a ``ValueError`` naming the item.
    """
    if not isinstance(text, str):
        raise TypeError(f"a rendezvous config must be a str, got {text!r}")
    config: dict[str, str] = {}
    if not text.strip():
        return config
    for number, item in enumerate(text.split(","), start=1):
        where = f"invalid rendezvous config {text!r}: item {number}"
        entry = item.strip()
        if not entry:
            raise ValueError(f"{where} is empty (stray ',')")
        key, equals, value = (part.strip() for part in entry.partition("="))
        if not equals:
            raise ValueError(f"{where} {entry!r} has no '=' (expected key=value)")
        if not key:
            raise ValueError(f"{where} {entry!r} has an empty key")
        if not value:
            raise ValueError(f"{where} {entry!r} has an empty value")
        if key in config:
            raise ValueError(f"{where} {entry!r} repeats the key {key!r}")
        config[key] = value
    return config
