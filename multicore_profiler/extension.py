"""Methods a higher room gives a lower room's class, without the lower room importing it.

Imports flow one way (see DESIGN.md's layout): ``storage`` never imports ``analysis``,
``ingest`` never imports ``export``. Yet a ``Store`` offers ``compare`` (an analysis) and
a capture session offers ``export_chrome_trace`` (an export), as users expect of them. The
higher room registers such a method on the lower room's class, as pandas' accessors do:
``Store.extend(compare)``. The package imports every room when it is first imported, so
the methods are there before any object is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

Method = TypeVar("Method", bound=Callable[..., Any])


class Extensible:
    """A class whose higher rooms may add methods to it with ``extend``."""

    @classmethod
    def extend(cls, method: Method) -> Method:
        """Add ``method`` (a function whose first argument is the object) to this class
        under its own name; refuse a name the class already has."""
        name = method.__name__
        if name in dir(cls):
            raise TypeError(
                f"{cls.__name__} already has {name!r}: an extension adds, never replaces"
            )
        setattr(cls, name, method)
        return method
