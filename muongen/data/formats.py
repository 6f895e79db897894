"""Which of the three production formats a file holds, told from its content, never its name.

* Parquet files start (and end) with the magic bytes ``PAR1``; v1 and v2 are told apart by
  their columns (v1 has the two shower-id columns, v2 only ``primary`` and ``muons``).
* HDF5 files carry the 8-byte signature ``\\x89HDF\\r\\n\\x1a\\n`` at offset 0 (or 512, 1024,
  ... when the file has a user block) and must hold ``primaries``, ``muons`` and ``counts``.

Anything else raises :class:`~muongen.errors.SchemaError` naming the file and what was found.
"""

from __future__ import annotations

from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from muongen import schema
from muongen.errors import InputFileError, SchemaError
from muongen.storage import open_input

PARQUET_MAGIC = b"PAR1"
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
HDF5_MAGIC_OFFSETS = (0, 512, 1024, 2048, 4096)

#: Parquet columns of each format, in file order.
PARQUET_COLUMNS = {
    schema.FORMAT_V1: ("primary_major_id", "primary_minor_id", "primary", "muons"),
    schema.FORMAT_V2: ("primary", "muons"),
}
#: Floats per muon in each Parquet format: v1 [E, x, y], v2 [E, r, x, y].
MUON_WIDTH = {schema.FORMAT_V1: 3, schema.FORMAT_V2: 4}
#: HDF5 datasets and their row widths (None: one-dimensional).
HDF5_DATASETS = {"primaries": 7, "muons": 6, "counts": None}


def sniff(fh: IO[bytes]) -> str:
    """'parquet' or 'hdf5' from the leading bytes of an open binary file; '' otherwise."""
    fh.seek(0)
    head = fh.read(8)
    if head[:4] == PARQUET_MAGIC:
        return "parquet"
    for offset in HDF5_MAGIC_OFFSETS:
        fh.seek(offset)
        if fh.read(8) == HDF5_MAGIC:
            return "hdf5"
    return ""


def parquet_format(arrow_schema: pa.Schema, url: str) -> str:
    """v1 or v2 from a Parquet file's Arrow schema; SchemaError naming the columns otherwise."""
    names = set(arrow_schema.names)
    for fmt in (schema.FORMAT_V1, schema.FORMAT_V2):
        if set(PARQUET_COLUMNS[fmt]) <= names:
            _check_list_types(arrow_schema, url, fmt)
            return fmt
    raise SchemaError(
        f"{url}: Parquet columns {sorted(names)} match no muongen format; expected "
        f"{list(PARQUET_COLUMNS[schema.FORMAT_V1])} (v1) or "
        f"{list(PARQUET_COLUMNS[schema.FORMAT_V2])} (v2)"
    )


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _check_list_types(arrow_schema: pa.Schema, url: str, fmt: str) -> None:
    primary = arrow_schema.field("primary").type
    muons = arrow_schema.field("muons").type
    ok = (
        _is_list(primary)
        and pa.types.is_floating(primary.value_type)
        and _is_list(muons)
        and _is_list(muons.value_type)
        and pa.types.is_floating(muons.value_type.value_type)
    )
    if not ok:
        raise SchemaError(
            f"{url}: looks like {fmt} but has primary: {primary}, muons: {muons}; expected "
            "primary: list<float>, muons: list<list<float>>"
        )


def hdf5_check(h5, url: str) -> None:
    """Raise SchemaError unless an open h5py File holds the production datasets."""
    found = {name: tuple(h5[name].shape) for name in h5 if hasattr(h5[name], "shape")}
    for name, width in HDF5_DATASETS.items():
        shape = found.get(name)
        ok = shape is not None and (len(shape) == 1 if width is None else shape[1:] == (width,))
        if not ok:
            raise SchemaError(
                f"{url}: HDF5 datasets {found} do not match the production layout "
                "primaries [N, 7], muons [M, 6], counts [N]"
            )


def detect_format(url: str) -> str:
    """The format of the file at ``url`` (FORMAT_V1, FORMAT_V2 or FORMAT_HDF5), from its content.

    Raises:
        SchemaError: the file is neither Parquet nor HDF5, or its columns/datasets match no
            muongen format (the message lists what was found and what was expected).
        InputFileError: the file is Parquet/HDF5 but cannot be read (e.g. truncated).
    """
    with open_input(url) as fh:
        return detect_open(fh, url)


def detect_open(fh: IO[bytes], url: str) -> str:
    """:func:`detect_format` on an already open file object."""
    kind = sniff(fh)
    fh.seek(0)
    if kind == "parquet":
        try:
            arrow_schema = pq.ParquetFile(fh).schema_arrow
        except (OSError, pa.ArrowException) as exc:
            raise InputFileError(
                f"{url}: unreadable Parquet file ({exc}); is it truncated?"
            ) from None
        return parquet_format(arrow_schema, url)
    if kind == "hdf5":
        import h5py

        try:
            with h5py.File(fh, "r") as h5:
                hdf5_check(h5, url)
        except (OSError, KeyError, ValueError) as exc:
            raise InputFileError(f"{url}: unreadable HDF5 file ({exc}); is it truncated?") from None
        return schema.FORMAT_HDF5
    fh.seek(0, 2)
    if fh.tell() == 0:
        raise InputFileError(
            f"{url}: the file is empty (0 bytes): an interrupted copy or transfer? Replace it "
            "or remove it from the inputs"
        )
    raise SchemaError(
        f"{url}: neither Parquet (magic PAR1) nor HDF5 (signature \\x89HDF); muongen reads "
        "Parquet v1/v2 and the production HDF5 layout"
    )
