"""WGSL sources: a kernel is (family file, entry point, defines), the file prefixed with
``common.wgsl`` and its ``{{NAME}}`` markers replaced by the defines (Kernel: frozen, hashable).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

_PKG = Path(__file__).resolve().parent.parent


@functools.cache
def shader_dir() -> Path:
    # Installed wheel: wgrumus/shaders; editable / source checkout: <repo>/shaders.
    for cand in (_PKG / "shaders", _PKG.parent / "shaders"):
        if (cand / "common.wgsl").is_file():
            return cand
    raise FileNotFoundError(
        f"wgrumus shaders not found next to {_PKG}; reinstall with `pip install -e .` or the wheel")


@functools.cache
def _read(name: str) -> str:
    return (shader_dir() / name).read_text()


_MARK = re.compile(r"\{\{([A-Z0-9_]+)\}\}")


@dataclass(frozen=True)
class Kernel:
    family: str  # file name without .wgsl
    entry: str = "main"
    defines: tuple = ()  # sorted (name, value) pairs

    @staticmethod
    def of(family: str, entry: str = "main", **defines) -> Kernel:
        return Kernel(family, entry, tuple(sorted((k, str(v)) for k, v in defines.items())))

    def source(self) -> str:
        return _render(self.family, self.defines)


@functools.lru_cache(maxsize=512)
def _render(family: str, defines: tuple) -> str:
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


@functools.cache
def multi_tensor_decls(k: int, binding: int, arrays: str) -> str:
    """The bindings of k tensors' f32 arrays (``arrays``: "NAME:access ...", bound in order
    from ``binding``; tensor j's array NAME is NAMEj)."""
    return "\n".join(f"@group(0) @binding({binding + i}) var<storage, {access}> {name}{j}: "
                     "array<f32>;" for i, (j, (name, access)) in enumerate(
                         (j, spec.split(":")) for j in range(k) for spec in arrays.split()))


@functools.cache
def multi_tensor_kernel(family: str, k: int, binding: int, arrays: str, branch: str,
                        **defines) -> Kernel:
    """``family`` for k tensors in one dispatch over their concatenated elements: a ``branch``
    per tensor ({j}: its number, e: its element; ``end_(j)``: the cumulative count)."""
    body = []
    for j in range(k):
        start = "0u" if j == 0 else f"end_({j - 1}u)"
        body.append(f"    if (i < end_({j}u)) {{\n        let e = i - {start};\n"
                    f"{branch.format(j=j)}\n        return;\n    }}")
    return Kernel.of(family, DECLS=multi_tensor_decls(k, binding, arrays), BODY="\n".join(body),
                     **defines)
