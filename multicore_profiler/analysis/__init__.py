"""Named SQL analyses over the store: record analyses, outer-kernel analyses, comparison.

Importing the room registers its SQL modules with the store's registry and gives
``Store`` its ``compare`` and ``check`` methods.
"""

from multicore_profiler.analysis import registry
from multicore_profiler.storage.store import Store

# Imported when first called: a command that neither compares nor checks (most) skips them.
Store.extend_from("multicore_profiler.analysis.compare", "compare")
Store.extend_from("multicore_profiler.analysis.clock_check", "check")

__all__ = ["registry"]
