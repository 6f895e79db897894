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
    """Skipped files (url -> reason) and dropped events (url -> reason -> count).

    Each entry is counted in one epoch only, the first that met it: every epoch reads every
    file again, and its bad rows are the same rows (60 bad rows are 60, not 60 per epoch).
    """

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.events: dict[str, dict[str, int]] = {}
        self._epoch: dict[tuple[str, str], int] = {}  # (url, reason or "") -> counting epoch

    def _counts_in(self, url: str, what: str, epoch: int) -> bool:
        return self._epoch.setdefault((url, what), epoch) == epoch

    def bad_file(self, url: str, reason: str, epoch: int = 0) -> bool:
        """Record that ``url`` was skipped (the first reason given is kept); True if new."""
        if url in self.files or not self._counts_in(url, "", epoch):
            return False
        self.files[url] = reason
        return True

    def bad_events(self, url: str, n: int, reason: str, epoch: int = 0) -> int:
        """Record that ``n`` events of ``url`` were dropped for ``reason`` in ``epoch``;
        returns how many were counted (0 when an earlier epoch counted this file's)."""
        if n <= 0 or not self._counts_in(url, reason, epoch):
            return 0
        per_file = self.events.setdefault(url, {})
        per_file[reason] = per_file.get(reason, 0) + int(n)
        return int(n)

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
            "bad_files": [
                {"url": u, "reason": r, "epoch": self._epoch.get((u, ""), 0)}
                for u, r in sorted(self.files.items())
            ],
            "bad_events": [
                {"url": u, "reason": r, "events": n, "epoch": self._epoch.get((u, r), 0)}
                for u, per_file in sorted(self.events.items())
                for r, n in sorted(per_file.items())
            ],
            "totals": {"bad_files": self.n_bad_files, "bad_events": self.n_bad_events},
        }

    def load_dict(self, data: dict[str, Any]) -> None:
        """Replace the content with a :meth:`to_dict` result (resuming a run)."""
        self.files, self.events, self._epoch = {}, {}, {}
        for d in data.get("bad_files", []):
            self.bad_file(d["url"], d["reason"], d.get("epoch", 0))
        for d in data.get("bad_events", []):
            self.bad_events(d["url"], d["events"], d["reason"], d.get("epoch", 0))

    @classmethod
    def merged(cls, parts: list[dict[str, Any]]) -> BadInputReport:
        """One report from several ranks' :meth:`to_dict` results.

        Each epoch deals every file to exactly one rank, so an entry met by two ranks was met
        in two epochs: the earliest epoch's count is kept, as within one report.
        """
        entries = []
        for part in parts:
            entries += [(d.get("epoch", 0), "file", d) for d in part.get("bad_files", [])]
            entries += [(d.get("epoch", 0), "events", d) for d in part.get("bad_events", [])]
        out = cls()
        for epoch, kind, d in sorted(entries, key=lambda e: e[0]):
            if kind == "file":
                out.bad_file(d["url"], d["reason"], epoch)
            else:
                out.bad_events(d["url"], d["events"], d["reason"], epoch)
        return out

    def write(self, path: str | os.PathLike) -> None:
        """Write the report as JSON (atomically: a temporary file renamed into place)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, path)
