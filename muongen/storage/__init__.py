"""All file access: local paths, file://, pelican://<federation>/..., osdf:///...

Nothing outside this package looks at URL schemes or tokens.
"""

from __future__ import annotations

from muongen.storage.files import expand_inputs, is_remote, open_input

__all__ = ["expand_inputs", "is_remote", "open_input"]
