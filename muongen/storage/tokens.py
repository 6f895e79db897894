"""Bearer tokens for pelican:// and osdf:// URLs: discovery, scope checks, safe handling.

Discovery order (the first token whose scopes cover the need wins):

1. an explicit token file (``storage.token_file``): used alone;
2. ``BEARER_TOKEN`` (the token itself), then ``BEARER_TOKEN_FILE`` (a path);
3. the WLCG default file ``$XDG_RUNTIME_DIR/bt_u<uid>`` (or ``/tmp/bt_u<uid>``);
4. HTCondor credentials ``$_CONDOR_CREDS/*.use`` (``<token_name>.use`` when a name is given,
   else ``scitokens.use`` first, then the others in name order);
5. tokens muongen saved from an earlier device flow (``~/.cache/muongen/tokens``);
6. interactively only: a device flow through the ``pelican`` command, when installed.

The scope path of a URL is its path cut at the first component holding a wildcard or
a ``NNNNNNN-NNNNNNN`` range folder, so one token serves all 100 ranges of a data set.
Reads need ``storage.read:<path>``; publishing needs ``storage.create:`` or
``storage.modify:``. Claims are read with pyjwt without checking the signature (the
origin checks it); an opaque (non-JWT) token is passed on unchecked.

A token's value never appears in a repr, a log line, a message or a file muongen writes,
except a token file written on purpose (:func:`write_token_file`, mode 0600).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jwt

from muongen.errors import TokenError

log = logging.getLogger("muongen.storage")

#: operation -> scope permissions that allow it
NEEDS: dict[str, tuple[str, ...]] = {
    "read": ("storage.read",),
    "write": ("storage.create", "storage.modify"),
}
RANGE_FOLDER = re.compile(r"^\d{7}-\d{7}$")
WILDCARDS = "*?["
EXPIRY_WARNING_S = 900.0  # warn when a token has less than 15 min left
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


@dataclass(frozen=True, eq=False)
class Token:
    """A bearer token and where it came from. Its repr and str never show the value."""

    _value: str = field(repr=False)
    source: str
    """Where it was found, e.g. ``BEARER_TOKEN_FILE=/path`` or ``_CONDOR_CREDS/x.use``."""
    path: str | None = None
    """The file it was read from (None for BEARER_TOKEN or a device flow not saved)."""
    claims: dict[str, Any] | None = None
    """Its JWT claims (unverified), None for an opaque token."""

    @classmethod
    def from_value(cls, value: str, source: str, path: str | None = None) -> Token:
        value = value.strip()
        if not value:
            raise TokenError(f"the token from {source} is empty")
        try:
            claims = jwt.decode(value, options={"verify_signature": False})
        except jwt.PyJWTError:
            claims = None
        return cls(value, source, path, claims)

    @property
    def value(self) -> str:
        """The secret itself: only for an Authorization header."""
        return self._value

    def header(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._value}"}

    @property
    def fingerprint(self) -> str:
        """A short hash that identifies the token without revealing it."""
        return hashlib.sha256(self._value.encode()).hexdigest()[:12]

    @property
    def scopes(self) -> list[str]:
        if not self.claims:
            return []
        scope = self.claims.get("scope", "")
        return scope.split() if isinstance(scope, str) else [str(s) for s in scope]

    @property
    def expires(self) -> datetime | None:
        exp = (self.claims or {}).get("exp")
        return datetime.fromtimestamp(float(exp), tz=timezone.utc) if exp is not None else None

    def expires_in_s(self) -> float | None:
        exp = (self.claims or {}).get("exp")
        return float(exp) - time.time() if exp is not None else None

    def covers(self, path: str, need: str) -> bool:
        """Whether the scopes allow ``need`` ("read"/"write") on namespace ``path``.

        True for an opaque token (nothing to check; the origin will decide).
        """
        if self.claims is None:
            return True
        for scope in self.scopes:
            perm, _, resource = scope.partition(":")
            if perm in NEEDS[need] and _under(path, resource or "/"):
                return True
        return False

    def describe(self) -> dict[str, Any]:
        """What ``muongen doctor`` shows: source, scopes, expiry (never the value)."""
        left = self.expires_in_s()
        return {
            "source": self.source,
            "jwt": self.claims is not None,
            "issuer": (self.claims or {}).get("iss"),
            "subject": (self.claims or {}).get("sub"),
            "scopes": self.scopes,
            "expires": self.expires.isoformat() if self.expires else None,
            "expires_in_s": round(left) if left is not None else None,
            "fingerprint": self.fingerprint,
        }

    def __repr__(self) -> str:
        exp = self.expires.isoformat(timespec="seconds") if self.expires else "unknown"
        return f"Token(source={self.source!r}, scopes={self.scopes!r}, expires={exp})"

    __str__ = __repr__


def _under(path: str, resource: str) -> bool:
    resource = "/" + resource.strip("/")
    path = "/" + path.strip("/")
    return resource == "/" or path == resource or path.startswith(resource + "/")


def namespace_path(url: str) -> str:
    """The path part of a pelican://host/..., osdf:///... URL (or a local path)."""
    if "://" not in url:
        return url
    parsed = urlparse(url.replace("?", "%3F"))  # a "?" is a wildcard, never a query
    path = parsed.path.replace("%3F", "?")
    if parsed.scheme == "osdf" and parsed.netloc:  # osdf://ns/path written with two slashes
        path = "/" + parsed.netloc + path
    return path or "/"


def scope_path(url: str) -> str:
    """The path a token must cover: cut at the first wildcard or range-folder component.

    ``pelican://fed/icecube/sim/0001000-0001999/*.parquet`` -> ``/icecube/sim``.
    """
    kept = []
    for part in namespace_path(url).split("/"):
        if any(c in part for c in WILDCARDS) or RANGE_FOLDER.match(part):
            break
        kept.append(part)
    return "/".join(kept).rstrip("/") or "/"


# ---- reading and writing token files --------------------------------------------------
def read_token_file(path: str | os.PathLike[str], source: str | None = None) -> Token:
    """A token from a file holding the token itself or JSON with ``access_token``."""
    path = os.fspath(path)
    try:
        text = Path(path).read_text().strip()
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise TokenError(f"cannot read token file {path}: {exc.strerror}") from None
    if text.startswith("{"):
        with contextlib.suppress(json.JSONDecodeError):
            text = str(json.loads(text).get("access_token", "")).strip()
    if mode & 0o077:
        log.warning(
            "token file %s is readable by others (mode %o); chmod 600 it", path, mode & 0o777
        )
    return Token.from_value(text, source or f"file {path}", path)


def write_token_file(path: str | os.PathLike[str], token: Token | str) -> str:
    """Write a token to ``path`` with mode 0600 (temp file + rename: never a wider mode)."""
    path = os.fspath(path)
    value = token.value if isinstance(token, Token) else token.strip()
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".token-", dir=folder)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def default_bearer_token_file() -> str:
    """The WLCG bearer-token discovery default file."""
    folder = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return os.path.join(folder, f"bt_u{os.getuid()}")


def saved_tokens_dir() -> Path:
    """Where tokens from a device flow are kept (mode 0700 folder, 0600 files)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "muongen" / "tokens"


# ---- discovery -----------------------------------------------------------------------
def candidates(token_file: str = "", token_name: str = "") -> list[Token]:
    """Every token that discovery can see, in the order they are preferred."""
    if token_file:
        return [read_token_file(os.path.expanduser(token_file), f"token file {token_file}")]
    found: list[Token] = []

    def add_file(path: str, source: str) -> None:
        try:
            found.append(read_token_file(path, source))
        except TokenError as exc:
            log.warning("ignoring %s: %s", source, exc)

    if os.environ.get("BEARER_TOKEN", "").strip():
        found.append(Token.from_value(os.environ["BEARER_TOKEN"], "BEARER_TOKEN"))
    if os.environ.get("BEARER_TOKEN_FILE"):
        add_file(
            os.environ["BEARER_TOKEN_FILE"], f"BEARER_TOKEN_FILE={os.environ['BEARER_TOKEN_FILE']}"
        )
    default = default_bearer_token_file()
    if os.path.isfile(default):
        add_file(default, f"WLCG default file {default}")
    creds = os.environ.get("_CONDOR_CREDS")
    if creds and os.path.isdir(creds):
        for path in _condor_files(creds, token_name):
            add_file(str(path), f"_CONDOR_CREDS/{path.name}")
    saved = saved_tokens_dir()
    if saved.is_dir():
        for path in sorted(saved.glob("*.jwt")):
            add_file(str(path), f"saved device-flow token {path}")
    return found


def _condor_files(creds: str, token_name: str) -> list[Path]:
    folder = Path(creds)
    if token_name:
        # HTCondor may write dots in a service name as underscores
        names = [f"{token_name}.use", f"{token_name.replace('.', '_')}.use"]
        return [folder / n for n in dict.fromkeys(names) if (folder / n).is_file()]
    files = sorted(p for p in folder.glob("*.use") if p.is_file())
    return sorted(files, key=lambda p: p.name != "scitokens.use")


def find_token(
    url: str, need: str = "read", *, token_file: str = "", token_name: str = ""
) -> Token | None:
    """The first discovered, unexpired token that covers ``need`` on ``url``'s scope path.

    None when there is none (a public namespace needs none). An explicit ``token_file``
    is the only candidate: it raises TokenError when it cannot be read.
    """
    path = scope_path(url)
    for token in candidates(token_file, token_name):
        left = token.expires_in_s()
        if left is not None and left <= 0:
            continue
        if token.covers(path, need):
            return token
    return None


def check_token(token: Token, url: str, need: str, *, warn_s: float = EXPIRY_WARNING_S) -> None:
    """Raise TokenError unless ``token`` allows ``need`` on ``url``; warn near expiry."""
    path = scope_path(url)
    left = token.expires_in_s()
    if left is not None and left <= 0:
        raise TokenError(
            f"the token from {token.source} expired at {token.expires:%Y-%m-%d %H:%M:%S} UTC; "
            f"get a new one ({_how_to_get(url, need)})"
        )
    if not token.covers(path, need):
        want = " or ".join(f"{p}:{path}" for p in NEEDS[need])
        raise TokenError(
            f"the token from {token.source} cannot {need} {url}: it needs {want} "
            f"(a scope on a parent path also works) but holds {token.scopes or 'no scopes'}; "
            f"get one with that scope ({_how_to_get(url, need)})"
        )
    if left is not None and left < warn_s:
        log.warning(
            "the token from %s expires in %d min (%s UTC); renew it before the run needs it "
            "(HTCondor refreshes _CONDOR_CREDS tokens itself)",
            token.source,
            left // 60,
            token.expires.isoformat(timespec="seconds") if token.expires else "?",
        )


def require_token(
    url: str,
    need: str = "read",
    *,
    token_file: str = "",
    token_name: str = "",
    interactive: bool = False,
) -> Token:
    """A token that allows ``need`` on ``url``, checked; else a TokenError saying what to do.

    With ``interactive`` and the ``pelican`` command installed, a missing token is fetched
    through its device flow (the user confirms in a browser) and saved 0600.
    """
    if token_file:
        token = candidates(token_file)[0]
        check_token(token, url, need)
        return token
    token = find_token(url, need, token_name=token_name)
    if token is None and interactive and shutil.which("pelican"):
        token = device_flow(url, need)
    if token is None:
        seen = candidates(token_name=token_name)
        found = "; ".join(repr(t) for t in seen) if seen else "none"
        raise TokenError(
            f"no token allows {need} on {url} (scope path {scope_path(url)}); tokens found: "
            f"{found}. {_how_to_get(url, need)}"
        )
    check_token(token, url, need)
    return token


def _how_to_get(url: str, need: str) -> str:
    flag = "-r" if need == "read" else "-w"
    target = url if url.startswith(("pelican://", "osdf://")) else f"pelican://<federation>{url}"
    how = (
        f"run `pelican token fetch {_scope_url(target)} {flag}` and pass the file with "
        "--set storage.token_file=PATH (or BEARER_TOKEN_FILE=PATH)"
    )
    if not shutil.which("pelican"):
        how += (
            "; the pelican command is not installed: see https://docs.pelicanplatform.org/install"
        )
    return how + "; on the OSPool add the token to the job with `use_oauth_services`"


def _scope_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme in ("pelican", "osdf"):
        return f"{parsed.scheme}://{parsed.netloc}{scope_path(url)}"
    return url


def device_flow(url: str, need: str = "read", *, timeout_s: float = 600.0) -> Token:
    """Fetch a token with ``pelican token fetch`` (an OIDC device flow) and save it 0600.

    The command talks to the user on the terminal; the token is taken from its output and
    never echoed.
    """
    exe = shutil.which("pelican")
    if not exe:
        raise TokenError(f"no token for {url} and no pelican command: {_how_to_get(url, need)}")
    target = _scope_url(url)
    cmd = [exe, "token", "fetch", target, "-r" if need == "read" else "-w"]
    print(
        f"muongen: fetching a {need} token for {target} (follow the instructions)", file=sys.stderr
    )
    try:
        done = subprocess.run(cmd, stdout=subprocess.PIPE, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise TokenError(
            f"`pelican token fetch {target}` did not finish within {timeout_s:.0f} s"
        ) from None
    found = _JWT.findall(done.stdout.decode(errors="replace"))
    if done.returncode != 0 or not found:
        raise TokenError(
            f"`pelican token fetch {target}` failed (exit {done.returncode}); "
            f"{_how_to_get(url, need)}"
        )
    name = hashlib.sha256(f"{target} {need}".encode()).hexdigest()[:16] + ".jwt"
    path = write_token_file(saved_tokens_dir() / name, found[-1])
    return Token.from_value(found[-1], f"device flow (saved to {path})", path)


# ---- a short-lived cache for the file layer -----------------------------------------------
class TokenCache:
    """Discovery results for (scope path, need), refreshed every ``ttl_s`` seconds.

    Re-reading lets a long job pick up tokens that HTCondor refreshes in _CONDOR_CREDS.
    """

    def __init__(self, ttl_s: float = 60.0) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str, str], tuple[float, Token | None]] = {}

    def get(self, url: str, need: str, token_file: str = "", token_name: str = "") -> Token | None:
        key = (scope_path(url), need, token_file, token_name)
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(key)
            if hit and now - hit[0] < self.ttl_s:
                left = hit[1].expires_in_s() if hit[1] else None
                if left is None or left > 60:
                    return hit[1]
        token = find_token(url, need, token_file=token_file, token_name=token_name)
        if token_file and token is None:
            # An explicit file that does not cover the path is still what the user asked for
            token = candidates(token_file)[0]
        with self._lock:
            self._entries[key] = (now, token)
        return token

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
