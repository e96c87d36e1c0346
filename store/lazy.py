"""Package names imported on first use (PEP 562), for package `__init__`s whose submodules are heavy.

`__getattr__, __dir__ = lazy_exports(globals(), {"Name": "package.module", ...})` in a package's `__init__`: a name
is imported from its module when first read and then kept in the package's namespace; `dir()` lists `__all__`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(namespace: dict[str, Any], exports: Mapping[str, str]) -> tuple[Callable[[str], Any],
                                                                                  Callable[[], list[str]]]:
    """The module-level `__getattr__` and `__dir__` of a package whose names `exports` maps to their modules."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:  # noqa: N807 - the PEP 562 hook's own name
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted(namespace.get("__all__", exports))

    return __getattr__, __dir__
