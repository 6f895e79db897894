"""A local Pelican federation over HTTPS, for tests of anything that touches pelican:// URLs.

Why it exists: muongen reaches the OSDF through the real pelicanfs client, and a mock of
that client would only test our guesses about it. This module starts, on 127.0.0.1, the
servers pelicanfs 1.5 actually talks to, with a certificate authority made by trustme:

- discovery (federation port): ``GET /.well-known/pelican-configuration`` -> JSON with
  ``director_endpoint``;
- director (same port): GET/HEAD/PROPFIND ``/<path>`` -> 307 to the origin with ``Link``
  and ``X-Pelican-Namespace: namespace=..., require-token=..., collections-url=...``;
  ``GET /api/v1.0/director/origin/<path>`` -> 307 to the origin (what ``put`` asks);
- origin (its own port): GET (with Range), HEAD, PROPFIND (Depth 0/1 WebDAV listings) and
  PUT (chunked uploads, written to a temp name then renamed) over a folder on disk.

Namespaces either serve anyone or require a bearer token whose ``scope`` claim holds
``storage.read:/path`` (reads) or ``storage.create:/path`` / ``storage.modify:/path``
(writes); writes always need a token. Tokens are HS256 JWTs made by :meth:`Federation.token`
(the origin reads their claims without checking the signature, like a test double should).

Faults are injected per test with :meth:`Federation.inject` (a 5xx status, a dropped
connection, a truncated body, a slow response) and :attr:`Federation.latency_s` adds a
delay to every request. :attr:`Federation.log` records each request for assertions.

Use it from pytest through the fixtures in ``tests/storage/conftest.py``
(``pelican_federation`` for a fresh federation per test), or directly::

    with Federation(tmp_path) as fed:
        fed.put_bytes("/icecube/sim/a.parquet", b"...")
        url = fed.url("/icecube/sim/a.parquet")   # pelican://127.0.0.1:<port>/icecube/...

The client must trust the CA: set ``SSL_CERT_FILE`` to :attr:`Federation.ca_file` (the
fixtures do); muongen builds its SSL context from that variable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import jwt
import pytest
import trustme
from aiohttp import web

TOKEN_SECRET = (
    "muongen-test-federation-hs256-key!"  # HS256 key of test tokens (never a real secret)
)
HOST = "127.0.0.1"


@dataclass
class Namespace:
    """A federation namespace: its path prefix and whether reading needs a token."""

    prefix: str
    require_token: bool = False


@dataclass
class Fault:
    """One injected fault; ``times`` is how many matching requests it still affects."""

    kind: str  # "status" | "drop" | "truncate" | "slow"
    site: str = "origin"  # "origin" | "director"
    method: str | None = None
    path: str | None = None  # substring of the request path
    times: int = 1
    status: int = 503
    delay_s: float = 2.0


@dataclass
class Logged:
    """One request as the servers saw it."""

    site: str
    method: str
    path: str
    authorized: bool  # an Authorization header was present
    range: str | None = None


DEFAULT_NAMESPACES = (
    Namespace("/public", require_token=False),
    Namespace("/icecube", require_token=True),
)


@dataclass
class Federation:
    """Discovery + director + origin on 127.0.0.1 over TLS, serving ``root`` on disk."""

    root: Path
    namespaces: tuple[Namespace, ...] = DEFAULT_NAMESPACES
    latency_s: float = 0.0
    faults: list[Fault] = field(default_factory=list)
    log: list[Logged] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.storage = self.root / "origin"
        self.storage.mkdir(parents=True, exist_ok=True)
        self._ca = trustme.CA()
        self.ca_file = str(self.root / "federation-ca.pem")
        self._ca.cert_pem.write_to_path(self.ca_file)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list[web.AppRunner] = []
        self._truncate: set[int] = set()  # ids of requests whose body is cut short
        self.director_port = 0
        self.origin_port = 0

    # ---- addresses -------------------------------------------------------------------
    @property
    def host(self) -> str:
        """``127.0.0.1:<port>`` of the federation (what a pelican:// URL names)."""
        return f"{HOST}:{self.director_port}"

    @property
    def origin(self) -> str:
        return f"https://{HOST}:{self.origin_port}"

    def url(self, path: str) -> str:
        """``pelican://127.0.0.1:<port><path>`` for a namespace path."""
        return f"pelican://{self.host}{path}"

    # ---- content and tokens ------------------------------------------------------------
    def local(self, path: str) -> Path:
        """Where the origin keeps the object at namespace ``path``."""
        return self.storage / path.lstrip("/")

    def put_bytes(self, path: str, data: bytes) -> Path:
        """Place an object on the origin directly (test setup, no HTTP)."""
        p = self.local(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        return p

    @staticmethod
    def token(scopes: str, *, exp_in_s: float = 3600.0, **claims: Any) -> str:
        """An HS256 JWT with the given space-separated ``scope`` claim."""
        now = int(time.time())
        body = {
            "iss": "https://issuer.test",
            "sub": "muongen-test",
            "iat": now,
            "exp": now + int(exp_in_s),
            "scope": scopes,
            "wlcg.ver": "1.0",
            **claims,
        }
        return jwt.encode(body, TOKEN_SECRET, algorithm="HS256")

    # ---- faults ------------------------------------------------------------------------
    def inject(
        self,
        kind: str,
        *,
        site: str = "origin",
        method: str | None = None,
        path: str | None = None,
        times: int = 1,
        status: int = 503,
        delay_s: float = 2.0,
    ) -> Fault:
        """Make the next ``times`` matching requests fail in the given way.

        kind: ``status`` (answer ``status``, default 503), ``drop`` (close the connection
        without an answer), ``truncate`` (announce the full length, send half, close),
        ``slow`` (wait ``delay_s`` before answering normally).
        """
        if kind not in ("status", "drop", "truncate", "slow"):
            raise ValueError(f"unknown fault kind {kind!r}")
        fault = Fault(kind, site, method, path, times, status, delay_s)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self.faults.clear()

    def requests(self, site: str | None = None, method: str | None = None) -> list[Logged]:
        """The logged requests, optionally of one site and/or method."""
        with self._lock:
            return [
                r
                for r in self.log
                if (site is None or r.site == site) and (method is None or r.method == method)
            ]

    def _take_fault(self, site: str, request: web.Request) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.times <= 0 or f.site != site:
                    continue
                if f.method and f.method != request.method:
                    continue
                if f.path and f.path not in unquote(request.path):
                    continue
                f.times -= 1
                return f
        return None

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> Federation:
        ready = threading.Event()
        errors: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._start_sites())
            except BaseException as exc:  # surfaced to the caller below
                errors.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._stop_sites())
            loop.close()

        self._thread = threading.Thread(target=serve, name="pelican-federation", daemon=True)
        self._thread.start()
        ready.wait(30)
        if errors:
            raise errors[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> Federation:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _start_sites(self) -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ca.issue_cert(HOST, "localhost").configure_cert(ctx)
        for name in ("director", "origin"):
            app = web.Application(middlewares=[self._middleware(name)], client_max_size=2**31)
            handler = self._director if name == "director" else self._origin
            app.router.add_route("*", "/{path:.*}", handler)
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, HOST, 0, ssl_context=ctx)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            setattr(self, f"{name}_port", port)
            self._runners.append(runner)

    async def _stop_sites(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    # ---- shared request handling ---------------------------------------------------------
    def _middleware(self, site: str):
        @web.middleware
        async def middleware(request: web.Request, handler):
            with self._lock:
                self.log.append(
                    Logged(
                        site,
                        request.method,
                        unquote(request.path),
                        "Authorization" in request.headers,
                        request.headers.get("Range"),
                    )
                )
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            fault = self._take_fault(site, request)
            if fault is not None:
                if fault.kind == "status":
                    return web.Response(status=fault.status, text=f"injected {fault.status}\n")
                if fault.kind == "drop":
                    request.transport.abort()  # type: ignore[union-attr]
                    raise asyncio.CancelledError
                if fault.kind == "slow":
                    await asyncio.sleep(fault.delay_s)
                if fault.kind == "truncate":
                    self._truncate.add(id(request))
            try:
                return await handler(request)
            finally:
                self._truncate.discard(id(request))

        return middleware

    def _namespace(self, path: str) -> Namespace | None:
        best = None
        for ns in self.namespaces:
            inside = path == ns.prefix or path.startswith(ns.prefix.rstrip("/") + "/")
            if inside and (best is None or len(ns.prefix) > len(best.prefix)):
                best = ns
        return best

    # ---- discovery + director ----------------------------------------------------------
    async def _director(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["path"]
        if path == "/.well-known/pelican-configuration":
            return web.json_response(
                {
                    "director_endpoint": f"https://{self.host}",
                    "namespace_registration_endpoint": f"https://{self.host}",
                    "jwks_uri": f"https://{self.host}/.well-known/issuer.jwks",
                }
            )
        for_put = path.startswith("/api/v1.0/director/origin/")
        if for_put:
            path = path[len("/api/v1.0/director/origin") :]
        ns = self._namespace(path)
        if ns is None:
            return web.Response(status=404, text=f"no namespace serves {path}\n")
        target = self.origin + quote(path)
        headers = {
            "Location": target,
            "Link": f'<{target}>; rel="duplicate"; pri=1; depth=1',
            "X-Pelican-Namespace": (
                f"namespace={ns.prefix}, require-token={str(ns.require_token).lower()}, "
                f"collections-url={self.origin}"
            ),
        }
        return web.Response(status=307, headers=headers)

    # ---- origin ------------------------------------------------------------------------
    def _authorized(self, request: web.Request, path: str, perms: tuple[str, ...]) -> bool:
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer "):
            return False
        try:
            claims = jwt.decode(header[7:], options={"verify_signature": False})
        except jwt.PyJWTError:
            return False
        if claims.get("exp", 0) <= time.time():
            return False
        for scope in str(claims.get("scope", "")).split():
            perm, _, resource = scope.partition(":")
            resource = resource or "/"
            under = path == resource or path.startswith(resource.rstrip("/") + "/")
            if perm in perms and under:
                return True
        return False

    async def _origin(self, request: web.Request) -> web.StreamResponse:
        raw = unquote(request.path)
        path = raw.rstrip("/") or "/"
        ns = self._namespace(path)
        if ns is None:
            return web.Response(status=404, text="not served by this origin\n")
        local = self.local(path)
        if request.method == "PUT":
            perms = ("storage.modify",) if local.exists() else ("storage.create", "storage.modify")
            if not self._authorized(request, path, perms):
                return web.Response(status=403, text=f"token lacks {'/'.join(perms)}:{path}\n")
            return await self._put(request, local)
        if ns.require_token and not self._authorized(request, path, ("storage.read",)):
            return web.Response(status=403, text=f"token lacks storage.read:{path}\n")
        if request.method == "PROPFIND":
            return self._propfind(request, raw, path, local)
        if request.method in ("GET", "HEAD"):
            if local.is_dir():
                # Origins answer a collection's GET/HEAD (pelicanfs's find asks for its info)
                return web.Response(status=200, body=b"", content_type="text/html")
            if not local.is_file():
                return web.Response(status=404, text=f"{path} not found\n")
            return await self._get(request, local)
        return web.Response(status=405)

    async def _get(self, request: web.Request, local: Path) -> web.StreamResponse:
        size = local.stat().st_size
        start, end, status = 0, size - 1, 200
        rng = request.headers.get("Range", "")
        if rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            start = int(first) if first else max(size - int(last), 0)
            end = min(int(last), size - 1) if (last and first) else size - 1
            if start >= size:
                return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
            status = 206
        length = end - start + 1
        headers = {
            "Content-Length": str(length),
            "Content-Type": "application/octet-stream",
            "Accept-Ranges": "bytes",
            "Last-Modified": formatdate(local.stat().st_mtime, usegmt=True),
        }
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        resp = web.StreamResponse(status=status, headers=headers)
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        with open(local, "rb") as f:
            f.seek(start)
            body = f.read(length)
        if id(request) in self._truncate:
            await resp.write(body[: length // 2])
            await asyncio.sleep(0.05)  # let the half body leave before the connection dies
            request.transport.abort()  # type: ignore[union-attr]
            raise asyncio.CancelledError
        await resp.write(body)
        await resp.write_eof()
        return resp

    async def _put(self, request: web.Request, local: Path) -> web.StreamResponse:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.upload-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as f:
                async for chunk in request.content.iter_chunked(1 << 16):
                    f.write(chunk)
            os.replace(tmp, local)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return web.Response(status=201)

    def _propfind(self, request: web.Request, raw: str, path: str, local: Path) -> web.Response:
        if not local.exists():
            return web.Response(status=404, text=f"{path} not found\n")
        if local.is_file() and raw.endswith("/"):
            # Origins reject an object's slash form with a 500; pelicanfs keys on this to
            # tell objects from collections.
            return web.Response(status=500, text="not a collection\n")
        entries = [(path, local)]
        if local.is_dir() and request.headers.get("Depth", "1") != "0":
            for child in sorted(local.iterdir()):
                if child.name.startswith("."):
                    continue  # uploads in progress
                entries.append((path.rstrip("/") + "/" + child.name, child))
        body = ['<?xml version="1.0" encoding="utf-8"?>', '<D:multistatus xmlns:D="DAV:">']
        for name, p in entries:
            st = p.stat()
            isdir = p.is_dir()
            href = quote(name + ("/" if isdir and not name.endswith("/") else ""))
            body.append(
                f"<D:response><D:href>{href}</D:href><D:propstat><D:prop>"
                f"<D:displayname>{p.name}</D:displayname>"
                f"<D:resourcetype>{'<D:collection/>' if isdir else ''}</D:resourcetype>"
                f"<D:getcontentlength>{0 if isdir else st.st_size}</D:getcontentlength>"
                f"<D:getlastmodified>{formatdate(st.st_mtime, usegmt=True)}</D:getlastmodified>"
                "</D:prop><D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>"
            )
        body.append("</D:multistatus>")
        return web.Response(
            status=207, text="\n".join(body), content_type="application/xml", charset="utf-8"
        )


def sample_bytes(path: str, size: int = 3000) -> bytes:
    """Deterministic bytes for a path, so a read can be checked without keeping a copy."""
    seed = path.encode()
    out = bytearray()
    while len(out) < size:
        out += seed + len(out).to_bytes(4, "little")
    return bytes(out[:size])


# ---- pytest fixtures (import them into a conftest.py to use them elsewhere) -----------------
# In tests/<area>/conftest.py:
#     sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers
#     from pelican_federation import isolated_tokens, pelican_federation


@pytest.fixture
def isolated_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Token discovery reads the environment and well-known files: keep a developer's own
    BEARER_TOKEN, /tmp/bt_u<uid> or saved tokens out of tests (and off the test servers)."""
    from muongen.storage import files

    for var in ("BEARER_TOKEN", "BEARER_TOKEN_FILE", "_CONDOR_CREDS", "TOKEN"):
        monkeypatch.delenv(var, raising=False)
    runtime = tmp_path / "xdg-runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    files.clear_caches()
    yield
    files.clear_caches()


@pytest.fixture
def pelican_federation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_tokens):
    """A fresh local federation per test (files, faults and the request log never leak
    between tests), trusted through SSL_CERT_FILE, with muongen's retries made fast
    (10-50 ms back-off, 5 s timeouts) so fault tests take milliseconds, not minutes."""
    from muongen.storage import files

    fed = Federation(tmp_path / "federation").start()
    monkeypatch.setenv("SSL_CERT_FILE", fed.ca_file)
    before = files.configure(retries=4, retry_wait_s=0.01, retry_max_wait_s=0.05, timeout_s=5.0)
    files.clear_caches()
    try:
        yield fed
    finally:
        files.clear_caches()
        files.configure(before)
        fed.stop()
