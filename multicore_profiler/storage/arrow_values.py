"""Python values as Arrow arrays made from their buffers, not by ``pa.array``: pyarrow's
conversion of Python or numpy values imports pandas (a fifth of a second) on its first
call, which a command that converts a few small columns, such as ``mcprof runs``, would
pay for nothing (mcprof uses none of pandas)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import numpy as np
import pyarrow as pa

_NUMPY = {pa.int64(): np.int64, pa.uint64(): np.uint64}
"""The numpy type of each integer type ``column`` makes."""


def strings(values: Sequence[str]) -> pa.Array:
    """``values`` as an Arrow ``string`` array."""
    data = [value.encode() for value in values]
    offsets = np.fromiter(accumulate(map(len, data), initial=0), np.int32, len(data) + 1)
    return pa.Array.from_buffers(
        pa.string(), len(data), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))]
    )


def column(values: Sequence[int] | Sequence[bool], kind: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array of ``kind``: ``bool_``, ``int64`` or ``uint64``."""
    if kind == pa.bool_():
        data = np.packbits(np.asarray(values, np.bool_), bitorder="little")
    else:
        data = np.asarray(values, _NUMPY[kind])
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(data)])
