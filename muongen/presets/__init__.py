"""Built-in YAML presets (package data): `muongen train --config NAME`."""
