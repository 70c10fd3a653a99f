"""Arrow arrays made from their buffers (``storage.arrow_values``) hold exactly what
``pa.array`` would make of the same values."""

from __future__ import annotations

import pyarrow as pa
import pytest

from multicore_profiler.storage.arrow_values import column, strings


@pytest.mark.parametrize("values", [[], [""], ["run", "", "héllo", "a/b=c.parquet"]])
def test_strings_are_what_pa_array_makes(values: list[str]) -> None:
    made = strings(values)
    made.validate(full=True)
    assert made.equals(pa.array(values, pa.string()))


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ([], pa.int64()),
        ([0, -1, 2**63 - 1, -(2**63)], pa.int64()),
        ([0, 2**64 - 1, 12345], pa.uint64()),
        ([], pa.bool_()),
        ([True, False, True, True, False, False, False, False, True], pa.bool_()),
    ],
)
def test_columns_are_what_pa_array_makes(values: list[int], kind: pa.DataType) -> None:
    made = column(values, kind)
    made.validate(full=True)
    assert made.equals(pa.array(values, kind))
    assert made.to_pylist() == values
