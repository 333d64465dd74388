"""WGSL sources: loaded from the package's shaders folder and specialised by text substitution.

A kernel is (family file, entry point, defines). Every family file is prefixed with
``common.wgsl`` (parameter slot access, dispatch index helpers), and ``{{NAME}}`` markers are
replaced by the defines. The compiled pipeline is cached per device by ``Kernel.key``.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=None)
def shader_dir() -> Path:
    # Installed wheel: wgrumus/shaders; editable / source checkout: <repo>/shaders.
    for cand in (_PKG / "shaders", _PKG.parent / "shaders"):
        if (cand / "common.wgsl").is_file():
            return cand
    raise FileNotFoundError(
        f"wgrumus shaders not found next to {_PKG}; reinstall with `pip install -e .` or the wheel")


@functools.lru_cache(maxsize=None)
def _read(name: str) -> str:
    return (shader_dir() / name).read_text()


_MARK = re.compile(r"\{\{([A-Z0-9_]+)\}\}")


@dataclass(frozen=True)
class Kernel:
    family: str  # file name without .wgsl
    entry: str = "main"
    defines: tuple = ()  # sorted (name, value) pairs

    @staticmethod
    def of(family: str, entry: str = "main", **defines) -> "Kernel":
        return Kernel(family, entry, tuple(sorted((k, str(v)) for k, v in defines.items())))

    @property
    def key(self) -> tuple:
        return (self.family, self.entry, self.defines)

    def source(self) -> str:
        return render(self.family, dict(self.defines))


@functools.lru_cache(maxsize=512)
def _render_cached(family: str, defines: tuple) -> str:
    d = dict(defines)
    body = _read("common.wgsl") + "\n" + _read(family + ".wgsl")
    if d.get("F16") == "1":  # the enable directive must precede every declaration
        body = "enable f16;\n" + body

    def sub(m):
        name = m.group(1)
        if name not in d:
            raise KeyError(f"shader {family}.wgsl needs define {name}")
        return d[name]

    # Defines may contain markers themselves (e.g. an expression using {{T}}): substitute twice.
    return _MARK.sub(sub, _MARK.sub(sub, body))


def render(family: str, defines: dict) -> str:
    return _render_cached(family, tuple(sorted(defines.items())))
