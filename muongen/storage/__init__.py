"""All file access: local paths, file://, pelican://<federation>/..., osdf:///...

Nothing outside this package looks at URL schemes or tokens.
"""

from __future__ import annotations

from muongen.storage.files import (
    cat,
    configure,
    exists,
    expand_inputs,
    get_file,
    is_pelican,
    is_remote,
    list_sizes,
    open_input,
    put_file,
    size,
)

__all__ = [
    "cat",
    "configure",
    "exists",
    "expand_inputs",
    "get_file",
    "is_pelican",
    "is_remote",
    "list_sizes",
    "open_input",
    "put_file",
    "size",
]
