"""Which host names a server may call its own for same-origin checks (every HTTP door of
the stack: the TTS, the token page, the agent's WebSockets).

A page whose Origin names the request's own Host is same-origin only when that name is
one the server knows is its own: a loopback name, an IP literal, or a host named in the
server's allowed origins. Any other name in Host may be a DNS-rebinding page's own
(evil.example resolved to 127.0.0.1): there Host is the attacker's, not ours.
"""

from __future__ import annotations

import ipaddress

__all__ = ["own_host"]


def own_host(host: str | None, named: set[str]) -> bool:
    """`host` (an Origin's or a Host header's name) is ours: a loopback name, an IP
    literal, or one of `named` (the hosts of the server's allowed origins)."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost") or host in named:
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
