"""Check, before a run starts, that its inputs can be read and its outputs written.

A grid job that finds out after an hour of training that its token cannot publish has
wasted the hour; :func:`check_access` asks the director about each remote location,
finds the token each needs (read for inputs, create/modify for outputs), checks its
scopes and expiry, and checks that each input folder exists, all in a few requests.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from muongen.errors import StorageError
from muongen.storage import files, remote, retry, tokens


def check_access(
    inputs: Sequence[str] = (),
    outputs: Sequence[str] = (),
    *,
    token_file: str | None = None,
    token_name: str | None = None,
    interactive: bool = False,
) -> list[str]:
    """Check every input (file, folder or glob) is readable and every output folder writable.

    Args:
        inputs: input paths/URLs/globs (as in data.paths).
        outputs: folders the run writes to (checkpoint publishing, TensorBoard sync).
        token_file, token_name: override storage.token_file / token_name.
        interactive: allow a device flow through the ``pelican`` command for a missing token.

    Returns:
        One line per location saying what was checked and with which token (its source,
        scopes and expiry; never its value).

    Raises:
        TokenError: a location needs a token that is missing, expired or lacks the scope.
        StorageError: a location cannot be reached or does not exist.
    """
    s = files.settings()
    opts = {
        "token_file": s.token_file if token_file is None else token_file,
        "token_name": s.token_name if token_name is None else token_name,
        "interactive": interactive,
    }
    lines = []
    for url in inputs:
        lines.append(_check_input(url, **opts))
    for url in outputs:
        lines.append(_check_output(url, **opts))
    return lines


def _namespace(url: str) -> remote.NamespaceInfo:
    loc = remote.locate(url)
    fs = remote.filesystem(loc, None, files.settings().timeout_s)
    path = tokens.scope_path(url)
    return retry.call(
        lambda: remote.namespace_info(fs, path),
        what="asking the director about",
        url=loc.render(path),
        policy=files.settings().retry,
    )


def _check_input(url: str, **opts: object) -> str:
    base = tokens.scope_path(url)
    if not remote.is_pelican(url):
        if files.is_remote(url):
            return f"read {url}: not checked (not a pelican:// or osdf:// URL)"
        local = files.local_path(base if any(c in url for c in "*?[") else url)
        if not os.path.exists(local):
            raise StorageError(f"input {url}: {local} does not exist")
        return f"read {url}: local, exists"
    info = _namespace(url)
    token = None
    if info.require_token:
        token = tokens.require_token(url, "read", **opts)  # type: ignore[arg-type]
    folder = remote.locate(url).render(base)
    if not files.exists(folder, token=token):
        raise StorageError(f"input {url}: {folder} does not exist on the federation")
    who = f"token {token!r}" if token else "no token needed (public namespace)"
    return f"read {url}: namespace {info.namespace}, {folder} exists, {who}"


def _check_output(url: str, **opts: object) -> str:
    if not remote.is_pelican(url):
        if files.is_remote(url):
            raise StorageError(
                f"output {url}: only local paths, pelican:// and osdf:// are writable"
            )
        path = os.path.abspath(files.local_path(url))
        probe = path
        while not os.path.exists(probe):
            probe = os.path.dirname(probe)
        if not (os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK)):
            raise StorageError(f"output {url}: {probe} is not a writable folder")
        return f"write {url}: local, writable"
    info = _namespace(url)
    token = tokens.require_token(url, "write", **opts)  # type: ignore[arg-type]
    return f"write {url}: namespace {info.namespace}, token {token!r}"
