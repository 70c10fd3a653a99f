"""Methods a higher room gives a lower room's class, without the lower room importing it.

Imports flow one way (see DESIGN.md's layout): ``storage`` never imports ``analysis``,
``ingest`` never imports ``export``. Yet a ``Store`` offers ``compare`` (an analysis) and
a capture session offers ``export_chrome_trace`` (an export), as users expect of them. The
higher room registers such a method on the lower room's class, as pandas' accessors do:
``Store.extend(compare)``, or ``extend("multicore_profiler.ingest.session.MegaKernelProfile")``
for a class whose module must not be imported yet (the session's imports torch). The
package imports every room when it is first imported, so the methods are in place before
any object is made.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

Method = TypeVar("Method", bound=Callable[..., Any])

_WAITING: dict[str, list[tuple[Callable[..., Any], str | None]]] = {}
"""Methods registered by class name for classes not defined yet ("module.Class")."""


class Extensible:
    """A class whose higher rooms may add methods to it with ``extend``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for method, name in _WAITING.pop(f"{cls.__module__}.{cls.__qualname__}", []):
            cls.extend(method, name)

    @classmethod
    def extend(cls, method: Method, name: str | None = None) -> Method:
        """Add ``method`` (a function whose first argument is the object) to this class
        under ``name`` (default: its own); refuse a name the class already has."""
        name = name or method.__name__
        if name in dir(cls):
            raise TypeError(f"{cls.__name__} already has {name!r}: an extension only adds")
        setattr(cls, name, method)
        return method


def extend(target: str, name: str | None = None) -> Callable[[Method], Method]:
    """A decorator adding a method (under ``name``, default its own) to the ``Extensible``
    class named ``target`` (``"package.module.Class"``): now if its module is loaded, else
    when the class is defined, so that registering never imports the class's module."""
    module, _, class_name = target.rpartition(".")
    loaded = getattr(sys.modules.get(module), class_name, None)

    def register(method: Method) -> Method:
        if loaded is not None:
            return loaded.extend(method, name)
        _WAITING.setdefault(target, []).append((method, name))
        return method

    return register
