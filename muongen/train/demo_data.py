"""``data.synth_if_missing``: the demo writes its own synthetic data, and nowhere else.

Synthetic files are written into ``data.paths[0]`` only when that folder

- holds no input files (Parquet or HDF5) at all, and
- is empty, or was made by this function (it carries the marker :data:`MARKER`), or does
  not exist yet *and* is a built-in preset's own data folder (``demo-data``).

Anything else is refused with a message: a typo'd path is not silently filled with
invented data, and synthetic files are never mixed into a folder of real ones.
"""

from __future__ import annotations

import logging
from pathlib import Path

from muongen.config import DataConfig, load_config, preset_names
from muongen.errors import ConfigError
from muongen.storage.files import INPUT_SUFFIXES

log = logging.getLogger(__name__)

MARKER = ".muongen-synth"  # "the synthetic files here were written by synth_if_missing"


def preset_data_folders() -> set[Path]:
    """``data.paths[0]`` of every built-in preset that writes its own synthetic data."""
    folders = set()
    for name in preset_names():
        data = load_config(name).data
        if data.synth_if_missing and data.paths:
            folders.add(Path(data.paths[0]))
    return folders


def has_inputs(folder: Path) -> bool:
    return any(p.suffix in INPUT_SUFFIXES and p.is_file() for p in folder.rglob("*"))


def synthesise_if_missing(cfg: DataConfig, seed: int) -> None:
    """Write ``cfg.synth_files`` synthetic files into ``cfg.paths[0]`` when the rules above
    allow it and it has no input files; refuse with a ConfigError when they do not."""
    from muongen.data.synth import write_synthetic

    folder = cfg.paths[0]
    if "://" in folder or any(c in folder for c in "*?["):
        raise ConfigError(
            f"data.synth_if_missing needs data.paths[0] to be a local folder, not {folder}"
        )
    path = Path(folder)
    if path.is_dir() and has_inputs(path):
        return  # real or earlier synthetic data: use it
    if path.exists() and not path.is_dir():
        raise ConfigError(f"data.paths[0] {path} is a file that is not Parquet or HDF5 input")
    if not path.exists() and path not in preset_data_folders():
        raise ConfigError(
            f"data.paths[0] {path} does not exist. data.synth_if_missing writes synthetic data "
            "only into a preset's own folder (demo-data) or an existing empty folder: fix the "
            f"path, or create the folder to fill it with synthetic data, or set "
            "data.synth_if_missing=false"
        )
    if path.is_dir() and not (path / MARKER).exists() and any(path.iterdir()):
        raise ConfigError(
            f"data.paths[0] {path} holds files but no Parquet or HDF5 input; "
            "data.synth_if_missing writes synthetic data only into an empty folder or one it "
            "made itself: point data.paths at your data, or at an empty folder"
        )
    log.info(
        "no data in %s: writing %d synthetic files of %d events (muongen synth)",
        path,
        cfg.synth_files,
        cfg.synth_events_per_file,
    )
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("synthetic files written by muongen train (data.synth_if_missing)\n")
    write_synthetic(
        path,
        files=cfg.synth_files,
        events_per_file=cfg.synth_events_per_file,
        seed=seed,
        mix=cfg.synth_mix,
    )
