"""The README's commands, as written: every `muongen ...` and `python -m submit ...` line of
the README and of the user guide under docs/ parses with the real CLI, and the files they
name are files the demo leaves behind."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from muongen.cli import build_parser
from muongen.config import load_config

README = Path(__file__).parents[1] / "README.md"
DOCS = sorted((Path(__file__).parents[1] / "docs").rglob("*.md"))


def readme_commands() -> list[str]:
    """`muongen ...` and `python -m submit ...` commands of the code blocks of the README and
    docs/**/*.md (continuations joined; `[...]` optional parts and trailing comments
    dropped)."""
    text = "\n".join(path.read_text() for path in [README, *DOCS])
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].split(" # ")[0].strip()
            for part in line.split("&&"):
                words = part.strip().split(maxsplit=1)
                if words and (
                    words[0] in ("muongen", ".venv/bin/muongen")
                    or part.strip().startswith("python -m submit ")
                ):
                    commands.append(re.sub(r"\s*\[[^\]]*\]", "", part.strip()))
    return commands


COMMANDS = readme_commands()


def test_the_readme_has_commands():
    assert len(COMMANDS) > 10


def test_the_guide_has_commands_on_every_page_that_shows_any():
    # The guide's commands go through the same check as the README's: each page whose
    # code blocks hold `muongen` lines is read (docs/reference/ too).
    names = {p.relative_to(README.parent / "docs").as_posix() for p in DOCS}
    assert {"training.md", "sampling.md", "grid.md", "reference/config.md"} <= names
    assert any(c.startswith("python -m submit ") for c in COMMANDS)
    assert sum("--domain strict" in c for c in COMMANDS) >= 2  # sample and evaluate


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_parses(command):
    if command.startswith("python -m submit "):
        from submit.__main__ import build_parser as submit_parser

        argv, parser = shlex.split(command)[3:], submit_parser()
    else:
        argv, parser = shlex.split(command)[1:], build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"README command does not parse: {command} (exit {exc.code})")


def test_checkpoints_the_readme_names_are_ones_the_demo_keeps():
    # `muongen train --config demo --out runs/demo` keeps its last checkpoint.keep_last step
    # checkpoints; a README command naming another one fails as written.
    demo = load_config("demo")
    every, last = demo.checkpoint.every_steps, demo.train.max_steps
    kept = sorted({*range(every, last + 1, every), last})[-demo.checkpoint.keep_last :]
    named = re.findall(r"runs/demo/checkpoints/step-(\d{9})\.(?:json|pt)", README.read_text())
    assert named, "the README names no demo checkpoint any more: update this test"
    for step in named:
        assert int(step) in kept, f"runs/demo/checkpoints/step-{step}: the demo keeps {kept}"


def test_a_checkpoint_that_is_not_there_names_the_ones_that_are(tmp_path):
    # After the demo, step-000000600 has long been rotated away: say what is there instead.
    import torch

    from muongen import checkpoint as ckpt
    from muongen.errors import CheckpointError

    for step in (2800, 3000):
        ckpt.save({"w": torch.zeros(2)}, tmp_path, f"step-{step:09d}", step=step)
    with pytest.raises(CheckpointError) as err:
        ckpt.read_manifest(tmp_path / "step-000000600.json")
    assert str(err.value).endswith("holds step-000002800.json, step-000003000.json")


def test_the_readme_links_to_notes_that_are_there():
    # The README keeps the how-to; the measurements behind it live in docs/. A link to a
    # note that was renamed or not committed is a dead end for a reader.
    root = README.parent
    linked = set(re.findall(r"\]\((docs/[^)#]+)\)", README.read_text()))
    assert linked, "the README links to no notes under docs/ any more: update this test"
    for rel in linked:
        assert (root / rel).is_file(), f"README links to {rel}, which is not there"
    for note in DOCS:
        for rel in re.findall(r"\]\(([a-z_]+\.md)\)", note.read_text()):
            assert (note.parent / rel).is_file(), f"{note.name} links to {rel}, not there"
