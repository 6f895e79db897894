"""Opening, listing, fetching and uploading files: local paths, file://, pelican://, osdf://.

Everything else in muongen calls these functions and never looks at a URL scheme or a
token. Remote URLs go through pelicanfs (see :mod:`muongen.storage.remote`); every remote
operation is retried on transient failures with exponential back-off and jitter
(:mod:`muongen.storage.retry`), and a token is found for it automatically
(:mod:`muongen.storage.tokens`) unless one is passed.

Wildcards: ``*``, ``?`` and ``[...]`` expand through fsspec's ``glob``, files only, sorted.
On the federation a listing is one WebDAV request per folder, so ``**`` (a listing of
every folder below, ~2M files for the full data set) is refused unless ``maxdepth``
bounds it; write the levels out instead, e.g. ``.../00*-*/*.parquet``.
"""

from __future__ import annotations

import contextlib
import glob as _glob
import io
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import fsspec
from fsspec.utils import glob_translate

from muongen.errors import ConfigError, StorageError
from muongen.storage import retry, tokens
from muongen.storage.retry import RetryPolicy, TruncatedRead
from muongen.storage.tokens import Token

if TYPE_CHECKING:
    from muongen.storage.remote import Location

INPUT_SUFFIXES = (".parquet", ".h5", ".hdf5", ".hdf")


@dataclass(frozen=True)
class Settings:
    """Process-wide storage settings; :func:`configure` sets them from StorageConfig."""

    token_file: str = ""
    token_name: str = ""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_s: float = 60.0


_settings = Settings()
_tokens = tokens.TokenCache()


def configure(cfg: Any = None, **overrides: Any) -> Settings:
    """Set the storage defaults from a StorageConfig (and/or keyword overrides).

    Keywords: token_file, token_name, retries, retry_wait_s, retry_max_wait_s, timeout_s.
    A :class:`Settings` (as returned by an earlier call) restores those settings.
    Returns the settings in force before the call.
    """
    global _settings
    before = _settings
    _tokens.clear()
    if isinstance(cfg, Settings):
        _settings = cfg
        return before
    values: dict[str, Any] = {}
    for name in (
        "token_file",
        "token_name",
        "retries",
        "retry_wait_s",
        "retry_max_wait_s",
        "timeout_s",
    ):
        if cfg is not None and hasattr(cfg, name):
            values[name] = getattr(cfg, name)
    values.update(overrides)
    policy = _settings.retry
    policy = RetryPolicy(
        attempts=int(values.pop("retries", policy.attempts)),
        wait_s=float(values.pop("retry_wait_s", policy.wait_s)),
        max_wait_s=float(values.pop("retry_max_wait_s", policy.max_wait_s)),
    )
    if policy.attempts < 1 or policy.wait_s < 0 or policy.max_wait_s < 0:
        raise ConfigError("storage.retries must be >= 1 and the retry waits >= 0")
    if float(values.get("timeout_s", _settings.timeout_s)) <= 0:
        raise ConfigError("storage.timeout_s must be > 0")
    _settings = replace(_settings, retry=policy, **values)
    return before


def settings() -> Settings:
    return _settings


def is_pelican(url: str) -> bool:
    """True for pelican:// and osdf:// URLs (served through pelicanfs)."""
    return url.startswith(("pelican://", "osdf://"))


def _remote():
    # imported when first needed: pelicanfs and aiohttp take ~0.2 s to import
    from muongen.storage import remote

    return remote


def is_remote(url: str) -> bool:
    """True for URLs that need the network (pelican://, osdf://, http(s)://)."""
    return "://" in url and not url.startswith("file://")


def local_path(url: str) -> str:
    """The local path of a path or file:// URL."""
    return url[len("file://") :] if url.startswith("file://") else url


_strip_file = local_path


def join(folder: str, name: str) -> str:
    """``folder/name`` for a local path or a URL."""
    return folder.rstrip("/") + "/" + name.lstrip("/")


def parent(url: str) -> str:
    """The folder holding ``url`` (a local path or a URL)."""
    head, _, _ = url.rstrip("/").rpartition("/")
    return head if not head.endswith(":/") else head + "/"


# ---- remote plumbing -------------------------------------------------------------------
def _token(url: str, need: str, token: Token | None) -> Token | None:
    if token is not None:
        return token
    s = _settings
    return _tokens.get(url, need, s.token_file, s.token_name)


def _hint(url: str, need: str, token: Token | None) -> Callable[[], str]:
    def hint() -> str:
        want = " or ".join(f"{p}:{tokens.scope_path(url)}" for p in tokens.NEEDS[need])
        if token is None:
            return (
                f"No token was sent; this needs one with {want}. Give it with "
                "--set storage.token_file=PATH, BEARER_TOKEN_FILE or _CONDOR_CREDS "
                "(`pelican token fetch` makes one)."
            )
        left = token.expires_in_s()
        if left is not None and left <= 0:
            return f"The token from {token.source} has expired ({token!r}); get a new one."
        return f"The token from {token.source} holds {token.scopes}; this needs {want}."

    return hint


def _remote_call(
    url: str,
    need: str,
    what: str,
    token: Token | None,
    op: Callable[[Any, Location], Any],
    policy: RetryPolicy | None = None,
    shown: str | None = None,
) -> Any:
    """Run ``op(fs, location)`` for a pelican/osdf URL with retries and clear errors
    (which name ``shown``, default the URL: e.g. the pattern a listing is for)."""
    loc = _remote().locate(url)
    tok = _token(url, need, token)
    fs = _remote().filesystem(loc, tok, _settings.timeout_s)

    def diagnose(exc: BaseException) -> tuple[str, int | None]:
        return _remote().probe(fs, loc.path, for_write=need == "write")

    return retry.call(
        lambda: op(fs, loc),
        what=what,
        url=shown or url,
        policy=policy or _settings.retry,
        diagnose=diagnose,
        token_hint=_hint(url, need, tok),
    )


def _generic_fs(url: str) -> tuple[Any, str]:
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path


# ---- listing -----------------------------------------------------------------------------
def expand_inputs(
    patterns: list[str] | str, *, maxdepth: int | None = None, token: Token | None = None
) -> list[str]:
    """Files, folders and globs -> a sorted, de-duplicated list of files (paths or URLs).

    The same inputs are accepted everywhere (inspect, sample --primaries, evaluate --data,
    train): a file; a folder (searched recursively for input suffixes, locally and on the
    federation); a glob with ``*``, ``?`` or ``[...]`` in any path component, locally or in
    a pelican:// / osdf:// URL (``pelican://host/ns/*/file.*.parquet``). A remote URL
    without wildcards that ends in an input suffix is taken as one file without a request.
    Raises StorageError naming a pattern that matches nothing, a ``**`` on the federation
    without ``maxdepth``, or a listing that failed.
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    out: list[str] = []
    for pat in patterns:
        if is_pelican(pat):
            found = _expand_remote(pat, maxdepth, token)
        elif is_remote(pat):
            fs, path = _generic_fs(pat)
            proto = pat.split("://", 1)[0]
            found = (
                [p if "://" in p else f"{proto}://{p}" for p in fs.glob(path)]
                if _has_magic(path)
                else [pat]
            )
        else:
            found = _expand_local(pat)
        if not found:
            raise StorageError(
                f"input {pat} matches no files (looked for {', '.join(INPUT_SUFFIXES)})"
            )
        out.extend(found)
    return sorted(set(out))


def _has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")


def _expand_local(pat: str) -> list[str]:
    path = _strip_file(pat)
    if _has_magic(path):
        return sorted(p for p in _glob.glob(path, recursive=True) if os.path.isfile(p))
    if os.path.isdir(path):
        return sorted(
            str(p) for p in Path(path).rglob("*") if p.suffix in INPUT_SUFFIXES and p.is_file()
        )
    if os.path.isfile(path):
        return [path]
    raise StorageError(f"input {pat} does not exist")


def split_pattern(url: str) -> tuple[str, str]:
    """A pelican:// / osdf:// URL -> (base URL, namespace path); the base URL is the URL
    cut before the first component holding a wildcard (where the listing starts)."""
    loc = _remote().locate(url)
    path = loc.path
    kept = []
    for part in path.split("/"):
        if _has_magic(part):
            break
        kept.append(part)
    return loc.render("/".join(kept).rstrip("/") + "/"), path


def _expand_remote(pat: str, maxdepth: int | None, token: Token | None) -> list[str]:
    base, path = split_pattern(pat)
    loc = _remote().locate(base)
    if not _has_magic(path):
        if path.endswith(INPUT_SUFFIXES):
            return [pat]  # a file: no request (explicit file lists stay free)
        return _remote_folder(pat, token)
    if "**" in path and maxdepth is None:
        raise StorageError(
            f"input {pat}: '**' would list every folder below it on the federation, one "
            "request per folder (the full data set is ~2M files in 100 range folders), "
            "before training could start. Write the levels out instead, e.g. "
            f"{loc.render(path.split('**')[0])}00*-*/*.parquet, or bound the depth "
            "(expand_inputs(..., maxdepth=N))."
        )

    root = loc.path  # the namespace path before the first wildcard component, with "/"
    if root == "/":
        raise StorageError(
            f"input {pat}: a wildcard in the first path component; a federation is listed "
            "only inside a namespace, so write the namespace out, e.g. "
            f"{loc.render('/icecube/')}sim/*/*.parquet"
        )
    rest = path[len(root) :].split("/")  # the components to match below it
    # "**" stands for up to maxdepth levels
    depth = len(rest) - 1 + int(maxdepth or 1) if "**" in path else len(rest)
    pattern = re.compile(glob_translate(path))

    def op(fs: Any, loc: Location) -> list[str]:
        # One listing per folder below the root, to the pattern's depth, then a match of
        # the whole path (fsspec's glob rules: "*", "?", "[...]" stay inside a component).
        # Not pelicanfs's glob: it starts listing at the first "*" or "[" only, so a "?"
        # in a folder name above them became part of a literal path.
        # on_error="raise": fsspec's walk would otherwise skip a folder whose listing
        # failed, silently dropping a whole range of files.
        try:
            found = fs.find(root, maxdepth=depth, detail=True, on_error="raise")
        except FileNotFoundError:  # the folder before the first wildcard does not exist
            return []
        return sorted(
            loc.render(p.rstrip("/"))
            for p, info in found.items()
            if info.get("type") != "directory" and pattern.match(p.rstrip("/"))
        )

    return _remote_call(base, "read", "listing", token, op, shown=pat)


def _remote_folder(url: str, token: Token | None) -> list[str]:
    """A remote URL without wildcards: the input files below it if it is a folder (one
    listing per folder level), else the URL itself."""

    def op(fs: Any, loc: Location) -> list[str]:
        if not fs.isdir(loc.path):  # (pelicanfs's info() calls every path a file)
            return [url] if fs.exists(loc.path) else []
        found = fs.find(loc.path, detail=True, on_error="raise")
        return sorted(
            loc.render(p.rstrip("/"))
            for p, item in found.items()
            if item.get("type") != "directory" and p.endswith(INPUT_SUFFIXES)
        )

    return _remote_call(url, "read", "listing", token, op)


def list_sizes(url_dir: str, *, token: Token | None = None) -> dict[str, int]:
    """{relative path: size} of every file below a folder; {} when it does not exist."""
    if is_pelican(url_dir):

        def op(fs: Any, loc: Location) -> dict[str, int]:
            try:
                found = fs.find(loc.path, detail=True, on_error="raise")
            except FileNotFoundError:
                return {}
            base = loc.path.rstrip("/") + "/"
            return {
                name[len(base) :]: int(info.get("size") or 0)
                for name, info in found.items()
                if name.startswith(base) and info.get("type") != "directory"
            }

        return _remote_call(url_dir, "read", "listing", token, op)
    root = Path(_strip_file(url_dir))
    if not root.is_dir():
        return {}
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def exists(url: str, *, token: Token | None = None) -> bool:
    """Whether a file or folder exists."""
    if is_pelican(url):
        return bool(
            _remote_call(url, "read", "checking", token, lambda fs, loc: fs.exists(loc.path))
        )
    if is_remote(url):
        fs, path = _generic_fs(url)
        return bool(fs.exists(path))
    return os.path.exists(_strip_file(url))


def size(url: str, *, token: Token | None = None, policy: RetryPolicy | None = None) -> int:
    """Size of a file in bytes."""
    if is_pelican(url):
        return int(
            _remote_call(url, "read", "sizing", token, lambda fs, loc: fs.size(loc.path), policy)
        )
    if is_remote(url):
        fs, path = _generic_fs(url)
        return int(fs.size(path))
    try:
        return os.path.getsize(_strip_file(url))
    except FileNotFoundError:
        raise StorageError(f"{url} does not exist") from None


def cat(url: str, *, token: Token | None = None) -> bytes:
    """The whole content of a (small) file."""
    if is_pelican(url):
        return _remote_call(url, "read", "reading", token, lambda fs, loc: fs.cat_file(loc.path))
    if is_remote(url):
        fs, path = _generic_fs(url)
        return fs.cat_file(path)
    try:
        return Path(_strip_file(url)).read_bytes()
    except FileNotFoundError:
        raise StorageError(f"{url} does not exist") from None


# ---- reading -----------------------------------------------------------------------------
def open_input(
    url: str, mode: str = "rb", *, token: Token | None = None, block_size: int | None = None
) -> IO[bytes]:
    """Open an input for reading: a seekable binary file object.

    A remote file is read through ranged GETs; a read that fails or comes back short is
    retried by reopening at the same offset.
    """
    if mode != "rb":
        raise StorageError(f"open_input({url!r}) reads only ('rb'); use put_file to write")
    if is_pelican(url):
        opts = {"block_size": block_size} if block_size else {}
        holder: dict[str, Any] = {}

        def op(fs: Any, loc: Location) -> IO[bytes]:
            holder["reopen"] = lambda: fs.open(loc.path, "rb", **opts)  # no nested retries
            return fs.open(loc.path, "rb", **opts)

        first = _remote_call(url, "read", "opening", token, op)
        size = getattr(first, "size", None)
        if size is None:
            raise StorageError(f"opening {url}: the server did not say how large it is")
        return RemoteFile(url, holder["reopen"], int(size), first)
    try:
        return fsspec.open(url if "://" in url else os.path.abspath(url), mode).open()
    except FileNotFoundError:
        raise StorageError(f"input {url} does not exist") from None
    except OSError as exc:
        raise StorageError(f"cannot open {url}: {exc}") from None


class RemoteFile(io.RawIOBase):
    """A read-only, seekable remote file whose reads survive dropped or short transfers."""

    def __init__(self, url: str, opener: Callable[[], IO[bytes]], size: int, first: IO[bytes]):
        super().__init__()
        self.url = url
        self.size = size
        self.name = url
        self._opener = opener
        self._f: IO[bytes] | None = first
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position in {self.url}")
        self._pos = base + offset
        return self._pos

    def read(self, n: int | None = -1) -> bytes:
        left = max(self.size - self._pos, 0)
        n = left if n is None or n < 0 else min(n, left)
        if n == 0:
            return b""
        data = retry.call(
            lambda: self._read_at(self._pos, n),
            what="reading",
            url=self.url,
            policy=_settings.retry,
        )
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        memoryview(b).cast("B")[: len(data)] = data
        return len(data)

    def _read_at(self, pos: int, n: int) -> bytes:
        try:
            if self._f is None:
                self._f = self._opener()
            self._f.seek(pos)
            data = self._f.read(n)
        except Exception:
            self._discard()
            raise
        if len(data) != n:
            self._discard()
            raise TruncatedRead(f"got {len(data)} of {n} bytes at offset {pos}")
        return data

    def _discard(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            with contextlib.suppress(Exception):
                f.close()

    def close(self) -> None:
        self._discard()
        super().close()


def get_file(
    url: str,
    local_path: str,
    *,
    token: Token | None = None,
    expected_size: int | None = None,
    policy: RetryPolicy | None = None,
) -> str:
    """Download ``url`` to ``local_path`` (temp name + rename); returns ``local_path``.

    With ``expected_size`` a download of another size is retried, then refused.
    """
    local_path = os.fspath(local_path)
    folder = os.path.dirname(os.path.abspath(local_path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(local_path)}.part-{uuid.uuid4().hex[:8]}")
    try:
        if is_pelican(url):

            def op(fs: Any, loc: Location) -> None:
                fs.get_file(loc.path, tmp)
                got = os.path.getsize(tmp)
                if expected_size is not None and got != expected_size:
                    raise TruncatedRead(f"downloaded {got} bytes, expected {expected_size}")

            _remote_call(url, "read", "downloading", token, op, policy)
        else:
            src = _strip_file(url)
            if is_remote(url):
                fs, path = _generic_fs(url)
                fs.get_file(path, tmp)
            else:
                try:
                    shutil.copyfile(src, tmp)
                except FileNotFoundError:
                    raise StorageError(f"{url} does not exist") from None
            got = os.path.getsize(tmp)
            if expected_size is not None and got != expected_size:
                raise StorageError(f"{url} has {got} bytes, expected {expected_size}")
        os.replace(tmp, local_path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return local_path


# ---- writing -----------------------------------------------------------------------------
def put_file(local_path: str, url: str, *, token: Token | None = None) -> int:
    """Upload (or copy) a local file to ``url``; the stored size is checked. Returns it.

    Remote: a chunked PUT through pelicanfs, then a size check (a mismatch is retried).
    Local: copy to a temp name in the destination folder, fsync, rename.
    """
    want = os.path.getsize(local_path)
    if is_pelican(url):

        def op(fs: Any, loc: Location) -> int:
            fs.put_file(local_path, loc.path)
            got = int(fs.size(loc.path))
            if got != want:
                raise TruncatedRead(f"the stored copy has {got} bytes, {want} were sent")
            return got

        return int(_remote_call(url, "write", "uploading to", token, op))
    if is_remote(url):
        raise StorageError(
            f"cannot write to {url}: only local paths, pelican:// and osdf:// are writable"
        )
    dest = _strip_file(url)
    folder = os.path.dirname(os.path.abspath(dest))
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".{os.path.basename(dest)}.part-{uuid.uuid4().hex[:8]}")
        try:
            with open(local_path, "rb") as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except OSError as exc:
        raise StorageError(f"cannot write {dest}: {exc.strerror or exc}") from None
    return os.path.getsize(dest)


def clear_caches() -> None:
    """Forget cached filesystems and tokens (tests; after changing CA or token settings)."""
    _remote().clear()
    _tokens.clear()
