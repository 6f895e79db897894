"""`muongen config`: show the resolved config or every key with its meaning."""

from __future__ import annotations

import argparse

from muongen.config import describe, load_config, preset_names

HELP = "print the resolved config (preset/file + --set overrides) or list every key"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", default=None, help=f"preset ({', '.join(preset_names())}) or YAML file"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--list", action="store_true", help="list every key, its default and meaning"
    )


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(describe())
        return 0
    print(load_config(args.config, args.overrides).to_yaml(), end="")
    return 0
