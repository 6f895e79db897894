"""The user guide (docs/, built with MkDocs) and the help texts that point into it.

The site is built with ``mkdocs build --strict`` on every test run (never skipped: mkdocs is
in the ``dev`` extra), so a dead link, a missing anchor or a page left out of the nav fails
here. The two generated references must match the code they are generated from."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from muongen.cli import build_parser
from muongen.config import preset_names

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"


def load_generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"]])
def test_the_help_texts_list_every_preset_in_the_preset_folder(argv, capsys):
    # `muongen --help` and `muongen train --help` said "presets: demo, production-a100",
    # written by hand long before `quality`: they now read the preset folder itself.
    with pytest.raises(SystemExit):
        build_parser({"train": "muongen.train.command"}).parse_args(argv)
    shown = " ".join(capsys.readouterr().out.split())
    assert len(preset_names()) >= 3
    assert f"presets: {', '.join(preset_names())};" in shown


def test_the_site_builds_strictly(tmp_path):
    # Never skipped: a missing mkdocs is a failure that names the extra.
    for module in ("mkdocs", "material"):
        assert importlib.util.find_spec(module), f"{module} is missing: pip install -e '.[dev]'"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Documentation built" in done.stderr
    assert (tmp_path / "training" / "index.html").is_file()
    assert not list(tmp_path.rglob("*.py")), "the generator script was published as a page"


def test_every_page_is_in_the_nav():
    # mkdocs --strict warns about pages left out of the nav; this names them directly.
    text = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w/-]+\.md)\s*$", text, flags=re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages == listed, f"in docs/ but not in mkdocs.yml's nav: {sorted(pages - listed)}"


@pytest.mark.parametrize("page", ["config", "campaign"])
def test_the_generated_references_match_the_code(page):
    gen = load_generator()
    path = {"config": gen.CONFIG_PAGE, "campaign": gen.CAMPAIGN_PAGE}[page]
    build = gen.PAGES[path]
    assert path.read_text() == build(), (
        f"docs/reference/{page}.md is stale (a config or campaign field changed): "
        f"run `{gen.COMMAND}` and commit the result"
    )


def test_the_config_reference_names_every_key():
    # The reference is only as good as its coverage: every key `muongen config --list`
    # prints has a row, with its docstring.
    from muongen import config

    text = (DOCS / "reference" / "config.md").read_text()
    keys = re.findall(r"^(\w+\.\w+) = ", config.describe(), flags=re.M)
    assert len(keys) > 100
    for key in keys:
        assert f"| `{key}` |" in text, f"{key} is not in docs/reference/config.md"
    assert "Input files, directories, globs or URLs" in text  # a field docstring
    for name in preset_names():
        assert f"### {name}\n" in text


def test_the_progress_line_points_at_a_section_that_explains_it():
    # The first line of every training run's progress names this page and anchor.
    from muongen.monitor import progress

    page, anchor = progress.DOCS.removeprefix("docs/").split("#")
    text = (DOCS / page).read_text()
    heading = next(h for h in re.findall(r"^## (.+)$", text, flags=re.M)
                   if re.sub(r"[^a-z0-9]+", "-", h.lower()).strip("-") == anchor)  # fmt: skip
    section = text.split(f"## {heading}")[1].split("\n## ")[0]
    for column in ("c_loss", "g_loss", "w_gap", "m_loss", "gp", "elapsed", "eta", "healthy"):
        assert f"`{column}`" in section, f"{column} is not explained under '{heading}'"


def test_the_docs_extra_builds_the_guide_and_dev_holds_it():
    from importlib import metadata

    extras = metadata.metadata("muongen").get_all("Provides-Extra")
    assert "docs" in extras
    wanted = {"docs": set(), "dev": set()}
    for req in metadata.requires("muongen") or []:
        for extra in wanted:
            if f'extra == "{extra}"' in req:
                wanted[extra].add(re.split(r"[<>=!~ ;\[]", req)[0].lower())
    assert {"mkdocs", "mkdocs-material"} <= wanted["docs"]
    assert wanted["docs"] <= wanted["dev"]  # the README's test command builds the site


def test_the_readme_stays_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "../" not in readme  # no path outside the repository
    figure = re.search(r"\]\((docs/images/[^)]+\.png)\)", readme)
    assert figure and (ROOT / figure.group(1)).stat().st_size < 300_000


def test_ci_runs_the_readmes_test_command_as_written():
    # .ci/run exists to run the README's command 2 on a clean clone: the two must not drift.
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n# 1\. .*?```", readme, flags=re.S).group(0)
    one, two = (line for line in block.splitlines() if line.startswith("python3 -m venv"))
    assert one.endswith("muongen train --config demo --out runs/demo")
    assert two.endswith(".venv/bin/python -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert two in ci, ".ci/run no longer runs the README's command 2 as written"
