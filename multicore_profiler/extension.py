"""Methods a higher room gives a lower room's class, without the lower room importing it.

Imports flow one way (see DESIGN.md's layout): ``storage`` never imports ``analysis``,
``ingest`` never imports ``export``. Yet a ``Store`` offers ``compare`` (an analysis) and
a capture session offers ``export_chrome_trace`` (an export), as users expect of them. The
higher room registers such a method on the lower room's class, as pandas' accessors do:
``Store.extend(method)``, ``Store.extend_from(module, name)`` to import the method's module
when the method is first looked up (``Store.compare``), or
``extend("multicore_profiler.ingest.session.MegaKernelProfile")`` for a class whose module
must not be imported yet (the session's imports torch). The
package names the modules that extend each class (``load_before_objects``): they are
imported when the first object of that class is made, so the methods, and what those
modules register with a lower room (the analysis room's SQL modules, which every store
query may need), are in place before any object is used, while a process that makes
none (``mcprof --help``) imports none of them.

A package's public names are imported on first use the same way (``names_on_first_use``),
so that importing one of its modules costs only what that module imports.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any, TypeVar

Method = TypeVar("Method", bound=Callable[..., Any])

_WAITING: dict[str, list[tuple[Callable[..., Any], str | None]]] = {}
"""Methods registered by class name for classes not defined yet ("module.Class")."""

_EXTENDERS: dict[str, tuple[str, ...]] = {}
"""Modules (by name) to import before the first object of a class ("module.Class") is made."""


def load_before_objects(target: str, *modules: str) -> None:
    """Have ``modules`` (names) imported before the first object of the ``Extensible``
    class ``target`` ("package.module.Class") or of a subclass is made: the modules that
    extend it or register what its objects use."""
    _EXTENDERS[target] = _EXTENDERS.get(target, ()) + modules


def _load_extenders(cls: type) -> None:
    """Import the modules that extend ``cls`` or its bases (a dictionary look-up each once
    they are loaded; a thread that finds one being imported by another waits for it on
    the import lock)."""
    for klass in cls.__mro__:
        for name in _EXTENDERS.get(f"{klass.__module__}.{klass.__qualname__}", ()):
            import_module(name)


class Extensible:
    """A class whose higher rooms may add methods to it with ``extend``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        _load_extenders(cls)
        return super().__new__(cls)

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

    @classmethod
    def extend_from(cls, module: str, name: str) -> None:
        """Add the function ``name`` of ``module`` (a module name) as a method of this
        class, importing the module when the method is first looked up: for a method
        whose module costs start-up time that most processes would not use."""
        if name in dir(cls):
            raise TypeError(f"{cls.__name__} already has {name!r}: an extension only adds")
        setattr(cls, name, _Imported(module, name))


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


class _Imported:
    """A method found in its module when first looked up, then put on the class in place
    of this descriptor (so later look-ups cost what any method's does)."""

    def __init__(self, module: str, name: str) -> None:
        self._module, self._name = module, name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        method = getattr(import_module(self._module), self._name)
        for klass in (owner or type(instance)).__mro__:
            if klass.__dict__.get(self._name) is self:
                setattr(klass, self._name, method)
        return method if instance is None else method.__get__(instance, owner)


def names_on_first_use(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of the package named ``package``, whose
    public names, each in the module ``where`` gives, are imported when first looked
    up and kept in the package's namespace (later look-ups cost nothing)."""
    namespace = sys.modules[package].__dict__

    def module_getattr(name: str) -> Any:
        if name in where:
            value = namespace[name] = getattr(import_module(where[name]), name)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def module_dir() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return module_getattr, module_dir
