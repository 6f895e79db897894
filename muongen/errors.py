"""The exceptions a user can cause. The CLI prints their message, without a traceback.

Every message says what was wrong, where (file, key, URL) and what to do about it.
"""

from __future__ import annotations

from submit.constants import EXIT_USER_ERROR


class MuongenError(Exception):
    """Base class of every error a user can cause; the CLI exits non-zero with its message."""

    exit_code: int = EXIT_USER_ERROR  # DAGMan does not retry it; neither does chain --local


class ConfigError(MuongenError):
    """A config file, preset or --set override is invalid (unknown key, wrong type, bad value)."""


class InputFileError(MuongenError):
    """An input file is unreadable, truncated, or does not have a known schema."""


class SchemaError(InputFileError):
    """An input file opens but its columns/datasets do not match any muongen format."""


class StorageError(MuongenError):
    """A local or remote (Pelican/OSDF) storage operation failed after its retries."""


class TokenError(StorageError):
    """A bearer token is missing, expired or lacks the scope an operation needs."""


class CheckpointError(MuongenError):
    """A checkpoint is corrupt, fails its sha256 check, or does not fit the model."""


class TrainingError(MuongenError):
    """Training had to stop (e.g. too many non-finite steps); the message says why."""

    exit_code = 3


class CampaignError(MuongenError):
    """A grid campaign file is invalid."""
