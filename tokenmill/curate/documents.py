"""One Parquet file of documents read into and written from pandas, with stable column types.

Required columns: `id` (unique, stable across re-runs), `text`, `source`. Every other column is
metadata that stages add and keep. Rejected documents carry the same columns plus `reason`.
The directory contract itself (columns, stage layout, input resolution) is in
`tokenmill.infra.document_dirs`, which tokenization reads too, and is imported from there only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tokenmill.errors import TokenmillError
from tokenmill.infra import storage
from tokenmill.infra.document_dirs import check_document_columns

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

# Columns that are always strings, even in a partition where every value is missing, so that
# every part of a stage has one schema.
STRING_COLUMNS = ("id", "text", "source", "reason", "raw", "lang", "kept_id", "cluster_id")


def read_documents(path: str | Path, columns: list[str] | None = None) -> pd.DataFrame:
    """Read one Parquet file of documents into pandas, checking the required columns."""
    import pyarrow as pa

    try:
        table = storage.read_parquet(path, columns=columns)
    except (pa.ArrowInvalid, OSError) as error:
        raise TokenmillError(f"cannot read Parquet file {path}: {error}") from None
    if columns is None:
        check_document_columns(table.column_names, path)
    return table.to_pandas(types_mapper=None)


def to_arrow(frame: pd.DataFrame) -> pa.Table:
    """Convert a partition to Arrow with stable types for the well-known string columns."""
    import pandas as pd
    import pyarrow as pa

    fields = []
    arrays = []
    for name in frame.columns:
        column = frame[name]
        # A pandas string column (the default for strings read from Parquet) that is empty or all
        # null has no values to infer from: written as null-typed it would clash with its other parts.
        if (
            name in STRING_COLUMNS
            or isinstance(column.dtype, pd.StringDtype)
            or (column.dtype == object and column.isna().all())
        ):
            values = [None if (v is None or (isinstance(v, float) and v != v)) else str(v) for v in column.tolist()]
            arrays.append(pa.array(values, type=pa.string()))
            fields.append(pa.field(name, pa.string()))
        else:
            array = pa.array(column.tolist() if column.dtype == object else column.to_numpy(), from_pandas=True)
            arrays.append(array)
            fields.append(pa.field(name, array.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def write_documents(frame: pd.DataFrame, path: str | Path) -> None:
    """Write one Parquet file of documents (a local path or a URL)."""
    import pyarrow.parquet as pq

    # Whole or absent: a renamed temporary file on disk, a completed upload on object storage.
    with storage.open_output(path) as handle:
        pq.write_table(to_arrow(frame.reset_index(drop=True)), handle, compression="zstd")


def write_rejected_ids(frame: pd.DataFrame, path: str | Path) -> None:
    """Write rejected documents' `id` and `reason` as one small Parquet file, sorted by id: a
    partition's rejections of a whole web archive are short strings, so the file's footer would
    weigh as much as its rows. Neither Arrow's schema (two plain strings read back the same) nor
    column statistics (nothing filters these files by id range) are stored."""
    import pyarrow.parquet as pq

    table = to_arrow(frame[["id", "reason"]].sort_values("id", ignore_index=True))
    with storage.open_output(path) as handle:
        pq.write_table(table, handle, compression="zstd", store_schema=False, write_statistics=False)
