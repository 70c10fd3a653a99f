"""mcprof's own processes run without pandas: the ``mcprof`` command and the children it
or a capture session starts (the writer process, the trace reader's workers).

mcprof uses none of pandas, yet where it is installed pyarrow imports it the first time
it converts a value from or to numpy (``pa.array``, ``to_numpy``): a fifth of a second and
about 40 MB in every such process. A process of a job is never changed: the capture API
runs there beside the job's own code, which may use pandas. Imports nothing of the
package, so every room may use it.
"""

from __future__ import annotations

import sys


class _Refused:
    """An import finder for which pandas is not installed, as in a base install."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(
                f"No module named {name!r}: mcprof's own processes run without pandas",
                name=name,
            )


def keep_pandas_out() -> None:
    """Have this process find no pandas from now on (unless it has imported it already)."""
    if "pandas" in sys.modules or any(isinstance(f, _Refused) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Refused())
