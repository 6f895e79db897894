"""TensorBoard event files for a training run (``torch.utils.tensorboard``), and reading them back.

Tags: TensorBoard groups a tag by its part before the first ``/`` and sorts the groups by
name, digits first. The run's headline scalars therefore sit in numbered groups, which open
the page in this order: ``1_w_gap/`` (``w_gap``, ``w_gap_ma``), ``2_loss/`` (``c_loss``,
``g_loss``, ``m_loss``, ``gp``), ``3_val/<name>`` (validation scores and plots),
``4_throughput/<name>`` (``events_per_s``, ...); then the rest by name: ``data/<counter>``,
``gpu/<name>``, ``cuda/<name>``, ``health/<name>``, ``hist/real|gen/<feature>``,
``lr/<name>``, ``time/<phase>_frac``. A custom-scalars layout (:data:`LAYOUT`, TensorBoard's
"Custom scalars" tab) puts the same charts on one page. Only rank 0 writes; the caller passes
``enabled=False`` on the other ranks.

A run's events go to ``<run dir>/tb/<run folder's name>/`` (:func:`run_log_dir`), so that
``tensorboard --logdir <run dir>/tb`` names the run after its folder, not ``.``.

Nothing that looks like a bearer token reaches an event file: ``text()`` and ``hparams()``
pass through :func:`scrub_secrets` (event files are synced to shared storage).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Tag groups of the headline scalars (see the module docstring for why they are numbered).
W_GAP = "1_w_gap/"
LOSS = "2_loss/"
VAL = "3_val/"
THROUGHPUT = "4_throughput/"
#: TensorBoard's custom-scalars layout: {category: {chart title: ["Multiline", [tag regex]]}}.
LAYOUT: dict[str, dict[str, list]] = {
    "training (what to watch)": {
        "w_gap: the critic's estimate of the generated-simulated distance (ma: moving average)": [
            "Multiline",
            [rf"^{W_GAP}"],
        ],
        "losses: critic (c), generator (g), multiplicity (m)": [
            "Multiline",
            [rf"^{LOSS}(c_loss|g_loss|m_loss)$"],
        ],
        "validation: model / floor ratios": ["Multiline", [rf"^{VAL}.*ratio$"]],
        "events/s (all ranks)": ["Multiline", [rf"^{THROUGHPUT}events_per_s$"]],
    },
    "details": {
        "gradient penalty": ["Multiline", [rf"^{LOSS}gp$"]],
        "throughput": ["Multiline", [rf"^{THROUGHPUT}"]],
        "time split of a step": ["Multiline", [r"^time/.*_frac$"]],
        "learning rates": ["Multiline", [r"^lr/"]],
        "health": ["Multiline", [r"^health/"]],
        "input counters": ["Multiline", [r"^data/"]],
    },
}
#: Event files' name prefix.
EVENT_PREFIX = "events.out.tfevents."

#: Bins of the feature histograms (TensorBoard re-bins for display anyway).
HIST_BINS = 64
REDACTED = "<redacted>"

# A JWT (SciTokens / WLCG tokens are JWTs): header.payload.signature, header starts '{"'.
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
_QUERY = re.compile(r"(?i)([?&](?:authz|access_token|token)=)[^&\s\"']+")
_SECRET_KEY = re.compile(r"(?i)token|secret|password|passwd|authz|credential|api_?key")
# key: value / key=value where the key names a secret (a *_file / *_dir / *_path key names a place)
_SECRET_ASSIGN = re.compile(
    r"(?i)\b([\w.-]*(?:token|secret|password|passwd|authz|credential|api_?key)[\w.-]*)"
    r"([\"']?\s*[:=]\s*[\"']?)([^\s\"',;&}]+)"
)
_PLACE_SUFFIXES = ("_file", "_dir", "_path", "_env")


def _is_secret_key(key: str) -> bool:
    low = key.lower()
    return bool(_SECRET_KEY.search(low)) and not low.endswith(_PLACE_SUFFIXES)


def scrub_secrets(text: str) -> str:
    """``text`` with anything that looks like a token replaced by ``<redacted>``.

    Catches JWTs, ``Bearer ...``, ``?authz=``/``access_token=`` query values, and values of
    ``key: value`` / ``key=value`` pairs whose key names a token, secret or password (keys
    ending in ``_file``, ``_dir``, ``_path`` or ``_env`` name a place, not a secret).
    """
    text = _JWT.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _QUERY.sub(lambda m: m.group(1) + REDACTED, text)

    def assign(m: re.Match[str]) -> str:
        if not _is_secret_key(m.group(1)) or m.group(3).startswith(REDACTED):
            return m.group(0)
        return m.group(1) + m.group(2) + REDACTED

    return _SECRET_ASSIGN.sub(assign, text)


def run_log_dir(run_dir: str | Path) -> Path:
    """Where a run folder's event files go: ``<run dir>/tb/<its name>`` (TensorBoard names a
    run after the folder below ``--logdir``); ``<run dir>/tb`` itself where a run written
    before holds event files there, so a resumed run keeps one folder."""
    run_dir = Path(run_dir)
    tb = run_dir / "tb"
    if any(tb.glob(EVENT_PREFIX + "*")):
        return tb
    return tb / (run_dir.resolve().name or "run")


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def _to_numpy(values: Any) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().float().cpu().numpy()
    return np.asarray(values)


class TensorBoardLogger:
    """A ``SummaryWriter`` with the run's conventions; every method is a no-op when disabled.

    Args:
        log_dir: the run's TensorBoard folder (created on first use).
        enabled: False on ranks other than 0 and with ``logging.tensorboard: false``;
            then nothing is imported, created or written.
        purge_step: on resume, the step the run continues from; TensorBoard then hides the
            points the killed run wrote at or after it (no doubled curve).
        flush_secs: seconds between flushes to disk.
    """

    def __init__(
        self,
        log_dir: str | Path,
        enabled: bool = True,
        *,
        purge_step: int | None = None,
        flush_secs: int = 60,
    ) -> None:
        self.log_dir = str(log_dir)
        self.enabled = enabled
        self._writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(
                log_dir=self.log_dir, purge_step=purge_step, flush_secs=flush_secs
            )

    def custom_scalars(self, layout: Mapping[str, Mapping[str, list]] = LAYOUT) -> None:
        """Write the custom-scalars layout (TensorBoard's "Custom scalars" tab)."""
        if self._writer is None:
            return
        self._writer.add_custom_scalars({k: dict(v) for k, v in layout.items()})

    def scalars(self, step: int, values: Mapping[str, Any]) -> None:
        """Write ``{tag: number or 1-element tensor}``; strings and None (labels) are skipped.

        Tensors are brought to the host together, one transfer per device.
        """
        if self._writer is None:
            return
        numbers: dict[str, float] = {}
        on_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
        for tag, value in values.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"scalar {tag!r} has {value.numel()} elements, not 1")
                on_device.setdefault(value.device, []).append((tag, value))
            elif value is None or isinstance(value, str):
                continue
            else:
                numbers[tag] = float(value)
        for tensors in on_device.values():
            stacked = torch.stack([t.detach().reshape(()).float() for _, t in tensors])
            numbers.update(zip((tag for tag, _ in tensors), stacked.cpu().tolist()))
        for tag in values:
            if tag in numbers:
                self._writer.add_scalar(tag, numbers[tag], step)

    def histogram(self, step: int, tag: str, values: Any, bins: int | str = HIST_BINS) -> None:
        """Histogram of ``values`` (array or tensor, any shape); non-finite values dropped."""
        if self._writer is None:
            return
        arr = _to_numpy(values).ravel()
        arr = arr[np.isfinite(arr)]
        if arr.size:
            self._writer.add_histogram(tag, arr, step, bins=bins)

    def real_vs_generated(
        self,
        step: int,
        real: Any,
        generated: Any,
        names: Sequence[str],
        *,
        overlay: bool = True,
    ) -> None:
        """Feature histograms of real and generated muons, (N, F) each, F = ``len(names)``.

        Writes ``hist/real/<name>`` and ``hist/gen/<name>`` and, with ``overlay``, one image
        ``hist/real_vs_gen`` with both distributions drawn on common bins per feature.
        The caller caps N (``logging.hist_max_muons``).
        """
        if self._writer is None:
            return
        r = _to_numpy(real).reshape(-1, len(names))
        g = _to_numpy(generated).reshape(-1, len(names))
        for i, name in enumerate(names):
            self.histogram(step, f"hist/real/{name}", r[:, i])
            self.histogram(step, f"hist/gen/{name}", g[:, i])
        if overlay:
            self.figure(step, "hist/real_vs_gen", overlay_figure(r, g, names, step=step))

    def figure(self, step: int, tag: str, fig: Figure, close: bool = True) -> None:
        """A matplotlib figure as an image (rendered with Agg); closed afterwards by default."""
        if self._writer is None:
            if close and "matplotlib.pyplot" in sys.modules:
                sys.modules["matplotlib.pyplot"].close(fig)
            return
        self._writer.add_figure(tag, fig, step, close=close)

    def text(self, step: int, tag: str, text: str) -> None:
        """Markdown text (e.g. the resolved config), scrubbed of anything token-like."""
        if self._writer is None:
            return
        self._writer.add_text(tag, scrub_secrets(text), step)

    def hparams(
        self, params: Mapping[str, Any], metrics: Mapping[str, float] | None = None
    ) -> None:
        """Hyperparameters for TensorBoard's HParams tab, in this run's folder.

        Nested dicts are flattened with dots; values other than numbers, bools and strings
        become strings; secret-named keys are redacted and strings scrubbed.
        """
        if self._writer is None:
            return
        from torch.utils.tensorboard.summary import hparams

        flat: dict[str, Any] = {}
        for key, value in _flatten(params).items():
            if _is_secret_key(key.rsplit(".", 1)[-1]):
                value = REDACTED
            elif not isinstance(value, (bool, int, float, str)):
                value = str(value)
            flat[key] = scrub_secrets(value) if isinstance(value, str) else value
        metric_dict = {k: float(v) for k, v in (metrics or {}).items()}
        file_writer = self._writer._get_file_writer()
        for summary in hparams(flat, metric_dict):
            file_writer.add_summary(summary)
        for tag, value in metric_dict.items():
            self._writer.add_scalar(tag, value, 0)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> TensorBoardLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def overlay_figure(
    real: np.ndarray, generated: np.ndarray, names: Sequence[str], *, step: int | None = None
) -> Figure:
    """One panel per feature: real and generated densities on common bins. (N, F) inputs."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4 * len(names), 3.2), layout="constrained")
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for i, (ax, name) in enumerate(zip(axes, names)):
        r = real[:, i][np.isfinite(real[:, i])]
        g = generated[:, i][np.isfinite(generated[:, i])]
        both = np.concatenate([r, g])
        if both.size == 0:
            ax.set_title(f"{name} (no data)")
            continue
        lo, hi = np.percentile(both, [0.1, 99.9])
        if not math.isfinite(lo) or hi <= lo:
            lo, hi = float(both.min()) - 0.5, float(both.max()) + 0.5
        edges = np.linspace(lo, hi, HIST_BINS + 1)
        ax.hist(r, bins=edges, density=True, histtype="step", label=f"real ({r.size})")
        ax.hist(g, bins=edges, density=True, histtype="step", label=f"generated ({g.size})")
        ax.set_xlabel(name)
        ax.set_yscale("log")
        ax.legend(fontsize="small")
    if step is not None:
        fig.suptitle(f"step {step}")
    return fig


def _run_folder(log_dir: str | Path) -> Path:
    """``log_dir`` where it holds event files, else the one folder below it that does (a run
    folder's ``tb/``: see :func:`run_log_dir`)."""
    log_dir = Path(log_dir)
    if any(log_dir.glob(EVENT_PREFIX + "*")):
        return log_dir
    runs = {p.parent for p in log_dir.rglob(EVENT_PREFIX + "*")}
    return runs.pop() if len(runs) == 1 else log_dir


def _accumulator(log_dir: str | Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(_run_folder(log_dir)), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def read_scalars(log_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of the run in ``log_dir`` (its event files, or those
    of the one run folder below it)."""
    acc = _accumulator(log_dir)
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_tags(log_dir: str | Path) -> dict[str, list[str]]:
    """Tags per kind (``scalars``, ``histograms``, ``images``, ``tensors``) of the run in
    ``log_dir`` (as :func:`read_scalars`)."""
    tags = _accumulator(log_dir).Tags()
    return {
        kind: list(tags.get(kind, [])) for kind in ("scalars", "histograms", "images", "tensors")
    }
