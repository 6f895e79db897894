"""The exceptions ``python -m submit`` prints without a traceback (exit status 2).

``submit/`` cannot import ``muongen`` (an access point has neither it nor torch), so it has
its own small hierarchy; ``muongen chain`` converts these into its ``CampaignError``.
"""

from __future__ import annotations


class SubmitError(Exception):
    """Base class of every error a user of ``python -m submit`` can cause."""


class CampaignError(SubmitError):
    """A campaign file is invalid; the message names the field and says what to write."""


class DagDirError(SubmitError):
    """A DAG directory is missing, incomplete, or would be overwritten unsafely."""
