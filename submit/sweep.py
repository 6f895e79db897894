"""A campaign's ``sweep:`` and ``evaluation:`` blocks: many chains, one per member.

API (standard library + PyYAML; never imports muongen)::

    parse_sweep(raw, source) -> Sweep                 the validated ``sweep:`` mapping
    parse_evaluation(raw, source) -> Evaluation       the validated ``evaluation:`` mapping
    members(campaign) -> list[Member]                 deterministic order; [] without a sweep
    members_json(members) -> dict                     members.json: name -> settings, seed,
                                                      overrides
    Member(name, overrides, settings, seed)           frozen; overrides are the full --set
                                                      list: the campaign's training.overrides,
                                                      then the member's settings, then
                                                      train.seed=S
    check_overrides(overrides, source, member)        key/type check against config_keys.json
    member_campaign(campaign, member) -> Campaign     the member's own chain: name
                                                      <campaign>/<member> (so checkpoints go
                                                      to ckpt/<campaign>/<member>/, TB to
                                                      tb/<campaign>/<member>/<range>/), its
                                                      overrides, no sweep
    evaluation_url(campaign) -> str                   evaluation.data as a URL

``load_campaign`` (submit.campaign) calls :func:`members` once, so an unknown key or a value
of the wrong type in any member is a one-line :class:`CampaignError` naming the member and
the key before anything is written.

A grid sweep: the cross product of ``parameters`` (key -> list, the first key varying
slowest) times ``seeds``::

    sweep:
      parameters:
        optim.lr_critic: [1e-4, 3e-4]
        model.critic_local_width: [32, 64]
      seeds: [0, 1]            # train.seed of each member (default [0])

A random sweep draws ``samples`` settings with the sweep's own ``seed``; a parameter is a
range (``{log_uniform: [a, b]}``, ``{uniform: [a, b]}``) or a list to choose from
(``{choice: [...]}``, or a plain list). Drawn numbers keep 4 significant digits (an
integer key's draw is rounded), so a member's name shows its exact setting::

    sweep:
      samples: 12
      seed: 7
      parameters:
        optim.lr_critic: {log_uniform: [1e-5, 1e-3]}
        model.critic: {choice: [pointnet, epic]}
      seeds: [0]

Member names: ``<key>_<value>`` per swept key joined by ``+``, then ``seed_<S>``, e.g.
``lr_critic_3e-4+critic_local_width_64+seed_1``. A key is its last component (the full
dotted key where two swept keys share one). Numbers are written compactly (``3e-4``,
``0.5``). Names hold only letters, digits and ``_ . + -``: a member's name is a folder of
checkpoint URLs that HTCondor's file lists carry, where ``,`` separates files and ``=`` /
``;`` separate remaps, so the ``key=value,key=value`` spelling cannot be used on the grid.
A name over 80 characters, or with another character (a list or string value), becomes
``member-<10 hex digits of sha256 of its settings and seed>``; ``members.json`` maps every
name to its settings either way.

``evaluation:`` says what each member is scored on after its chain::

    evaluation:
      data: pelican://osg-htc.org/icecube/heldout/*.parquet  # a URL, or an absolute path
      events: 100000                                        # read in the campaign's federation
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NoReturn

import yaml

from submit.config_keys import check_value, describe, load_table
from submit.errors import CampaignError

SEED_KEY = "train.seed"
DEFAULT_EVENTS = 100000  # muongen evaluate's default: floors known to about 20 %
MAX_NAME = 80
SAMPLE_DIGITS = 4  # significant digits a drawn number keeps
RANGE_KINDS = ("log_uniform", "uniform", "choice")
SWEEP_KEYS = ("parameters", "seeds", "samples", "seed")
EVALUATION_KEYS = ("data", "events")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
_URL_SCHEMES = ("osdf://", "pelican://", "file://")


@dataclass(frozen=True)
class Sweep:
    parameters: tuple[tuple[str, Any], ...]
    """(dotted key, values) in file order: a tuple of values (grid), or a range spec
    ``(kind, (a, b))`` / ``("choice", (v, ...))`` (samples)."""
    seeds: tuple[int, ...] = (0,)
    """train.seed of each member; every setting runs once per seed."""
    samples: int | None = None
    """None: the grid (cross product); N: N random settings drawn with ``seed``."""
    seed: int = 0
    """Seed of the random draws of a ``samples`` sweep."""


@dataclass(frozen=True)
class Evaluation:
    data: str
    """Held-out files: a URL glob (osdf://, pelican://, file://) or an absolute path glob
    in the campaign's federation (like data.base)."""
    events: int = DEFAULT_EVENTS
    """Held-out events each member is scored on (muongen evaluate --events)."""


@dataclass(frozen=True)
class Member:
    name: str
    """Folder name of the member's chain (ckpt/<campaign>/<name>/, tb/<campaign>/<name>/)."""
    overrides: tuple[str, ...]
    """Every ``--set`` of its nodes: training.overrides, the swept keys, train.seed=S."""
    settings: dict[str, object] = field(hash=False)
    """Swept dotted key -> value (not train.seed)."""
    seed: int = 0
    """train.seed."""


# --------------------------------------------------------------------------- parsing


def _fail(source: str, where: str, problem: str) -> NoReturn:
    raise CampaignError(f"{source}: {where}: {problem}")


def _unknown(source: str, where: str, raw: dict, known: tuple[str, ...]) -> None:
    for key in raw:
        if key not in known:
            _fail(source, f"{where}.{key}", f"unknown key; known keys here: {', '.join(known)}")


def _int(source: str, where: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(source, where, f"expected an integer, got {value!r}")
    if value < low:
        _fail(source, where, f"{value} must be at least {low}")
    return value


def _number(source: str, where: str, value: Any) -> float:
    """A number; YAML 1.1 reads 1e-4 (no dot) as a string, so such strings count too."""
    if isinstance(value, bool):
        _fail(source, where, f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    _fail(source, where, f"expected a number, got {value!r}")


def _scalar(value: Any) -> Any:
    """A swept value as muongen will read it: numeric strings such as '1e-4' become floats."""
    if isinstance(value, str):
        try:
            return float(value) if re.match(r"^[-+]?[0-9.]+[eE][-+]?[0-9]+$", value) else value
        except ValueError:
            return value
    return value


def parse_sweep(raw: Any, source: str = "<campaign>") -> Sweep:
    """Validate a ``sweep:`` mapping (keys and shapes; config keys come in :func:`members`)."""
    if not isinstance(raw, dict):
        _fail(source, "sweep", f"expected a mapping (parameters:, seeds:), got {raw!r}")
    _unknown(source, "sweep", raw, SWEEP_KEYS)
    params = raw.get("parameters")
    if not isinstance(params, dict) or not params:
        _fail(
            source,
            "sweep.parameters",
            "is required: a mapping of config keys to lists, e.g. optim.lr_critic: [1e-4, 3e-4]",
        )
    samples = raw.get("samples")
    if samples is not None:
        samples = _int(source, "sweep.samples", samples, 1)
    elif "seed" in raw:
        _fail(source, "sweep.seed", "seeds the draws of sweep.samples; without samples use seeds")
    seed = _int(source, "sweep.seed", raw.get("seed", 0), 0)
    seeds_raw = raw.get("seeds", [0])
    if not isinstance(seeds_raw, list) or not seeds_raw:
        _fail(source, "sweep.seeds", f"expected a list of integers, got {seeds_raw!r}")
    seeds = tuple(_int(source, f"sweep.seeds[{i}]", s, 0) for i, s in enumerate(seeds_raw))
    if len(set(seeds)) != len(seeds):
        _fail(source, "sweep.seeds", f"{list(seeds)} repeats a seed")

    parameters = []
    for key, values in params.items():
        where = f"sweep.parameters.{key}"
        if not isinstance(key, str) or not _KEY.match(key):
            _fail(source, where, "is not a dotted config key such as optim.lr_critic")
        if key == SEED_KEY:
            _fail(source, where, "list the seeds under sweep.seeds instead")
        parameters.append((key, _parameter(source, where, values, samples is not None)))
    return Sweep(parameters=tuple(parameters), seeds=seeds, samples=samples, seed=seed)


def _parameter(source: str, where: str, values: Any, sampled: bool) -> Any:
    if isinstance(values, list):
        if not values:
            _fail(source, where, "is an empty list")
        items = tuple(_scalar(v) for v in values)
        for i, v in enumerate(items):
            if isinstance(v, dict) or v is None:
                _fail(source, f"{where}[{i}]", f"{v!r} is not a value for --set")
            if isinstance(v, str) and ("$" in v or "\n" in v):
                _fail(source, f"{where}[{i}]", "must not contain '$' or a line break")
        if len({json.dumps(v, sort_keys=True) for v in items}) != len(items):
            _fail(source, where, f"{list(values)} repeats a value")
        return ("choice", items) if sampled else items
    if isinstance(values, dict):
        if not sampled:
            _fail(source, where, "a range needs sweep.samples (a grid sweep takes a list)")
        if len(values) != 1 or next(iter(values)) not in RANGE_KINDS:
            _fail(
                source,
                where,
                f"expected one of {{log_uniform: [a, b]}}, {{uniform: [a, b]}}, "
                f"{{choice: [...]}}; got {values!r}",
            )
        ((kind, bounds),) = values.items()
        if kind == "choice":
            return _parameter(source, f"{where}.choice", bounds, True)
        if not isinstance(bounds, list) or len(bounds) != 2:
            _fail(source, f"{where}.{kind}", f"expected [low, high], got {bounds!r}")
        low, high = (_number(source, f"{where}.{kind}", b) for b in bounds)
        if not low < high:
            _fail(source, f"{where}.{kind}", f"low {low} must be below high {high}")
        if kind == "log_uniform" and low <= 0:
            _fail(source, f"{where}.{kind}", "log_uniform needs bounds above 0")
        return (kind, (low, high))
    _fail(source, where, f"expected a list of values, got {values!r}")


def parse_evaluation(raw: Any, source: str = "<campaign>") -> Evaluation:
    """Validate an ``evaluation:`` mapping."""
    if not isinstance(raw, dict):
        _fail(source, "evaluation", f"expected a mapping (data:, events:), got {raw!r}")
    _unknown(source, "evaluation", raw, EVALUATION_KEYS)
    data = raw.get("data")
    if not isinstance(data, str) or not data.strip():
        _fail(
            source,
            "evaluation.data",
            "is required: the held-out files, e.g. pelican://osg-htc.org/icecube/heldout/*.parquet",
        )
    data = data.strip()
    if not data.startswith(_URL_SCHEMES) and not data.startswith("/"):
        _fail(
            source,
            "evaluation.data",
            f"{data!r} must be an osdf://, pelican:// or file:// URL or an absolute path "
            "(nodes run in other folders)",
        )
    if any(ch.isspace() for ch in data) or any(ch in data for ch in "$,;="):
        _fail(source, "evaluation.data", f"{data!r} must not contain spaces, '$', ',', ';', '='")
    events = _int(source, "evaluation.events", raw.get("events", DEFAULT_EVENTS), 1)
    return Evaluation(data=data, events=events)


# --------------------------------------------------------------------------- members


def members(campaign: Any) -> list[Member]:
    """The sweep's members in a fixed order (settings in file order, then seeds); [] without.

    Every member's full override list is checked against the config's keys and types.
    """
    sweep: Sweep | None = getattr(campaign, "sweep", None)
    if sweep is None:
        return []
    source = getattr(campaign, "source", "<campaign>")
    base = tuple(campaign.training.overrides)
    keys = [key for key, _ in sweep.parameters]
    labels = _labels(keys)
    out: list[Member] = []
    seen: dict[str, Member] = {}
    for settings in _settings(sweep, source):
        for seed in sweep.seeds:
            name = member_name(settings, seed, labels)
            mine = tuple(f"{k}={override_value(v)}" for k, v in settings.items())
            member = Member(
                name=name,
                overrides=base + mine + (f"{SEED_KEY}={seed}",),
                settings=dict(settings),
                seed=seed,
            )
            if name in seen:
                _fail(
                    source,
                    "sweep",
                    f"members {name} repeat a setting ({settings}); draw fewer samples or "
                    "widen the ranges",
                )
            check_overrides(member.overrides, source, name)
            seen[name] = member
            out.append(member)
    return out


def _settings(sweep: Sweep, source: str) -> list[dict[str, Any]]:
    if sweep.samples is None:
        keys = [k for k, _ in sweep.parameters]
        return [
            dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in sweep.parameters))
        ]
    table = load_table()
    rng = random.Random(sweep.seed)
    drawn = []
    for _ in range(sweep.samples):
        setting = {}
        for key, (kind, spec) in sweep.parameters:
            if kind == "choice":
                setting[key] = spec[rng.randrange(len(spec))]
                continue
            low, high = spec
            if kind == "log_uniform":
                x = math.exp(rng.uniform(math.log(low), math.log(high)))
            else:
                x = rng.uniform(low, high)
            if table.get(key) == "int":
                setting[key] = round(x)
            else:
                setting[key] = float(f"{x:.{SAMPLE_DIGITS}g}")
        drawn.append(setting)
    return drawn


def check_overrides(overrides: tuple[str, ...] | list[str], source: str, member: str) -> None:
    """Each ``key=value`` names a config key and a value of its type (as muongen parses it)."""
    table = load_table()
    for item in overrides:
        key, _, raw = item.partition("=")
        key = key.strip()
        if key not in table:
            near = difflib.get_close_matches(key, list(table), n=3, cutoff=0.75)
            hint = f"did you mean {' or '.join(near)}?" if near else "see `muongen config --list`"
            _fail(source, f"member {member}", f"{key}: not a muongen config key ({hint})")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            _fail(source, f"member {member}", f"{key}: {raw!r} is not a YAML value")
        if not check_value(value, table[key]):
            _fail(
                source,
                f"member {member}",
                f"{key}: expected {describe(table[key])}, got {raw!r}",
            )


def members_json(members: list[Member]) -> dict[str, Any]:
    """What ``members.json`` holds: member name -> settings, seed, overrides."""
    return {
        m.name: {"settings": dict(m.settings), "seed": m.seed, "overrides": list(m.overrides)}
        for m in members
    }


def member_campaign(campaign: Any, member: Member) -> Any:
    """The campaign of ``member``'s chain: a plain (sweep-less) campaign whose name is
    ``<campaign>/<member>``, so every URL of its nodes sits in the member's own folder."""
    return dataclasses.replace(
        campaign,
        name=f"{campaign.name}/{member.name}",
        training=dataclasses.replace(campaign.training, overrides=member.overrides),
        # dagman.max_running bounds the sweep's chains; inside one, a range at a time
        dagman=dataclasses.replace(campaign.dagman, max_running=1),
        sweep=None,
        evaluation=None,
    )


def evaluation_url(campaign: Any) -> str:
    """``evaluation.data`` as a URL: an absolute path is read in the campaign's federation
    (like data.base: pelican://HOST/path, osdf:///path, or file:///path when local)."""
    data = campaign.evaluation.data
    return data if data.startswith(_URL_SCHEMES) else f"{campaign.data_root}{data}"


# --------------------------------------------------------------------------- names


def _labels(keys: list[str]) -> dict[str, str]:
    """Each swept key's label in a name: its last component, unless two keys share it."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (k if last.count(s) > 1 or s == "seed" else s) for k, s in zip(keys, last)}


def member_name(settings: dict[str, Any], seed: int, labels: dict[str, str]) -> str:
    parts = [f"{labels[k]}_{name_value(v)}" for k, v in settings.items()] + [f"seed_{seed}"]
    name = "+".join(parts)
    if len(name) <= MAX_NAME and _SAFE_NAME.match(name):
        return name
    canonical = json.dumps({"settings": settings, "seed": seed}, sort_keys=True)
    return "member-" + hashlib.sha256(canonical.encode()).hexdigest()[:10]


def compact_float(x: float) -> str:
    """The shorter of plain and exponent notation: 3e-4, 0.5, 1e-5, 2.5e-5, 100.0."""
    if not math.isfinite(x):
        return repr(x)
    plain = repr(x)
    if "e" in plain:  # 1e-05 -> plain is already exponent form; normalise it below
        plain = ""
    sign, digits, exponent = Decimal(repr(x)).normalize().as_tuple()
    mantissa = "".join(map(str, digits))
    mantissa = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
    exp_form = f"{'-' if sign else ''}{mantissa}e{exponent + len(digits) - 1}"
    if not plain or len(exp_form) < len(plain):
        return exp_form
    return plain


def name_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return compact_float(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    return json.dumps(value)  # a list: not name-safe, the name becomes a hash


def override_value(value: Any) -> str:
    """``value`` as the text after ``key=`` that YAML (muongen's --set) reads back as it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = compact_float(value)
        if "e" in text:  # YAML 1.1 floats need a dot and a signed exponent: 3.0e-4
            mantissa, exp = text.split("e")
            mantissa += "" if "." in mantissa else ".0"
            text = f"{mantissa}e{'' if exp.startswith('-') else '+'}{exp}"
        return text if yaml.safe_load(text) == value else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        try:
            same = yaml.safe_load(value) == value
        except yaml.YAMLError:
            same = False
        return value if same and value.strip() == value and value else json.dumps(value)
    return json.dumps(value)
