"""Rate limiting per client (429 + Retry-After) and the CORS allowlist (403 for others),
over HTTP; plus the token bucket's refill and bounded memory with a fake clock."""

from __future__ import annotations

from voice_token.ratelimit import RateLimiter

OK = {"room": "demo", "identity": "alice"}


async def test_burst_then_429_with_retry_after(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for(token_rate_limit_burst=3, token_rate_limit_per_minute=6)
    statuses = [(await client.post("/api/token", json=OK)).status for _ in range(3)]
    assert statuses == [200, 200, 200]
    resp = await client.post("/api/token", json=OK)
    assert resp.status == 429
    assert "too many token requests" in (await resp.json())["error"]
    assert 1 <= int(resp.headers["Retry-After"]) <= 10  # 6/min -> one every 10 s
    # Junk counts too, so a flood of bad requests is limited the same way.
    assert (await client.post("/api/token", data=b"x")).status == 429
    text = await (await client.get("/metrics")).text()
    assert 'token_requests_total{status="429"} 2.0' in text


async def test_forwarded_for_only_when_trusted(client_for) -> None:  # type: ignore[no-untyped-def]
    trusted = await client_for(token_rate_limit_burst=1, token_trust_proxy=True)
    h1, h2 = {"X-Forwarded-For": "203.0.113.1"}, {"X-Forwarded-For": "10.0.0.1, 203.0.113.2"}
    assert (await trusted.post("/api/token", json=OK, headers=h1)).status == 200
    assert (await trusted.post("/api/token", json=OK, headers=h1)).status == 429
    assert (await trusted.post("/api/token", json=OK, headers=h2)).status == 200
    # the entry our proxy appended (the rightmost) is the client, whatever is left of it
    h3 = {"X-Forwarded-For": "198.51.100.7, 203.0.113.2"}
    assert (await trusted.post("/api/token", json=OK, headers=h3)).status == 429
    two = await client_for(token_rate_limit_burst=1, token_trust_proxy=True,
                           token_proxy_hops=2)  # a CDN, then our proxy: second from right
    h4 = {"X-Forwarded-For": "1.2.3.4, 203.0.113.9, 10.0.0.2"}
    h5 = {"X-Forwarded-For": "5.6.7.8, 203.0.113.9, 10.0.0.3"}
    assert (await two.post("/api/token", json=OK, headers=h4)).status == 200
    assert (await two.post("/api/token", json=OK, headers=h5)).status == 429

    untrusted = await client_for(token_rate_limit_burst=1)
    assert (await untrusted.post("/api/token", json=OK, headers=h1)).status == 200
    # A client cannot pick itself a fresh bucket by inventing a header.
    assert (await untrusted.post("/api/token", json=OK, headers=h2)).status == 429


def test_bucket_refills_at_the_configured_rate() -> None:
    now = [100.0]
    lim = RateLimiter(per_minute=60, burst=2, clock=lambda: now[0])
    assert lim.acquire("a") == 0 and lim.acquire("a") == 0
    wait = lim.acquire("a")
    assert 0.99 <= wait <= 1.01  # 60/min = one per second
    assert lim.acquire("b") == 0  # other clients are independent
    now[0] += 0.5
    assert lim.acquire("a") > 0
    now[0] += 0.6
    assert lim.acquire("a") == 0
    now[0] += 100  # refills to the burst, never beyond
    assert [lim.acquire("a") for _ in range(3)][:2] == [0, 0]
    assert lim.acquire("a") > 0


def test_client_table_is_bounded() -> None:
    now = [0.0]
    lim = RateLimiter(per_minute=1, burst=5, max_clients=100, clock=lambda: now[0])
    for i in range(1000):
        now[0] += 0.001
        lim.acquire(f"10.0.{i // 256}.{i % 256}")
        assert len(lim) <= 100


async def test_cors_allowlist(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for(token_cors_origins="https://app.example.com, http://localhost:3000/")
    # No Origin (curl, a backend): allowed, CORS is a browser matter.
    assert (await client.post("/api/token", json=OK)).status == 200
    # Allowlisted: allowed, with the headers the browser needs to read the answer.
    resp = await client.post("/api/token", json=OK, headers={"Origin": "https://app.example.com"})
    assert resp.status == 200
    assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
    assert resp.headers["Vary"] == "Origin"
    resp = await client.post("/api/token", json=OK, headers={"Origin": "http://localhost:3000"})
    assert resp.status == 200
    # Not allowlisted: refused before a token is minted, and no CORS headers.
    resp = await client.post("/api/token", json=OK, headers={"Origin": "https://evil.example"})
    assert resp.status == 403
    out = await resp.json()
    assert "not allowed" in out["error"] and "TOKEN_CORS_ORIGINS" in out["error"]
    assert "participant_token" not in out
    assert "Access-Control-Allow-Origin" not in resp.headers
    # Same origin as the page (the service's own host): always allowed.
    same = f"http://{client.server.host}:{client.server.port}"
    assert (await client.post("/api/token", json=OK, headers={"Origin": same})).status == 200


async def test_a_dns_rebinding_page_is_not_same_origin(client_for) -> None:  # type: ignore[no-untyped-def]
    # evil.example resolved to 127.0.0.1: the page's Origin and the Host agree, both its own.
    client = await client_for(token_cors_origins="https://voice.example.com")
    port = client.server.port
    for host, status in ((f"evil.example:{port}", 403), (f"localhost:{port}", 200),
                         (f"127.0.0.1:{port}", 200), ("voice.example.com", 200)):
        resp = await client.post("/api/token", json=OK, headers={
            "Origin": f"http://{host}", "Host": host})
        assert resp.status == status, (host, await resp.text())


async def test_cors_preflight(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for(token_cors_origins="https://app.example.com")
    pre = {"Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "content-type"}
    resp = await client.options("/api/token", headers={"Origin": "https://app.example.com", **pre})
    assert resp.status == 204
    assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example.com"
    assert "POST" in resp.headers["Access-Control-Allow-Methods"]
    assert "Content-Type" in resp.headers["Access-Control-Allow-Headers"]
    resp = await client.options("/api/token", headers={"Origin": "https://evil.example", **pre})
    assert resp.status == 403
    assert "Access-Control-Allow-Origin" not in resp.headers


async def test_cors_wildcard(client_for) -> None:  # type: ignore[no-untyped-def]
    client = await client_for(token_cors_origins="*")
    resp = await client.post("/api/token", json=OK, headers={"Origin": "https://any.example"})
    assert resp.status == 200
    assert resp.headers["Access-Control-Allow-Origin"] == "https://any.example"


async def test_same_origin_behind_a_trusted_proxy(client_for) -> None:  # type: ignore[no-untyped-def]
    # A proxy serving the page at https://voice.example.com and rewriting Host.
    hdrs = {"Origin": "https://voice.example.com", "X-Forwarded-Host": "voice.example.com"}
    trusted = await client_for(token_trust_proxy=True)
    assert (await trusted.post("/api/token", json=OK, headers=hdrs)).status == 200
    # Without TOKEN_TRUST_PROXY the header is the client's word only: refused.
    untrusted = await client_for()
    assert (await untrusted.post("/api/token", json=OK, headers=hdrs)).status == 403


async def test_made_up_first_hops_through_an_appending_proxy_share_one_bucket(
        client_for, aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    """A proxy like nginx with `$proxy_add_x_forwarded_for` keeps what the client sent
    and appends the address it saw: the client's own entries must not pick its bucket."""
    import aiohttp
    from aiohttp import web

    token = await client_for(token_rate_limit_burst=10, token_rate_limit_per_minute=6,
                             token_trust_proxy=True)
    upstream = str(token.make_url("/api/token"))

    async def proxy(request: web.Request) -> web.Response:
        seen = request.headers.get("X-Forwarded-For")
        forwarded = f"{seen}, {request.remote}" if seen else str(request.remote)
        async with aiohttp.ClientSession() as s, s.post(
                upstream, data=await request.read(),
                headers={"Content-Type": "application/json",
                         "X-Forwarded-For": forwarded}) as r:
            return web.Response(status=r.status, body=await r.read())

    app = web.Application()
    app.router.add_post("/api/token", proxy)
    via = await aiohttp_client(app)
    statuses = [(await via.post("/api/token", json=OK, headers={
        "X-Forwarded-For": f"198.51.100.{i}"})).status for i in range(15)]
    assert statuses == [200] * 10 + [429] * 5, statuses
