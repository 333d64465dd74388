"""Data flows one way: no module of wgrumus imports (at module level or inside a function) a
module of a higher layer. The layers are plain data below; a module belongs to the layer of the
longest prefix of its dotted name that the table lists."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "wgrumus"

LAYERS = {
    "wgrumus._deps": 0, "wgrumus.runtime": 0,
    "wgrumus.autograd.tape": 1, "wgrumus.autograd.store": 1,
    "wgrumus.tensor": 2,
    # the engine seeds backward with ops.creation.full, so it (and the package face that
    # re-exports it) sits with ops
    "wgrumus.ops": 3, "wgrumus.autograd": 3,
    "wgrumus.jit": 4, "wgrumus.amp": 4, "wgrumus.nn": 4, "wgrumus.optim": 4, "wgrumus.io": 4,
    "wgrumus.data": 4, "wgrumus.utils": 4,
    "wgrumus.distributed": 5, "wgrumus.parallel": 5,
    "wgrumus.cli": 6, "wgrumus.__main__": 6,
    "wgrumus": 6,  # the package face (import wgrumus as wr) re-exports layers 0-5 for the cli
}

def layer(module: str) -> int:
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in LAYERS:
            return LAYERS[".".join(parts[:k])]
    raise KeyError(f"{module} is in no layer of LAYERS; add it there")


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def is_module(name: str) -> bool:
    p = ROOT.parent.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports(path: pathlib.Path):
    """Every wgrumus module ``path`` imports, anywhere in the file."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("wgrumus"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("wgrumus"):
                target = node.module
            else:
                continue
            for a in node.names:  # `from . import nn` imports the submodule wgrumus.nn
                sub = f"{target}.{a.name}"
                yield sub if is_module(sub) else target


def upward_imports():
    found = set()
    for path in sorted(ROOT.rglob("*.py")):
        me = module_name(path)
        for target in imports(path):
            if layer(target) > layer(me):
                found.add((me, target))
    return found


def test_every_module_has_a_layer():
    for path in ROOT.rglob("*.py"):
        layer(module_name(path))


def test_no_module_imports_a_higher_layer():
    found = upward_imports()
    new = sorted(found)
    assert not new, "modules importing a higher layer (move the code down, or pass the " \
                    "higher-layer object in from the caller):\n" + "\n".join(
                        f"  {a} (layer {layer(a)}) imports {b} (layer {layer(b)})" for a, b in new)


@pytest.mark.parametrize("source, expected", [
    ("from ..ops import nnops", {"wgrumus.ops.nnops"}),
    ("from .. import nn", {"wgrumus.nn"}),
    ("from ..tensor import Tensor", {"wgrumus.tensor"}),
    ("def f():\n    import wgrumus.cli.main\n", {"wgrumus.cli.main"}),
])
def test_imports_are_resolved(monkeypatch, source, expected):
    """The parser finds relative, absolute and function-level imports (as if in
    wgrumus/nn/functional.py)."""
    path = ROOT / "nn" / "functional.py"
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self: source)
    assert set(imports(path)) == expected


def test_tensor_methods_are_the_declared_table():
    """Every method tensor.py declares is on Tensor, and registering any other set is refused."""
    import wgrumus  # noqa: F401  (ops registers the methods)
    from wgrumus.tensor import METHODS, Tensor, register
    assert all(callable(getattr(Tensor, name, None)) or name == "T" for name in METHODS)
    with pytest.raises(TypeError, match="missing.*backward"):
        register({k: getattr(Tensor, k) for k in METHODS if k != "backward"})
    with pytest.raises(TypeError, match="not in METHODS.*frobnicate"):
        register({**{k: Tensor.__dict__[k] for k in METHODS}, "frobnicate": len})
