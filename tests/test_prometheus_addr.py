"""``PROFILED_PROMETHEUS_ADDR`` (issue 29, item 19): ``[::1]:0`` was parsed, then never served.
The parse returns the pair a socket binds and ``addr_family`` the family to bind it with; these
tests bind real sockets with what it returns. Forms that do not say where to listen (no host,
an IPv6 address without brackets, brackets around anything else) are refused."""

from __future__ import annotations

import socket
import warnings

import pytest

from instrument import Config, ConfigWarning
from instrument.base.settings import addr_family, parse_addr
from instrument.testing import forget_warnings

GOOD = {
    "[::1]:0": ("::1", 0, socket.AF_INET6),
    "[::]:9464": ("::", 9464, socket.AF_INET6),
    "0.0.0.0:9464": ("0.0.0.0", 9464, socket.AF_INET),
    "localhost:9464": ("localhost", 9464, socket.AF_INET),
    " 127.0.0.1:0 ": ("127.0.0.1", 0, socket.AF_INET),
    "[fe80::1%lo]:9464": ("fe80::1%lo", 9464, socket.AF_INET6),
    "metrics-1.example.com:65535": ("metrics-1.example.com", 65535, socket.AF_INET),
}

BAD = [
    ":9464",  # every interface must be asked for by name
    "::1:9464",  # an IPv6 address without brackets: where does the port start?
    "[::1]",
    "[::1]9464",
    "[]:9464",
    "[::1:9464",
    "::1]:9464",
    "[1.2.3.4]:80",  # brackets are for IPv6
    "[::g]:1",
    "local host:80",
    "-host:80",
    "a..b:80",
    "h\u00e9:80",
    "h:70000",
    "h:-1",
    "h:+1",
    "h:\u0669",  # a digit, not an ASCII one
    "9464",
    "localhost",
    "",
]


@pytest.mark.parametrize("text", sorted(GOOD))
def test_good_addresses_give_the_pair_and_family_a_socket_binds(text):
    host, port, family = GOOD[text]
    assert parse_addr(text) == (host, port)
    assert addr_family(host) is family


@pytest.mark.parametrize("text", BAD)
def test_bad_addresses_are_refused_saying_what_was_expected(text):
    with pytest.raises(ValueError, match=r"expected host:port \(port 0-65535\)"):
        parse_addr(text)
    forget_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = Config.from_env({"PROFILED_PROMETHEUS_ADDR": text})
    ours = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert config.prometheus_addr == "127.0.0.1:9464"
    assert len(ours) == 1 and "using the default PROFILED_PROMETHEUS_ADDR=127.0.0.1:9464" in ours[0]


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("text", ["127.0.0.1:0", "localhost:0", "[::1]:0", "[::]:0", "0.0.0.0:0"])
def test_what_the_parse_returns_binds_and_serves_a_real_socket(text):
    host, port = parse_addr(text)
    if addr_family(host) is socket.AF_INET6 and not _has_ipv6_loopback():
        pytest.skip("no IPv6 on this host")
    with socket.socket(addr_family(host), socket.SOCK_STREAM) as server:
        server.bind((host, port))
        server.listen(1)
        bound = server.getsockname()[1]
        assert bound > 0
        # connect over the loopback of the same family: the listener is really there
        loop = "::1" if addr_family(host) is socket.AF_INET6 else "127.0.0.1"
        with socket.create_connection((loop, bound), timeout=10) as client:
            peer, _ = server.accept()
            with peer:
                client.sendall(b"ping")
                assert peer.recv(4) == b"ping"
