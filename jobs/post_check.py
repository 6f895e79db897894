#!/usr/bin/env python3
"""DAGMan POST script of a training node: did this range publish a trustworthy checkpoint?

    post_check.py MANIFEST [PT] [--expect-range R] [--manifest-only] [--job-return N]

Checks that the manifest exists, parses and has the keys of a muongen checkpoint manifest,
then that the .pt (PT, default: the manifest's ``pt`` next to it) exists with the
manifest's size and sha256, and prints the step. ``--manifest-only`` skips the .pt (the
manifest is a receipt the job sent back while HTCondor uploaded the .pt to the OSDF).
``--job-return $RETURN``: when the job itself failed, say so and exit with its status
without looking at outputs. Any failure exits non-zero, so DAGMan retries the node.

Runs on the access point: standard library only (no muongen, no torch).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

MANIFEST_KEYS = (
    "name",
    "pt",
    "step",
    "range",
    "created",
    "size",
    "sha256",
    "muongen_version",
    "schema_version",
)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class CheckFailed(Exception):
    """The node's outputs are missing or do not match their manifest."""


def load_manifest(path: Path, expect_range: str | None) -> dict:
    """The manifest as a dict, after checking its keys and their types."""
    if not path.is_file():
        raise CheckFailed(f"manifest {path} does not exist: the node did not publish it")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckFailed(f"manifest {path} is not readable JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise CheckFailed(f"manifest {path} is not a JSON object")
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    if missing:
        raise CheckFailed(f"manifest {path} lacks {', '.join(missing)}")
    for key in ("step", "size"):
        value = manifest[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckFailed(f"manifest {path}: {key} is {value!r}, not a count")
    if not isinstance(manifest["sha256"], str) or not _SHA256.match(manifest["sha256"]):
        raise CheckFailed(f"manifest {path}: sha256 {manifest['sha256']!r} is not a hex digest")
    pt = manifest["pt"]
    if not isinstance(pt, str) or not pt or "/" in pt or "\\" in pt:
        raise CheckFailed(f"manifest {path}: pt {pt!r} is not a file name in the same folder")
    if expect_range is not None and manifest["range"] != expect_range:
        raise CheckFailed(
            f"manifest {path} is for range {manifest['range']!r}, not {expect_range!r}"
        )
    return manifest


def check_pt(pt: Path, manifest: dict) -> None:
    """The .pt exists and has the manifest's size and sha256."""
    if not pt.is_file():
        raise CheckFailed(f"checkpoint {pt} named by the manifest does not exist")
    size = pt.stat().st_size
    if size != manifest["size"]:
        raise CheckFailed(f"checkpoint {pt} has {size} bytes, the manifest says {manifest['size']}")
    digest = hashlib.sha256()
    with pt.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != manifest["sha256"]:
        raise CheckFailed(
            f"checkpoint {pt} has sha256 {digest.hexdigest()}, the manifest says "
            f"{manifest['sha256']}: the file is corrupt or from another run"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", type=Path, help="the range's manifest (<range>.json)")
    parser.add_argument("pt", type=Path, nargs="?", help="the .pt [manifest's pt, same folder]")
    parser.add_argument("--expect-range", help="fail unless the manifest is for this range")
    parser.add_argument("--manifest-only", action="store_true", help="do not look for the .pt")
    parser.add_argument("--job-return", help="the job's exit status (DAGMan's $RETURN)")
    args = parser.parse_args(argv)

    if args.job_return is not None:
        try:
            code = int(args.job_return)
        except ValueError:
            print(f"post_check: --job-return {args.job_return!r} is not an integer")
            return 1
        if code != 0:
            # DAGMan: negative = killed by that signal, -1001 submit failed, -1002 removed.
            print(f"post_check: the node's job failed (return {code}); outputs not checked")
            return code if 0 < code < 256 else 1

    try:
        manifest = load_manifest(args.manifest, args.expect_range)
        if args.manifest_only:
            where = "uploaded by HTCondor, not checked here"
        else:
            pt = args.pt or args.manifest.with_name(manifest["pt"])
            check_pt(pt, manifest)
            where = f"{pt}, sha256 verified"
    except CheckFailed as exc:
        print(f"post_check: FAILED: {exc}")
        return 1
    print(
        f"post_check: ok: range {manifest['range']} step {manifest['step']} "
        f"({manifest['pt']}, {manifest['size']} bytes, {where})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
