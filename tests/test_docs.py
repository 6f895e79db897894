"""The user guide (docs/, built with MkDocs) and the help texts that point into it."""

from __future__ import annotations

import pytest

from muongen.cli import build_parser
from muongen.config import preset_names


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"]])
def test_the_help_texts_list_every_preset_in_the_preset_folder(argv, capsys):
    # `muongen --help` and `muongen train --help` said "presets: demo, production-a100",
    # written by hand long before `quality`: they now read the preset folder itself.
    with pytest.raises(SystemExit):
        build_parser({"train": "muongen.train.command"}).parse_args(argv)
    shown = " ".join(capsys.readouterr().out.split())
    assert len(preset_names()) >= 3
    assert f"presets: {', '.join(preset_names())};" in shown
