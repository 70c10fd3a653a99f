"""Named SQL analyses over the store: record analyses, outer-kernel analyses, comparison.

Importing the room registers its SQL modules with the store's registry and gives
``Store`` its ``compare`` and ``check`` methods.
"""

from multicore_profiler.analysis import registry
from multicore_profiler.analysis.clock_check import check
from multicore_profiler.analysis.compare import compare
from multicore_profiler.storage.store import Store

Store.extend(compare)
Store.extend(check)

__all__ = ["registry"]
