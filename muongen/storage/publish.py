"""Publishing a checkpoint under an immutable name, and fetching one back, sha-checked.

A checkpoint is ``<name>.pt`` plus its manifest ``<name>.json`` (keys: name, pt, step,
range, created, size, sha256, muongen_version, schema_version). Remote stores cannot
rename, so publishing uploads the ``.pt`` first, checks the stored size, and writes the
manifest last: a reader that trusts a ``.pt`` only through its manifest never sees a
half-published checkpoint, and a failed publish leaves everything published before it
as it was. A published name is never overwritten: once it holds a verified checkpoint it
is final (a retried grid node finds it, :func:`fetch_published`, and is done).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile

from muongen import checkpoint as fmt
from muongen.checkpoint import parse_manifest
from muongen.errors import CheckpointError, StorageError
from muongen.storage import files, tokens
from muongen.storage.tokens import Token

log = logging.getLogger("muongen.storage")


def _write_token_for(dest_url_dir: str, token: Token | None) -> Token | None:
    if token is not None or not files.is_pelican(dest_url_dir):
        if token is not None:
            tokens.check_token(token, dest_url_dir, "write")
        return token
    s = files.settings()
    return tokens.require_token(
        dest_url_dir, "write", token_file=s.token_file, token_name=s.token_name
    )


def _read_token_for(dest_url_dir: str, token: Token | None) -> Token | None:
    """The token for checking what is already published: the write token if it may read
    there too, else a discovered read token (a create-only token cannot look)."""
    if token is None or token.covers(tokens.scope_path(dest_url_dir), "read"):
        return token
    s = files.settings()
    found = tokens.find_token(dest_url_dir, "read", token_name=s.token_name)
    return found or token


def publish_checkpoint(
    pt_path: str,
    json_path: str,
    dest_url_dir: str,
    *,
    token: Token | None = None,
    checked: bool = False,
) -> str:
    """Publish ``pt_path`` + its manifest ``json_path`` into ``dest_url_dir``.

    The local ``.pt`` is checked against the manifest first (its size only with
    ``checked=True``: the caller has just written it and knows its sha256); the token (for
    remote destinations) is checked for create/modify scope before anything is sent.
    A name that already holds a verified checkpoint is final: publishing again is a no-op
    (with a warning when this checkpoint differs), so a retried grid job may call this twice.

    Returns:
        The URL (or path) of the published manifest.

    Raises:
        CheckpointError: the local .pt does not match its manifest.
        TokenError: no token allows writing to ``dest_url_dir``.
        StorageError: the name is already published but its .pt does not match its
            manifest, or the upload failed after its retries (what was published before is
            untouched).
    """
    with open(json_path, "rb") as f:
        raw = f.read()
    manifest = parse_manifest(raw, json_path)
    pt_name, json_name = os.path.basename(pt_path), os.path.basename(json_path)
    if manifest["pt"] != pt_name:
        raise CheckpointError(f"manifest {json_path} describes {manifest['pt']}, not {pt_name}")
    size = os.path.getsize(pt_path)
    digest = manifest["sha256"] if checked else fmt.sha256_file(pt_path)
    if size != int(manifest["size"]) or digest != manifest["sha256"]:
        raise CheckpointError(
            f"{pt_path} does not match its manifest {json_path} (size {size} vs "
            f"{manifest['size']}, sha256 {digest[:12]}.. vs {str(manifest['sha256'])[:12]}..); "
            "it changed after the manifest was written: save the checkpoint again"
        )
    token = _write_token_for(dest_url_dir, token)
    reader = _read_token_for(dest_url_dir, token)
    dest_pt, dest_json = files.join(dest_url_dir, pt_name), files.join(dest_url_dir, json_name)

    if files.exists(dest_json, token=reader):
        published = parse_manifest(files.cat(dest_json, token=reader), dest_json)
        if published["sha256"] == digest and int(published["size"]) == size:
            log.info("checkpoint %s is already published at %s", pt_name, dest_json)
            return dest_json
        if not _published_pt_verifies(dest_url_dir, published, reader):
            raise StorageError(
                f"{dest_json} is already published but its .pt does not match it (a damaged "
                "publish): published names are immutable, so muongen will not replace it. "
                "Remove both files there by hand, or publish into a new campaign folder"
            )
        log.warning(
            "%s already holds a verified checkpoint (step %s); a published checkpoint is final, "
            "so it is kept and this run's %s (step %s) is not published",
            dest_json,
            published["step"],
            pt_name,
            manifest["step"],
        )
        return dest_json
    try:
        if _same_file_there(dest_pt, size, digest, reader):
            log.info("%s is already uploaded (an earlier attempt); writing its manifest", dest_pt)
        else:
            files.put_file(pt_path, dest_pt, token=token)
        files.put_file(json_path, dest_json, token=token)
    except StorageError as exc:
        kind = type(exc)
        raise kind(
            f"publishing checkpoint {pt_name} to {dest_url_dir} failed; nothing published "
            f"before is changed and {json_name} was not written. {exc}"
        ) from None
    log.info("published checkpoint %s (%d bytes) to %s", pt_name, size, dest_url_dir)
    return dest_json


def _published_pt_verifies(dest_url_dir: str, manifest: dict, token: Token | None) -> bool:
    url = files.join(dest_url_dir, manifest["pt"])
    return _same_file_there(url, int(manifest["size"]), manifest["sha256"], token)


def fetch_published(
    dest_url_dir: str, name: str, dest_dir: str, *, token: Token | None = None
) -> str | None:
    """The checkpoint ``<name>`` published in ``dest_url_dir``, fetched and sha-checked
    into ``dest_dir`` (its .pt path), or None when nothing is published under that name.

    Raises:
        CheckpointError: a manifest is published but it or its .pt is damaged.
    """
    manifest_url = files.join(dest_url_dir, f"{name}.json")
    if not files.exists(manifest_url, token=token):
        return None
    return fetch_checkpoint(manifest_url, dest_dir, token=token)


def _same_file_there(url: str, size: int, digest: str, token: Token | None) -> bool:
    """Whether ``url`` already holds exactly these bytes (an orphan of a failed publish)."""
    if not files.exists(url, token=token) or files.size(url, token=token) != size:
        return False
    with tempfile.TemporaryDirectory(prefix="muongen-publish-") as tmp:
        local = files.get_file(url, os.path.join(tmp, "check"), token=token)
        return fmt.sha256_file(local) == digest


def fetch_checkpoint(manifest_url: str, dest_dir: str, *, token: Token | None = None) -> str:
    """Download the checkpoint a manifest describes into ``dest_dir``; return the .pt path.

    The manifest is saved beside it. A copy already in ``dest_dir`` that matches is reused.

    Raises:
        CheckpointError: the manifest is invalid, or the .pt's size or sha256 differ from it.
        StorageError / TokenError: the files cannot be read.
    """
    raw = files.cat(manifest_url, token=token)
    manifest = parse_manifest(raw, manifest_url)
    pt_url = files.join(files.parent(manifest_url), manifest["pt"])
    os.makedirs(dest_dir, exist_ok=True)
    dest = os.path.join(dest_dir, manifest["pt"])
    want_size, want_sha = int(manifest["size"]), str(manifest["sha256"])
    if not (
        os.path.isfile(dest)
        and os.path.getsize(dest) == want_size
        and fmt.sha256_file(dest) == want_sha
    ):
        tmp = os.path.join(dest_dir, f".{manifest['pt']}.fetch")
        try:
            files.get_file(pt_url, tmp, token=token)
            got_size, got_sha = os.path.getsize(tmp), fmt.sha256_file(tmp)
            if got_size != want_size or got_sha != want_sha:
                raise CheckpointError(
                    f"{pt_url} does not match its manifest {manifest_url}: size {got_size} vs "
                    f"{want_size}, sha256 {got_sha[:12]}.. vs {want_sha[:12]}..; the checkpoint "
                    "is corrupt or was replaced. Do not use it: publish it again or pick "
                    "another checkpoint."
                )
            os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    json_dest = os.path.join(dest_dir, os.path.basename(manifest_url.rstrip("/")))
    tmp_json = json_dest + ".part"
    with open(tmp_json, "wb") as f:
        f.write(raw)
    os.replace(tmp_json, json_dest)
    return dest


_READ_CACHE: list[str] = []  # temporary folders of fetch_for_reading, removed at exit


def fetch_for_reading(ref: str, *, token: Token | None = None) -> str:
    """A checkpoint given by URL (its manifest ``.json``, its ``.pt``, or a folder of
    checkpoints: the manifest of the highest step there), fetched and sha-checked into a
    temporary folder removed when the process exits; returns the local manifest path.
    ``sample``, ``evaluate``, ``export`` and ``inspect`` read checkpoints this way.

    Raises:
        CheckpointError: nothing to fetch there, or the .pt does not match its manifest.
        StorageError / TokenError: the files cannot be read.
    """
    import atexit
    import shutil

    url = ref.rstrip("/")
    if url.endswith(".pt"):
        url = url[: -len(".pt")] + ".json"
    elif not url.endswith(".json"):
        url = _newest_manifest(url, token)
    if not _READ_CACHE:
        _READ_CACHE.append(tempfile.mkdtemp(prefix="muongen-checkpoint-"))
        atexit.register(shutil.rmtree, _READ_CACHE[0], True)
    dest = os.path.join(_READ_CACHE[0], str(len(os.listdir(_READ_CACHE[0]))))
    if not files.exists(url, token=token):
        raise CheckpointError(
            f"checkpoint manifest {url} does not exist: give the URL of a checkpoint's .json "
            "(or its .pt, or the folder that holds them)"
        )
    pt = fetch_checkpoint(url, dest, token=token)
    return fmt.manifest_for(pt).as_posix()


def _newest_manifest(folder_url: str, token: Token | None) -> str:
    """The URL of the manifest with the highest step in a folder of checkpoints."""
    names = [n for n in files.list_sizes(folder_url, token=token) if n.endswith(".json")]
    best: tuple[int, str] | None = None
    for name in names:
        if "/" in name:
            continue
        url = files.join(folder_url, name)
        try:
            meta = parse_manifest(files.cat(url, token=token), url)
        except CheckpointError:
            continue
        if best is None or meta["step"] > best[0]:
            best = (meta["step"], url)
    if best is None:
        raise CheckpointError(
            f"no checkpoint manifest (.json beside its .pt) in {folder_url}: give the URL of "
            "a checkpoint's .json"
        )
    return best[1]
