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
from importlib.machinery import ModuleSpec
from types import ModuleType


class _Refused:
    """The finder and loader of pandas in a process that refuses it: a probe
    (``importlib.util.find_spec``, as torch's compiler makes of the libraries it knows)
    finds a spec with no file, and an import fails as where pandas is not installed.
    ``None`` in ``sys.modules`` would not do: pyarrow's compiled import takes it for the
    module."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> ModuleSpec | None:
        return ModuleSpec(name, self) if name.partition(".")[0] == "pandas" else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        raise ModuleNotFoundError(
            f"No module named {spec.name!r}: mcprof's own processes run without pandas",
            name=spec.name,
        )

    def exec_module(self, module: ModuleType) -> None:
        """Never called: ``create_module`` refuses every module."""


def keep_pandas_out() -> None:
    """Have this process import no pandas from now on, unless it has already."""
    if "pandas" in sys.modules or any(isinstance(f, _Refused) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Refused())
