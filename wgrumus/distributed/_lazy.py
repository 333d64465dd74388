"""Module-level ``__getattr__`` that imports a name's submodule on first use (PEP 562), so a
package can list heavy names in ``__all__`` without importing what they need up front."""
from __future__ import annotations

import importlib


def lazy_getattr(package: str, table: dict, namespace: dict):
    """A ``__getattr__`` for ``package``: ``table`` maps name -> relative submodule; the value
    is cached in ``namespace`` (the package's globals) so each import happens once."""
    def __getattr__(name: str):
        mod = table.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(mod, package), name)
        namespace[name] = value
        return value
    return __getattr__
