"""`muongen inspect CHECKPOINT`: what a checkpoint holds, at a glance or as JSON.

CHECKPOINT is a manifest ``.json``, a ``.pt``, a checkpoint folder (its newest valid
checkpoint), a run folder (its ``checkpoints/``), or a pelican:// / osdf:// URL of a
``.json``, ``.pt`` or folder (fetched and sha-checked first). ``muongen inspect`` tells a
checkpoint from a data file by its content (:func:`is_checkpoint`) and comes here.

Shown: step, events seen, created, muongen version; the preset the config matches (and
the keys that differ from it) and what the run decided from its files' muons per row
(the batch, the per-muon critic's weight); the model sizes with the parameter counts; the
range its muon energies are folded into (``model.energy_fold``); the sha256, verified;
the previous range's checkpoint the run continued, if any; the best validation score;
the training domain (:mod:`muongen.domain`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from muongen import checkpoint as ckpt
from muongen import domain as training_domain
from muongen import schema
from muongen.inference import is_url, local_copy

#: model settings shown (the sizes); the rest are in the config
SIZE_KEYS = (
    "representation",
    "z_global",
    "z_local",
    "context",
    "global_hidden",
    "local_hidden",
    "mult_hidden",
    "multiplicity",
    "critic_muon_hidden",
    "critic_head_hidden",
    "critic_local_width",
    "critic_global_width",
)


def is_checkpoint(path: str) -> bool:
    """Whether ``path`` names a checkpoint rather than data (by content, not by name alone):
    a .json that is a manifest, a .pt with a manifest beside it (or torch's zip magic), a
    folder holding step checkpoints or a run's ``checkpoints/``; URLs ending in .json / .pt."""
    if is_url(path):
        return path.rstrip("/").endswith((".json", ".pt"))
    p = Path(path[len("file://") :] if path.startswith("file://") else path)
    if p.is_dir():
        return bool(ckpt.list_checkpoints(p) or ckpt.list_checkpoints(p / "checkpoints"))
    if not p.is_file():
        return False
    if p.suffix == ".json":
        try:
            ckpt.parse_manifest(p.read_bytes()[: 1 << 20], p)
        except Exception:
            return False
        return True
    return p.suffix == ".pt"  # torch files are never event data


def _resolve(source: str) -> Path:
    local = Path(local_copy(source))
    if local.is_dir() and not ckpt.list_checkpoints(local):
        local = local / "checkpoints"  # a run folder
    return ckpt.resolve(local)


def _parameters(cfg) -> dict[str, int]:
    from muongen.model import build_models

    generator, critic = build_models(cfg.model)
    return {
        "generator": sum(p.numel() for p in generator.parameters()),
        "critic": sum(p.numel() for p in critic.parameters()),
    }


def _preset(config: dict[str, Any]) -> dict[str, Any]:
    """The built-in preset whose model and optimiser settings are closest to ``config``
    (data paths and run settings aside), with the keys that differ."""
    from muongen.config import load_config, preset_names

    best = None
    for name in preset_names():
        tree = load_config(name).to_dict()
        diff = [
            f"{section}.{k}"
            for section in ("model", "optim")
            for k in sorted(set(tree[section]) | set(config.get(section, {})))
            if tree[section].get(k) != config.get(section, {}).get(k)
            and not _decided_by_preset(section, k, tree, config)
        ]
        if best is None or len(diff) < len(best[1]):
            best = (name, diff)
    name, diff = best or ("", [])
    return {"name": name, "differs_in": diff}


def _decided_by_preset(section: str, key: str, preset: dict, config: dict) -> bool:
    """Whether ``config``'s ``section.key`` is what ``preset``'s own rule decided from the
    data (:mod:`muongen.train.muon_weight`): the rich weight, under the same rule."""
    if (section, key) != ("optim", "muon_critic_weight"):
        return False
    ours, theirs = preset["optim"], config.get("optim", {})
    rule = ("muon_critic_weight_rich", "rich_muons_per_row")
    return (
        ours.get("muon_critic_weight_rich", 0) > 0
        and all(ours.get(k) == theirs.get(k) for k in rule)
        and theirs.get(key) == ours["muon_critic_weight_rich"]
    )


def _decided(payload: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """What the run decided from its files' muons per row (``data.batch_muons``,
    ``optim.muon_critic_weight_rich``), where those rules were on."""
    out: dict[str, Any] = {}
    batch, weight = payload.get("batch_size") or {}, payload.get("muon_weight") or {}
    if (config.get("data") or {}).get("batch_muons", 0) > 0 and batch.get("batch_events"):
        out["batch_events"] = batch["batch_events"]
        if batch.get("mean_muons") is not None:
            out["mean_muons"] = batch["mean_muons"]
    rich = (config.get("optim") or {}).get("muon_critic_weight_rich", 0)
    if rich > 0 and weight.get("muon_critic_weight") is not None:
        out["muon_critic_weight"] = weight["muon_critic_weight"]
    return out


def _energy_floor_gev(payload: dict[str, Any]) -> float | None:
    """The least muon energy (GeV) a ``model.energy_fold`` generator draws, None without
    the fold."""
    floor = (payload.get("generator") or {}).get("energy_floor")
    return None if floor is None else schema.ENERGY_SCALE_GEV * 10.0 ** float(floor)


def _calibration(payload: dict[str, Any], kind: str = "energy") -> dict[str, Any] | None:
    """What the checkpoint's energy or radius calibration (train.calibrate_rows) was fitted
    on."""
    state = payload.get(f"{kind}_calibration")
    if not state:
        return None
    fitted = state.get("fitted")
    return {
        "events": state.get("events"),
        "muons": state.get("muons"),
        "classes_mapped": None if fitted is None else int(fitted.sum()),
        "classes": None if fitted is None else int(fitted.numel()),
    }


def inspect_checkpoint(source: str) -> dict[str, Any]:
    """Summary of a checkpoint as JSON-able values (see the module doc); its .pt is
    verified against the manifest's size and sha256 (CheckpointError if it fails)."""
    manifest = _resolve(source)
    payload = ckpt.load(manifest)  # verifies size and sha256 first
    meta = ckpt.read_manifest(manifest)
    config = payload.get("config") or {}
    cfg = ckpt.config_of(payload, manifest)
    counters = payload.get("trainer") or {}
    best = payload.get("best") or {}
    domain = payload.get("domain")
    model = config.get("model", {})
    return {
        "checkpoint": source,
        "manifest": str(manifest) if not is_url(source) else source,
        "step": meta["step"],
        "range": meta.get("range"),
        "events_seen": counters.get("events_seen"),
        "muons_seen": counters.get("muons_seen"),
        "created": meta["created"],
        "muongen_version": meta["muongen_version"],
        "schema_version": meta["schema_version"],
        "size": meta["size"],
        "sha256": meta["sha256"],
        "sha256_verified": True,
        "preset": _preset(config),
        "decided": _decided(payload, config),
        "model": {k: model[k] for k in SIZE_KEYS if k in model},
        "parameters": _parameters(cfg),
        "ema": "generator_ema" in payload,
        "energy_floor_gev": _energy_floor_gev(payload),
        "energy_calibration": _calibration(payload),
        "radius_calibration": _calibration(payload, "radius"),
        "previous": (payload.get("lineage") or {}).get("previous"),
        "validation": {k: v for k, v in best.items()} if best else None,
        "training_domain": domain,
    }


def _domain_lines(domain: dict[str, Any] | None) -> list[str]:
    if domain is None:
        return ["  training domain: not recorded (a checkpoint made before muongen recorded it)"]
    if not domain.get("events"):
        return ["  training domain: no events recorded"]
    e = domain["log10_energy"]
    masses = ", ".join(f"{a} ({n:,})" for a, n in (domain.get("masses") or {}).items())
    lines = [
        f"  training domain: {training_domain.describe(domain)}"
        + (" (partly known)" if domain.get("partial") else ""),
        f"    {domain['events']:,} events; log10 E {e[0]:.2f}-{e[1]:.2f}; A (events): {masses}",
        f"    occupancy (events per log10 E decade x cos zenith sixth; "
        f"{training_domain.occupied_cells(domain)} of "
        f"{training_domain.N_ENERGY * training_domain.N_COS} cells):",
        "      log10 E  cos z: " + " ".join(f"{c:>7.2f}" for c in domain["cos_edges"][:-1]),
    ]
    for i, row in enumerate(domain["occupancy"]):
        if any(row):
            lo = domain["energy_edges"][i]
            lines.append(
                f"      {lo:>4.0f}-{lo + 1:<4.0f}       " + " ".join(f"{n:>7d}" for n in row)
            )
    return lines


def format_text(info: dict[str, Any]) -> str:
    size = info["size"] / 1e6
    seen = info["events_seen"]
    lines = [
        f"{info['checkpoint']}: muongen checkpoint, step {info['step']:,}"
        + (f", range {info['range']}" if info["range"] else "")
        + (f", {seen:,} events seen" if seen is not None else ""),
        f"  created {info['created']} by muongen {info['muongen_version']} "
        f"(schema {info['schema_version']})",
        f"  manifest {info['manifest']}; .pt {size:.2f} MB, sha256 {info['sha256'][:16]}... "
        "verified",
    ]
    preset = info["preset"]
    differs = preset["differs_in"]
    lines.append(
        f"  preset: {preset['name']}"
        + (
            f" with {len(differs)} model/optim setting(s) changed ({', '.join(differs[:4])}"
            f"{', ...' if len(differs) > 4 else ''})"
            if differs
            else " (model and optim settings as shipped)"
        )
    )
    decided = info.get("decided") or {}
    if decided:
        said = []
        if "mean_muons" in decided:
            said.append(f"{decided['mean_muons']:.1f} muons a row")
        if "batch_events" in decided:
            said.append(f"batches of {decided['batch_events']} events (data.batch_muons)")
        if "muon_critic_weight" in decided:
            said.append(
                f"per-muon critic weight {decided['muon_critic_weight']:g} "
                "(optim.muon_critic_weight_rich)"
            )
        lines.append("  decided from its files: " + ", ".join(said))
    sizes = ", ".join(f"{k} {v}" for k, v in info["model"].items())
    par = info["parameters"]
    lines.append(
        f"  model: {sizes}; parameters: generator {par['generator']:,}, critic "
        f"{par['critic']:,}" + ("; sampling uses the weight average (EMA)" if info["ema"] else "")
    )
    floor = info.get("energy_floor_gev")
    if floor is not None:
        lines.append(
            f"  muon energies folded into [{floor:.4g} GeV, E0 / A] (model.energy_fold: the"
            " least muon energy its normalisers were fitted on, the primary's energy per"
            " nucleon)"
        )
    cal = info.get("energy_calibration")
    lines.append(
        f"  muon energies calibrated after training (train.calibrate_rows): "
        f"{cal['classes_mapped']} of {cal['classes']} classes mapped, on {cal['events']:,} "
        f"training rows ({cal['muons']:,} muons)"
        if cal
        else "  muon energies as the generator draws them (no calibration: train.calibrate_rows"
        " 0, or not the run's final checkpoint)"
    )
    cal = info.get("radius_calibration")
    lines.append(
        f"  muon radii calibrated after training (train.calibrate_radius): "
        f"{cal['classes_mapped']} of {cal['classes']} classes mapped"
        if cal
        else "  muon radii as the generator draws them (no radius calibration)"
    )
    prev = info["previous"]
    lines.append(
        f"  previous range's checkpoint: {prev['name']} (range {prev['range']}, step "
        f"{prev['step']:,}, sha256 {str(prev['sha256'])[:16]}...)"
        if prev
        else "  previous range's checkpoint: none (a first range or a single run)"
    )
    val = info["validation"]
    if val and any(v is not None for k, v in val.items() if k != "step"):
        score = ", ".join(f"{k} {v:.4g}" for k, v in val.items() if k != "step" and v is not None)
        lines.append(f"  validation (best so far): {score} at step {val.get('step')}")
    else:
        lines.append("  validation: none recorded (data.val_paths and logging.val_every not set)")
    lines += _domain_lines(info["training_domain"])
    return "\n".join(lines)


def run_one(source: str, as_json: bool) -> None:
    info = inspect_checkpoint(source)
    print(json.dumps(info) if as_json else format_text(info))
