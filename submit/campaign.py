"""A campaign file: which ranges to train, where the data and outputs live, what to request.

``load_campaign(path) -> Campaign`` reads the YAML strictly (an unknown key, a wrong type or
a bad value is a :class:`CampaignError` naming the field and saying what to write), and
``plan_nodes(campaign)`` turns it into the chain of nodes, one per range folder, each with
its input files, the previous range's checkpoint and its own published names.

This module needs only the standard library and PyYAML, so ``muongen chain --local`` uses
it too: a workstation walks exactly the nodes a DAG would run. The annotated example is
``submit/examples/campaign.yaml``.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from submit import constants as C
from submit.errors import CampaignError
from submit.sweep import Evaluation, Sweep, members, parse_evaluation, parse_sweep

# What to write, quoted in error messages (dotted field -> example value).
EXAMPLES = {
    "name": "h4a-2024a",
    "project": "IceCube",
    "federation": "osg-htc.org (pelican://), osdf (osdf:///) or local (file://)",
    "data.base": "/icecube/PUBLIC/simulation/muongun/corsika-20904",
    "data.glob": '"*.parquet"',
    "ranges.start": "0",
    "ranges.end": "99",
    "ranges.step": "1000",
    "image": "osdf:///ospool/ap21/data/jdoe/containers/muongen-0.1.0.sif",
    "resources.gpus": "1",
    "resources.cpus": "4",
    "resources.memory": "24GB",
    "resources.disk": "40GB",
    "resources.gpus_minimum_capability": "8.0",
    "training.preset": "production-a100",
    "training.overrides": '["optim.lr_critic=2e-5", "data.batch_events=48000"]',
    "training.self_checkpoint_s": "3600",
    "training.init_checkpoint": "osdf:///ospool/ap21/data/jdoe/muongen/ckpt/h4a-2023b/0049000-0049999.json",
    "outputs.checkpoints": "osdf:///ospool/ap21/data/jdoe/muongen/ckpt",
    "outputs.tensorboard": "osdf:///ospool/ap21/data/jdoe/muongen/tb",
    "dagman.retries": "3",
    "dagman.max_idle": "10",
    "dagman.max_running": "1",
    "dagman.job_duration": " or ".join(C.JOB_DURATIONS),
    "dagman.transfer_holds": "5",
    "dagman.release_delay_s": "600",
    "credentials.oauth_service": "scitokens",
    "credentials.oauth_permissions": '"storage.read:/icecube storage.create:/icecube/muongen"',
    "credentials.oauth_resource": "https://osg-htc.org",
    "credentials.scitokens_file": "/home/jdoe/.condor/tokens/muongen.token",
}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_HOST = re.compile(r"^[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+(:\d+)?$")
_OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+=\S.*$")
_SIZE = re.compile(r"^\d+(\.\d+)?\s*([KMGT]i?B?)?$", re.IGNORECASE)
_SERVICE = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")  # HTCondor uses '_' to separate handles
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.")
_URL_SCHEMES = ("osdf://", "pelican://", "file://")


# --------------------------------------------------------------------------- the sections


@dataclass(frozen=True)
class DataSpec:
    base: str
    """Absolute path (in the federation) of the folder holding the range folders."""
    glob: str = "*.parquet"
    """Files to train on inside one range folder."""


@dataclass(frozen=True)
class RangeSpec:
    start: int
    """First range index (0 -> folder 0000000-0000999 when step is 1000)."""
    end: int
    """Last range index, inclusive."""
    step: int = 1000
    """Files per range folder (the producer writes 1000)."""

    def label(self, index: int) -> str:
        """Folder name of range ``index``: first and last file number, zero padded."""
        first = index * self.step
        return f"{first:0{C.RANGE_DIGITS}d}-{first + self.step - 1:0{C.RANGE_DIGITS}d}"

    def labels(self) -> list[str]:
        return [self.label(i) for i in range(self.start, self.end + 1)]


@dataclass(frozen=True)
class Resources:
    gpus: int = 1
    """request_gpus."""
    cpus: int = 4
    """request_cpus (data loading workers + the training process)."""
    memory: str = "24GB"
    """request_memory: a size such as 24GB, or a number of MB."""
    disk: str = "40GB"
    """request_disk: prefetched input files + checkpoints + the image's scratch."""
    gpus_minimum_capability: float | None = None
    """gpus_minimum_capability: e.g. 8.0 for A100/H100 (TF32); none: any GPU."""


@dataclass(frozen=True)
class Training:
    preset: str = "production-a100"
    """Built-in muongen preset the node trains with."""
    overrides: tuple[str, ...] = ()
    """``muongen train --set`` overrides, as key=value strings."""
    self_checkpoint_s: int = 3600
    """Seconds between self-checkpoints (the job exits 85 and HTCondor restarts it); 0: off."""
    init_checkpoint: str | None = None
    """Manifest URL (.json) the first range continues from; none: the first range starts fresh."""


@dataclass(frozen=True)
class Outputs:
    checkpoints: str
    """Base URL; range r publishes <checkpoints>/<name>/<r>.pt and .json."""
    tensorboard: str
    """Base URL; range r syncs its event files to <tensorboard>/<name>/<r>/."""


@dataclass(frozen=True)
class Dagman:
    retries: int = 3
    """DAGMan RETRY per node (a failed job or a failed POST check)."""
    max_idle: int = 10
    """DAGMAN_MAX_JOBS_IDLE."""
    max_running: int = 1
    """MAXJOBS of the training category: nodes queued at once (a chain needs 1)."""
    job_duration: str = "Long"
    """OSPool +JobDurationCategory: Medium (up to 20 h) or Long (up to 40 h)."""
    transfer_holds: int = 5
    """Holds for transient transfer failures released before the job is removed and retried."""
    release_delay_s: int = 600
    """Seconds a held job waits before it is released."""


@dataclass(frozen=True)
class Credentials:
    oauth_service: str | None = None
    """use_oauth_services: the credd gets and refreshes this token for the jobs."""
    oauth_permissions: str | None = None
    """<service>_oauth_permissions: the token's scopes."""
    oauth_resource: str | None = None
    """<service>_oauth_resource: the token's audience."""
    scitokens_file: str | None = None
    """scitokens_file: path (on the access point) of a token file HTCondor sends with the job."""


@dataclass(frozen=True)
class Campaign:
    name: str
    """Names the DAG's batch, the checkpoint folder and the TensorBoard folder."""
    federation: str
    """Pelican federation host (pelican://HOST), osdf (osdf:///) or local (file://)."""
    data: DataSpec
    ranges: RangeSpec
    outputs: Outputs
    image: str | None = None
    """container_image: osdf:///....sif, pelican://HOST/....sif, an absolute path, docker://...
    (required for grid jobs; muongen chain --local runs without one)."""
    project: str | None = None
    """OSPool +ProjectName (accounting); required on OSPool access points."""
    resources: Resources = field(default_factory=Resources)
    training: Training = field(default_factory=Training)
    dagman: Dagman = field(default_factory=Dagman)
    credentials: Credentials = field(default_factory=Credentials)
    sweep: Sweep | None = None
    """Many chains, one per member (submit/sweep.py); none: one chain."""
    evaluation: Evaluation | None = None
    """What each sweep member is scored on after its chain (needs sweep)."""
    source: str = "<campaign>"
    """The file it was read from (for messages); not a YAML key."""

    # ------------------------------------------------------------------ URLs

    @property
    def data_root(self) -> str:
        """URL prefix of data.base: osdf://, pelican://HOST or file://."""
        if self.federation == C.FEDERATION_OSDF:
            return "osdf://"
        if self.federation == C.FEDERATION_LOCAL:
            return "file://"
        return f"pelican://{self.federation}"

    def data_glob(self, range_name: str) -> str:
        return f"{self.data_root}{self.data.base}/{range_name}/{self.data.glob}"

    @property
    def checkpoint_dir(self) -> str:
        """Folder URL of this campaign's published checkpoints."""
        return f"{self.outputs.checkpoints}/{self.name}"

    def tensorboard_dir(self, range_name: str) -> str:
        return f"{self.outputs.tensorboard}/{self.name}/{range_name}"


# --------------------------------------------------------------------------- the chain


@dataclass(frozen=True)
class Node:
    """One DAG node: trains one range, continuing from the previous range's checkpoint."""

    index: int
    """Position in the chain, 0 for the first node."""
    range_name: str
    """The range folder, e.g. 0000000-0000999; also the checkpoint's name."""
    name: str
    """DAG node name (and .sub file stem)."""
    data_glob: str
    input_manifest: str | None
    """URL of the checkpoint manifest this node continues from; None: starts fresh."""
    input_pt: str | None
    output_manifest: str
    output_pt: str
    tensorboard: str


def plan_nodes(campaign: Campaign) -> list[Node]:
    """The chain of nodes, in order: node i continues from node i-1's published checkpoint."""
    nodes: list[Node] = []
    previous = campaign.training.init_checkpoint
    for index, range_name in enumerate(campaign.ranges.labels()):
        out = f"{campaign.checkpoint_dir}/{range_name}"
        nodes.append(
            Node(
                index=index,
                range_name=range_name,
                name=C.NODE_PREFIX + range_name,
                data_glob=campaign.data_glob(range_name),
                input_manifest=previous,
                input_pt=_pt_of(previous) if previous else None,
                output_manifest=out + ".json",
                output_pt=out + ".pt",
                tensorboard=campaign.tensorboard_dir(range_name),
            )
        )
        previous = out + ".json"
    return nodes


def node_arguments(campaign: Campaign, node: Node, *, transferred: bool = False) -> list[str]:
    """Arguments of the node wrapper (``jobs/node.sh`` -> ``muongen chain --node``).

    The contract, in order::

        --campaign-name N --range R --prev-manifest MANIFEST_OR_EMPTY --data-glob URL
        --ckpt-dest URL_OR_EMPTY --tb-dest URL --preset P [--set k=v ...] --self-checkpoint-s S

    With ``transferred=False`` (``muongen chain --local``) the node fetches the previous
    manifest from its URL and publishes ``<range>.pt/.json`` to ``--ckpt-dest`` itself. With
    ``transferred=True`` (a grid job) HTCondor moves the files: the previous checkpoint is
    already in the scratch dir (``--prev-manifest`` is its file name) and HTCondor publishes
    the node's checkpoint, so ``--ckpt-dest`` is empty and the node must not publish.
    """
    previous = node.input_manifest or ""
    if transferred and previous:
        previous = PurePosixPath(previous).name
    argv = [
        "--campaign-name", campaign.name,
        "--range", node.range_name,
        "--prev-manifest", previous,
        "--data-glob", node.data_glob,
        "--ckpt-dest", "" if transferred else campaign.checkpoint_dir,
        "--tb-dest", node.tensorboard,
        "--preset", campaign.training.preset,
    ]  # fmt: skip
    for override in campaign.training.overrides:
        argv += ["--set", override]
    argv += ["--self-checkpoint-s", str(campaign.training.self_checkpoint_s)]
    return argv


def _pt_of(manifest_url: str) -> str:
    """A checkpoint is <name>.pt next to its manifest <name>.json."""
    return manifest_url[: -len(".json")] + ".pt"


# --------------------------------------------------------------------------- loading


def load_campaign(path: str | Path) -> Campaign:
    """Read and validate a campaign YAML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise CampaignError(f"cannot read the campaign file {path}: {exc.strerror}") from None
    return parse_campaign(text, source=str(path))


def parse_campaign(text: str, *, source: str = "<campaign>") -> Campaign:
    """Validate campaign YAML text; errors name ``source`` and the field."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CampaignError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise CampaignError(f"{source}: expected a mapping of campaign settings (see {_example()})")
    _refuse_tokens(raw, source, "")
    raw = dict(raw)
    sweep_raw, eval_raw = raw.pop("sweep", None), raw.pop("evaluation", None)
    campaign = _build(Campaign, raw, source, "", skip=("source", "sweep", "evaluation"))
    campaign = dataclasses.replace(
        campaign,
        source=source,
        sweep=None if sweep_raw is None else parse_sweep(sweep_raw, source),
        evaluation=None if eval_raw is None else parse_evaluation(eval_raw, source),
    )
    _validate(campaign)
    if campaign.sweep is not None:
        if campaign.evaluation is None:
            _fail(source, "evaluation", "is required with sweep: (data: held-out files, events: N)")
        members(campaign)  # every member's keys and types, before anything is written
    elif campaign.evaluation is not None:
        _fail(source, "evaluation", "scores the members of a sweep: add a sweep: block")
    return campaign


def _example() -> str:
    return str(Path(__file__).parent / "examples" / "campaign.yaml")


def _fail(source: str, where: str, problem: str) -> typing.NoReturn:
    hint = EXAMPLES.get(where)
    tail = f"; write e.g. {where.rsplit('.', 1)[-1]}: {hint}" if hint else ""
    raise CampaignError(f"{source}: {where}: {problem}{tail}")


def _refuse_tokens(value: Any, source: str, where: str) -> None:
    """A bearer token never goes into a campaign file (it would end up in DAG files)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_tokens(item, source, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_tokens(item, source, f"{where}[{i}]")
    elif isinstance(value, str) and _JWT.search(value):
        raise CampaignError(
            f"{source}: {where}: this looks like a bearer token. Never put a token in a "
            "campaign file; let HTCondor provide it (credentials.oauth_service, or "
            "credentials.scitokens_file naming a token file on the access point)"
        )


def _build(cls: type, raw: Any, source: str, where: str, skip: tuple[str, ...] = ()) -> Any:
    """Construct dataclass ``cls`` from a YAML mapping, strictly (unknown keys, types)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        _fail(source, where or "<top>", f"expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    for key in raw:
        if key not in fields:
            dotted = f"{where}.{key}" if where else str(key)
            extra = ""
            if "token" in str(key).lower():
                extra = "; tokens come from HTCondor (see the credentials section)"
            raise CampaignError(
                f"{source}: {dotted}: unknown key{extra}; known keys here: "
                f"{', '.join(fields)} (see {_example()})"
            )
    values = {}
    for name, f in fields.items():
        dotted = f"{where}.{name}" if where else name
        if name not in raw:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required:
                _fail(source, dotted, "is required")
            continue
        values[name] = _convert(hints[name], raw[name], source, dotted)
    return cls(**values)


def _convert(hint: Any, value: Any, source: str, where: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, source, where)
    args = typing.get_args(hint)
    if type(None) in args:  # X | None
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(source, where, f"expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(source, where, f"expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            _fail(source, where, f"expected a string, got {value!r}")
        text = str(value).strip()
        if not text:
            _fail(source, where, "is empty")
        if "$" in text or "\n" in text:
            _fail(source, where, "must not contain '$' or a line break (HTCondor expands them)")
        return text
    if typing.get_origin(hint) is tuple:  # tuple[str, ...]
        if not isinstance(value, list):
            _fail(source, where, f"expected a list, got {value!r}")
        return tuple(_convert(str, item, source, f"{where}[{i}]") for i, item in enumerate(value))
    raise TypeError(f"unsupported field type {hint!r} at {where}")  # a bug here, not the user's


# --------------------------------------------------------------------------- validation


def _validate(c: Campaign) -> None:
    s = c.source
    if not _NAME.match(c.name):
        _fail(s, "name", f"{c.name!r} must be 1-64 letters, digits, '_', '.', '-'")
    if c.project is not None and not _NAME.match(c.project):
        _fail(s, "project", f"{c.project!r} is not a project name")
    if c.federation not in (C.FEDERATION_OSDF, C.FEDERATION_LOCAL) and not _HOST.match(
        c.federation
    ):
        _fail(s, "federation", f"{c.federation!r} is not a host name")

    _check_path(s, "data.base", c.data.base)
    if "/" in c.data.glob or any(ch.isspace() for ch in c.data.glob):
        _fail(s, "data.glob", f"{c.data.glob!r} must match files inside one range folder")

    r = c.ranges
    if r.start < 0:
        _fail(s, "ranges.start", f"{r.start} is negative")
    if r.end < r.start:
        _fail(s, "ranges.end", f"{r.end} is before ranges.start ({r.start})")
    if r.step < 1:
        _fail(s, "ranges.step", f"{r.step} must be at least 1 (files per range folder)")
    if (r.end + 1) * r.step - 1 >= 10**C.RANGE_DIGITS:
        _fail(s, "ranges.end", f"range {r.end} ends past file {10**C.RANGE_DIGITS - 1}")

    if c.image is not None:
        _check_image(s, c.image)

    res = c.resources
    if res.gpus < 0:
        _fail(s, "resources.gpus", f"{res.gpus} is negative")
    if res.cpus < 1:
        _fail(s, "resources.cpus", f"{res.cpus} must be at least 1")
    for key in ("memory", "disk"):
        if not _SIZE.match(getattr(res, key)):
            _fail(s, f"resources.{key}", f"{getattr(res, key)!r} is not a size")
    if res.gpus_minimum_capability is not None:
        if res.gpus == 0:
            _fail(s, "resources.gpus_minimum_capability", "is set but resources.gpus is 0")
        if not 1.0 <= res.gpus_minimum_capability < 20.0:
            _fail(s, "resources.gpus_minimum_capability", "is not a CUDA compute capability")

    t = c.training
    if not _NAME.match(t.preset):
        _fail(s, "training.preset", f"{t.preset!r} is not a built-in preset name")
    for i, override in enumerate(t.overrides):
        if not _OVERRIDE.match(override):
            _fail(s, f"training.overrides[{i}]", f"{override!r} is not section.key=value")
    if t.self_checkpoint_s < 0:
        _fail(s, "training.self_checkpoint_s", "is negative (0 turns self-checkpoints off)")
    if t.init_checkpoint is not None:
        _check_url(s, "training.init_checkpoint", t.init_checkpoint)
        if not t.init_checkpoint.endswith(".json"):
            _fail(s, "training.init_checkpoint", "must be a checkpoint manifest URL (.json)")
        if PurePosixPath(t.init_checkpoint).stem == r.label(r.start):
            _fail(
                s,
                "training.init_checkpoint",
                "has the same file name as the first range's own checkpoint; the job's "
                "scratch dir cannot hold both (copy it under another name)",
            )

    _check_url(s, "outputs.checkpoints", c.outputs.checkpoints)
    _check_url(s, "outputs.tensorboard", c.outputs.tensorboard)

    d = c.dagman
    for key, low in (("retries", 0), ("max_idle", 1), ("max_running", 1), ("transfer_holds", 0)):
        if getattr(d, key) < low:
            _fail(s, f"dagman.{key}", f"{getattr(d, key)} must be at least {low}")
    if d.release_delay_s < 0:
        _fail(s, "dagman.release_delay_s", "is negative")
    if d.job_duration not in C.JOB_DURATIONS:
        _fail(s, "dagman.job_duration", f"{d.job_duration!r} is not an OSPool duration category")

    cred = c.credentials
    if cred.oauth_service is not None and not _SERVICE.match(cred.oauth_service):
        _fail(s, "credentials.oauth_service", f"{cred.oauth_service!r} is not a service name")
    for key in ("oauth_permissions", "oauth_resource"):
        if getattr(cred, key) is not None and cred.oauth_service is None:
            _fail(s, f"credentials.{key}", "needs credentials.oauth_service")
    if cred.scitokens_file is not None:
        if cred.oauth_service is not None:
            _fail(s, "credentials.scitokens_file", "choose it or oauth_service, not both")
        if not cred.scitokens_file.startswith("/"):
            _fail(s, "credentials.scitokens_file", "must be an absolute path on the access point")


def _check_path(source: str, where: str, value: str) -> None:
    if not value.startswith("/") or "*" in value or any(ch.isspace() for ch in value):
        _fail(source, where, f"{value!r} must be an absolute folder path without wildcards")
    if value.endswith("/") and value != "/":
        _fail(source, where, f"{value!r}: drop the trailing '/'")


def _check_url(source: str, where: str, value: str) -> None:
    if not value.startswith(_URL_SCHEMES):
        _fail(source, where, f"{value!r} is not an osdf://, pelican:// or file:// URL")
    if value.endswith("/"):
        _fail(source, where, f"{value!r}: drop the trailing '/'")
    # HTCondor's file lists split on ',', remaps on ';' and '='; URLs here never need them.
    if any(ch in value for ch in ",;=*") or any(ch.isspace() for ch in value):
        _fail(source, where, f"{value!r} must not contain spaces, ',', ';', '=' or '*'")


def _check_image(source: str, value: str) -> None:
    if value.startswith("docker://"):
        return
    if value.startswith(("osdf:///", "pelican://")):
        if not value.endswith(".sif"):
            _fail(source, "image", f"{value!r} must name an Apptainer image file (.sif)")
        return
    if not value.startswith("/"):
        _fail(source, "image", f"{value!r} is not an osdf:///, pelican://, docker:// or / image")
