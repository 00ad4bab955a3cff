"""own_host: the names a server may call its own in a same-origin check."""

from voice_keys.origins import own_host


def test_loopback_ip_literals_and_named_hosts_are_ours_other_names_are_not() -> None:
    for host in ("localhost", "LOCALHOST", "app.localhost", "127.0.0.1", "[::1]", "::1",
                 "10.0.0.7", "192.168.1.20"):
        assert own_host(host, set()), host
    assert own_host("voice.example", {"voice.example"})
    for host in ("evil.example", "localhost.evil.example", "", None, "voice.example.evil"):
        assert not own_host(host, {"voice.example"}), host
