"""Retries with exponential back-off and jitter, and what a failure is called afterwards.

The federation has hiccups (a 503 from a busy origin, a dropped connection, a truncated
body, a slow answer); pelicanfs itself retries none of them. Every remote operation in
muongen goes through :func:`call`, which retries the transient ones and turns the last
failure into a :class:`StorageError` (or :class:`TokenError` for 401/403) that says what
was done, to which URL, and what the federation answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from muongen.errors import StorageError, TokenError

log = logging.getLogger("muongen.storage")
T = TypeVar("T")


class TruncatedRead(OSError):
    """A remote read returned fewer bytes than it announced (retried)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a remote operation is retried."""

    attempts: int = 5
    """Tries in all (1: no retry)."""
    wait_s: float = 1.0
    """First back-off; doubles each retry, plus up to as much again of random jitter."""
    max_wait_s: float = 30.0
    """Upper bound of one back-off."""


def _clients():
    # imported when first needed: aiohttp and pelicanfs take ~0.2 s to import
    import aiohttp
    from aiowebdav2 import exceptions as dav
    from pelicanfs import exceptions as pel

    return aiohttp, dav, pel


def status_of(exc: BaseException) -> int | None:
    """The HTTP status a failure carries, if any."""
    aiohttp, dav, _ = _clients()
    if isinstance(exc, aiohttp.ClientResponseError):
        return exc.status
    if isinstance(exc, dav.ResponseErrorCodeError):
        return exc.code
    if isinstance(exc, dav.AccessDeniedError):
        return 403
    if isinstance(exc, dav.UnauthorizedError):
        return 401
    if isinstance(exc, dav.RemoteResourceNotFoundError):
        return 404
    return None


def is_auth_failure(exc: BaseException) -> bool:
    return status_of(exc) in (401, 403)


def is_missing(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError) or status_of(exc) == 404


def is_transient(exc: BaseException) -> bool:
    """True for failures worth another try: 5xx, 408/429, connection trouble, timeouts."""
    aiohttp, dav, pel = _clients()
    status = status_of(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    return isinstance(
        exc,
        (
            TruncatedRead,
            aiohttp.ClientPayloadError,
            aiohttp.ClientConnectionError,
            asyncio.TimeoutError,
            TimeoutError,
            dav.NoConnectionError,
            dav.ConnectionExceptionError,
            # pelicanfs says this when every cache failed its HEAD probe (a 5xx, a timeout,
            # or a 403 that the final diagnosis reports as such) or discovery answered badly
            pel.NoAvailableSource,
            pel.InvalidMetadata,
            pel.BadDirectorResponse,
        ),
    )


def describe(exc: BaseException) -> str:
    """What the federation answered, in one line (never a header or a token)."""
    aiohttp, dav, pel = _clients()
    if isinstance(exc, aiohttp.ClientResponseError):
        url = exc.request_info.real_url if exc.request_info else "?"
        return f"{exc.status} {exc.message} from {url}"
    if isinstance(exc, dav.ResponseErrorCodeError):
        body = exc.message.strip()[:160]
        return f"{exc.code} from {exc.url}: {body}"
    if isinstance(exc, dav.AccessDeniedError):
        return f"403 Forbidden from {exc.path}"
    if isinstance(exc, dav.UnauthorizedError):
        return f"401 Unauthorized from {exc.path}"
    if isinstance(exc, dav.NoConnectionError):
        cause = exc.__cause__
        return f"no connection to {exc.hostname}" + (f" ({cause})" if cause else "")
    if isinstance(exc, pel.NoAvailableSource):
        return "no cache or origin accepted the request (pelicanfs NoAvailableSource)"
    if isinstance(exc, pel.InvalidMetadata):
        return "federation discovery (/.well-known/pelican-configuration) failed"
    if isinstance(exc, pel.BadDirectorResponse):
        return "the director's answer carried no Link / X-Pelican-Namespace headers"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "no answer within the timeout (storage.timeout_s)"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _log_retry(what: str, url: str, attempts: int) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning(
            "%s %s failed (attempt %d/%d): %s; retrying in %.1f s",
            what,
            url,
            state.attempt_number,
            attempts,
            describe(exc) if exc else "?",
            wait,
        )

    return before_sleep


def call(
    fn: Callable[[], T],
    *,
    what: str,
    url: str,
    policy: RetryPolicy,
    diagnose: Callable[[BaseException], tuple[str, int | None]] | None = None,
    token_hint: Callable[[], str] | None = None,
) -> T:
    """Run ``fn`` with retries of transient failures; raise a MuongenError at the end.

    Args:
        fn: the operation (no arguments).
        what: a verb for messages ("reading", "listing", "uploading to").
        url: the URL operated on, for messages.
        policy: attempts and back-off.
        diagnose: called with a failure that carries no HTTP status of its own (pelicanfs's
            NoAvailableSource, say); returns what the federation answered (a probe of the
            director and origin) and the HTTP status found there. A 4xx found this way
            ends the retries at once (a typo in the path, a refused token).
        token_hint: returns what to do about a refused token (401/403).
    """
    probed: dict[int, tuple[str, int | None]] = {}

    def probe(exc: BaseException) -> tuple[str, int | None]:
        if diagnose is None or status_of(exc) is not None or is_missing(exc):
            return "", None
        if id(exc) not in probed:
            probed.clear()
            probed[id(exc)] = diagnose(exc)
        return probed[id(exc)]

    def permanent(exc: BaseException) -> bool:
        _, _, pel = _clients()
        if not isinstance(exc, (pel.NoAvailableSource, pel.BadDirectorResponse)):
            return False
        status = probe(exc)[1]
        return status is not None and 400 <= status < 500

    retrying = Retrying(
        stop=stop_after_attempt(max(policy.attempts, 1)),
        wait=wait_exponential_jitter(
            multiplier=policy.wait_s, max=policy.max_wait_s, jitter=policy.wait_s
        ),
        retry=retry_if_exception(lambda exc: is_transient(exc) and not permanent(exc)),
        before_sleep=_log_retry(what, url, policy.attempts),
        reraise=True,
    )
    try:
        return retrying(fn)
    except FileNotFoundError:
        raise StorageError(f"{what} {url}: no such file or folder on the federation") from None
    except (StorageError, TokenError):
        raise
    except Exception as exc:
        answer = describe(exc)
        extra, found = probe(exc)
        if extra:
            answer = f"{answer}; {extra}"
        if is_auth_failure(exc) or found in (401, 403):
            hint = token_hint() if token_hint else ""
            raise TokenError(f"{what} {url}: access refused ({answer}). {hint}".strip()) from None
        if is_missing(exc) or found == 404:
            raise StorageError(f"{what} {url}: not found ({answer})") from None
        tries = f" after {policy.attempts} attempts" if is_transient(exc) else ""
        raise StorageError(
            f"{what} {url} failed{tries}: {answer}. Check the URL and the federation's "
            "status; transient failures are retried (storage.retries)."
        ) from exc
