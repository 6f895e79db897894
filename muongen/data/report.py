"""The run's bad-input report: every skipped file and dropped event, with the reason.

Nothing is dropped silently: the stream records here what it skipped, and the run writes
the report as JSON (``bad_input.json`` in the run folder) next to its checkpoints.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPORT_NAME = "bad_input.json"


class BadInputReport:
    """Skipped files (url -> reason) and dropped events (url -> reason -> count)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.events: dict[str, dict[str, int]] = {}

    def bad_file(self, url: str, reason: str) -> None:
        """Record that ``url`` was skipped (the first reason given is kept)."""
        self.files.setdefault(url, reason)

    def bad_events(self, url: str, n: int, reason: str) -> None:
        """Record that ``n`` events of ``url`` were dropped for ``reason``."""
        if n > 0:
            per_file = self.events.setdefault(url, {})
            per_file[reason] = per_file.get(reason, 0) + int(n)

    @property
    def n_bad_files(self) -> int:
        return len(self.files)

    @property
    def n_bad_events(self) -> int:
        return sum(n for per_file in self.events.values() for n in per_file.values())

    def __bool__(self) -> bool:
        return bool(self.files or self.events)

    def to_dict(self) -> dict[str, Any]:
        return {
            "bad_files": [{"url": u, "reason": r} for u, r in sorted(self.files.items())],
            "bad_events": [
                {"url": u, "reason": r, "events": n}
                for u, per_file in sorted(self.events.items())
                for r, n in sorted(per_file.items())
            ],
            "totals": {"bad_files": self.n_bad_files, "bad_events": self.n_bad_events},
        }

    def load_dict(self, data: dict[str, Any]) -> None:
        """Replace the content with a :meth:`to_dict` result (resuming a run)."""
        self.files = {d["url"]: d["reason"] for d in data.get("bad_files", [])}
        self.events = {}
        for d in data.get("bad_events", []):
            self.bad_events(d["url"], d["events"], d["reason"])

    def write(self, path: str | os.PathLike) -> None:
        """Write the report as JSON (atomically: a temporary file renamed into place)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)
