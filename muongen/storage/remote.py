"""pelicanfs filesystems for pelican:// and osdf:// URLs, built once per federation + token.

What pelicanfs 1.5 needs from us, and why it is done here:

- TLS: aiohttp builds its default SSL context when it is imported, so a later
  ``SSL_CERT_FILE`` would be ignored. We build the context ourselves from the system store
  plus ``SSL_CERT_FILE`` and ``X509_CERT_DIR`` (grid CAs) and hand it to both clients
  pelicanfs uses: the HTTP session (``get_client``) and the WebDAV client for listings
  (``get_webdav_client``, a constructor argument).
- Tokens: sent as ``headers={"Authorization": "Bearer ..."}``; pelicanfs then uses that
  header for HTTP and WebDAV. Without one, pelicanfs would run its own discovery and,
  with the ``pelican`` command installed, an interactive device flow (up to 5 minutes,
  even in a batch job); :class:`_PelicanFS` turns that off: muongen finds tokens itself
  (:mod:`muongen.storage.tokens`) and starts a device flow only when asked to.
- Timeouts: a socket-read timeout on the HTTP session, so a stalled transfer fails (and
  is retried by muongen) instead of hanging.
- Caching: fsspec would key its instance cache on the SSL context object (a new key each
  time); we keep our own, keyed by federation, token fingerprint and CA settings.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import threading
from collections.abc import Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlparse

import aiohttp
import pelicanfs.core as pelican_core
from fsspec.asyn import sync
from pelicanfs.core import PelicanFileSystem
from pelicanfs.dir_header_parser import parse_director_response

from muongen.storage.tokens import Token

OSDF_DISCOVERY = "pelican://osg-htc.org/"


@dataclass(frozen=True)
class Location:
    """A remote URL split into the filesystem that serves it and the namespace path."""

    scheme: str  # "pelican" | "osdf"
    discovery: str  # "pelican://host[:port]/"
    path: str  # "/namespace/path"

    def render(self, path: str) -> str:
        """The URL of another namespace path on the same federation, in the same scheme."""
        if self.scheme == "osdf":
            return "osdf://" + path
        return self.discovery.rstrip("/") + path


def is_pelican(url: str) -> bool:
    return url.startswith(("pelican://", "osdf://"))


def locate(url: str) -> Location:
    # muongen never puts a query in a URL (tokens go in headers): a "?" is a wildcard
    parsed = urlparse(url.replace("?", "%3F"))
    if parsed.scheme == "osdf":
        path = parsed.path if not parsed.netloc else "/" + parsed.netloc + parsed.path
        return Location("osdf", OSDF_DISCOVERY, path.replace("%3F", "?") or "/")
    if parsed.scheme == "pelican":
        if not parsed.netloc:
            raise ValueError(f"{url}: a pelican:// URL names its federation: pelican://<host>/path")
        path = parsed.path.replace("%3F", "?")
        return Location("pelican", f"pelican://{parsed.netloc}/", path or "/")
    raise ValueError(f"{url} is not a pelican:// or osdf:// URL")


def _ca_settings() -> tuple[str, str]:
    cafile = os.environ.get("SSL_CERT_FILE", "")
    capath = os.environ.get("X509_CERT_DIR", "") or os.environ.get("SSL_CERT_DIR", "")
    return cafile, capath


_ssl_cache: dict[tuple[str, str], ssl.SSLContext] = {}


def ssl_context() -> ssl.SSLContext:
    """System CAs plus SSL_CERT_FILE and X509_CERT_DIR; verification always on."""
    key = _ca_settings()
    ctx = _ssl_cache.get(key)
    if ctx is None:
        cafile, capath = key
        ctx = ssl.create_default_context()
        if cafile and os.path.isfile(cafile):
            ctx.load_verify_locations(cafile=cafile)
        if capath and os.path.isdir(capath):
            ctx.load_verify_locations(capath=capath)
        _ssl_cache[key] = ctx
    return ctx


def _http_client_factory(ctx: ssl.SSLContext, timeout_s: float):
    async def get_client(**kwargs: Any) -> aiohttp.ClientSession:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx), timeout=timeout, **kwargs
        )

    return get_client


def _webdav_client_factory(ctx: ssl.SSLContext):
    @asynccontextmanager
    async def get_webdav_client(options: dict[str, Any]) -> Iterator[Any]:
        async with pelican_core.get_webdav_client(dict(options, verify_ssl=ctx)) as client:
            yield client

    return get_webdav_client


class _PelicanFS(PelicanFileSystem):
    """pelicanfs without its own token discovery (see the module docstring)."""

    async def _handle_token_generation(self, url, director_response, operation):
        token = self._get_token()
        if token:
            self._set_http_filesystem_token(token)
        return token


_lock = threading.Lock()
_filesystems: dict[tuple[Any, ...], PelicanFileSystem] = {}


def filesystem(loc: Location, token: Token | None, timeout_s: float) -> PelicanFileSystem:
    """The (cached) pelicanfs filesystem for a federation, carrying ``token`` if given."""
    key = (loc.discovery, token.fingerprint if token else None, _ca_settings(), timeout_s)
    with _lock:
        fs = _filesystems.get(key)
        if fs is None:
            ctx = ssl_context()
            kwargs: dict[str, Any] = {}
            if token is not None:
                kwargs["headers"] = token.header()
            fs = _PelicanFS(
                loc.discovery,
                get_client=_http_client_factory(ctx, timeout_s),
                get_webdav_client=_webdav_client_factory(ctx),
                skip_instance_cache=True,
                **kwargs,
            )
            _filesystems[key] = fs
        return fs


def clear() -> None:
    """Forget every filesystem (tests, or after changing CA settings)."""
    with _lock:
        old = list(_filesystems.values())
        _filesystems.clear()
    _ssl_cache.clear()
    for fs in old:
        session = getattr(fs.http_file_system, "_session", None)
        if session is not None and not session.closed:
            # best effort: a closed loop or a session in use elsewhere
            with contextlib.suppress(Exception):
                sync(fs.loop, session.close, timeout=5)


@dataclass(frozen=True)
class NamespaceInfo:
    """What the director says about a path."""

    namespace: str
    require_token: bool
    collections_url: str | None
    servers: tuple[str, ...]


def namespace_info(fs: PelicanFileSystem, path: str) -> NamespaceInfo:
    """Ask the director about ``path`` (one GET, redirect not followed)."""
    headers = sync(fs.loop, fs.get_director_headers, path)
    resp = parse_director_response(headers)
    if resp.x_pel_ns_hdr is None:
        raise pelican_core.BadDirectorResponse(
            f"the director answered {path} without an X-Pelican-Namespace header "
            "(is the path under a registered namespace?)"
        )
    ns = resp.x_pel_ns_hdr
    return NamespaceInfo(
        ns.namespace, ns.require_token, ns.collections_url, tuple(resp.object_servers)
    )


def probe(fs: PelicanFileSystem, path: str, *, for_write: bool = False) -> tuple[str, int | None]:
    """Ask the director and then the first server about ``path``, by hand.

    Used after a failure, to say what the federation answered where pelicanfs only says
    "NoAvailableSource". Returns (one line, the last HTTP status seen or None).
    """

    async def run() -> tuple[str, int | None]:
        await fs._set_director_url()
        session = await fs.http_file_system.set_session()
        if for_write:
            url = urljoin(fs.director_url, "/api/v1.0/director/origin/") + path.lstrip("/")
        else:
            url = urljoin(fs.director_url, path.lstrip("/"))
        async with session.get(url, allow_redirects=False) as resp:
            status = resp.status
            where = resp.headers.get("Location")
        if status not in (301, 302, 307, 308) or not where:
            return f"the director answered {status} for {path} at {url}", status
        headers = dict(fs.http_file_system.kwargs.get("headers", {}))
        async with session.head(where, headers=headers, allow_redirects=False) as resp:
            return f"the server {where} answered {resp.status} {resp.reason}", resp.status

    try:
        return sync(fs.loop, run, timeout=60)
    except Exception as exc:
        return f"probing the director failed too ({type(exc).__name__}: {exc})", None
