"""muongen's config keys and their types, for checking ``--set`` overrides without muongen.

An access point has neither muongen nor torch, yet a sweep must refuse a key the config
does not have, or a value of the wrong type, before anything is written. So the types of
``muongen.config.Config`` are kept in a checked-in table, ``submit/config_keys.json``
(dotted key -> type spec), and :func:`check_value` mirrors ``muongen.config._coerce``.

Type specs (JSON): ``"bool"``, ``"int"``, ``"float"``, ``"str"``, ``"null"``,
``{"list": SPEC}``, ``{"choice": [values]}`` (a ``Literal``), ``{"any": [SPEC, ...]}`` (a
union). :func:`table_for` builds the table from the dataclasses by introspection alone;
only this module's ``__main__`` imports muongen, in a development checkout::

    python -m submit.config_keys        # rewrites submit/config_keys.json

``tests/submit/test_config_keys.py`` regenerates the table from ``muongen.config`` and
fails, naming that command, when the checked-in file is stale.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

TABLE_FILE = Path(__file__).resolve().parent / "config_keys.json"
REFRESH_COMMAND = "python -m submit.config_keys"


def type_spec(hint: Any) -> Any:
    """The JSON type spec of one dataclass field's type hint."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return {"choice": list(args)}
    if origin in (typing.Union, types.UnionType):
        return {"any": [type_spec(a) for a in args]}
    if origin is list:
        return {"list": type_spec(args[0])}
    names = {bool: "bool", int: "int", float: "float", str: "str", type(None): "null"}
    if hint in names:
        return names[hint]
    raise TypeError(f"config_keys: no type spec for {hint!r}")  # a new kind of field: extend


def table_for(config_cls: type) -> dict[str, Any]:
    """Dotted key -> type spec for every leaf field of a nested config dataclass."""
    table: dict[str, Any] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                walk(hint, f"{prefix}{f.name}.")
            else:
                table[f"{prefix}{f.name}"] = type_spec(hint)

    walk(config_cls, "")
    return table


def table_text(table: dict[str, Any]) -> str:
    """The file's text: one key a line, stable, so a diff shows what changed."""
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in table.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


@functools.lru_cache(maxsize=1)
def load_table() -> dict[str, Any]:
    """The checked-in table (``submit/config_keys.json``)."""
    return json.loads(TABLE_FILE.read_text())


def describe(spec: Any) -> str:
    """What a spec accepts, in words (for error messages)."""
    if isinstance(spec, str):
        return {
            "bool": "true or false",
            "int": "an integer",
            "float": "a number",
            "str": "a string",
            "null": "null",
        }[spec]
    if "choice" in spec:
        return f"one of {spec['choice']}"
    if "list" in spec:
        return f"a list of {describe(spec['list'])}"
    return " or ".join(describe(s) for s in spec["any"])


def check_value(value: Any, spec: Any) -> bool:
    """Whether muongen's config accepts ``value`` (as parsed from YAML) for ``spec``.

    Mirrors ``muongen.config._coerce``: an int is a float, a float with an integral value is
    an int, a string that parses as a number is a float (YAML 1.1 reads ``1e-4`` as a
    string), a single string is a list of strings.
    """
    if isinstance(spec, str):
        if spec == "null":
            return value is None
        if spec == "bool":
            return isinstance(value, bool)
        if spec == "str":
            return isinstance(value, str)
        if isinstance(value, bool):
            return False
        if spec == "int":
            return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, (int, float)):
            return True
        if isinstance(value, str):  # spec == "float"
            try:
                float(value)
            except ValueError:
                return False
            return True
        return False
    if "choice" in spec:
        return any(value == c and type(value) is type(c) for c in spec["choice"])
    if "list" in spec:
        if isinstance(value, str) and spec["list"] == "str":
            return True
        return isinstance(value, list) and all(check_value(v, spec["list"]) for v in value)
    return any(check_value(value, s) for s in spec["any"])


def main() -> int:
    from muongen.config import Config  # only here: a development checkout has muongen

    TABLE_FILE.write_text(table_text(table_for(Config)))
    print(f"wrote {TABLE_FILE} ({len(load_table())} keys)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
