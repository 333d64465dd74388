"""Data flows one way: no module of wgrumus imports (at module level or inside a function) a
module of a higher layer, and no modules import each other in a loop when the package loads
(in the packages of NO_LAZY_CYCLES, not even through imports inside functions). The layers are
plain data below; a module belongs to the layer of the longest prefix of its dotted name that
the table lists."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "wgrumus"

LAYERS = {
    "wgrumus._deps": 0, "wgrumus.runtime": 0,
    "wgrumus.autograd.tape": 1, "wgrumus.autograd.store": 1,
    "wgrumus.tensor": 2,
    # the autograd engine uses Tensor (only through its methods); kernels take buffer views
    # (runtime/buffer_view.py) and import no Tensor (test_kernels_take_views_not_tensors)
    "wgrumus.kernels": 3, "wgrumus.autograd": 3,
    "wgrumus.ops": 4,
    # ops defined by other ops (tensor-level; PyTorch's functional forms are in nn.functional)
    "wgrumus.composite": 5,
    "wgrumus.jit": 6, "wgrumus.amp": 6, "wgrumus.nn": 6, "wgrumus.optim": 6, "wgrumus.io": 6,
    "wgrumus.data": 6, "wgrumus.utils": 6,
    "wgrumus.distributed": 7, "wgrumus.parallel": 7,
    "wgrumus.cli": 8, "wgrumus.__main__": 8,
    "wgrumus": 8,  # the package face (import wgrumus as wr) re-exports layers 0-7 for the cli
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


def imports(path: pathlib.Path, top_only: bool = False):
    """Every wgrumus module ``path`` imports, anywhere in the file (``top_only``: as it loads,
    outside functions)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    for node in _top_level(tree) if top_only else ast.walk(tree):
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


def _top_level(tree):
    """The statements run as a module loads: all but those inside functions."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def import_cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                found.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


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


def test_no_import_cycle():
    """No modules import each other in a loop as the package loads (a loop makes the import
    order matter and hides which module builds on which)."""
    graph = {}
    for path in ROOT.rglob("*.py"):
        me = module_name(path)
        graph[me] = {t for t in imports(path, top_only=True) if t != me}
    cycles = import_cycles(graph)
    assert not cycles, "modules importing each other in a loop (move what both need into a " \
                       "module below them):\n" + "\n".join("  " + " <-> ".join(c) for c in cycles)


# what kernels/ never imports: it launches on buffer views, and a Tensor passes as one
KERNELS_NEVER_IMPORT = ("wgrumus.tensor", "wgrumus.autograd", "wgrumus.ops")


def kernel_imports_of_tensors(paths) -> list:
    """(module, import) for each import of Tensor, autograd or an op in ``paths``."""
    return [(module_name(p), t) for p in paths for t in imports(p)
            if any(t == b or t.startswith(b + ".") for b in KERNELS_NEVER_IMPORT)]


def test_kernels_take_views_not_tensors():
    """kernels/ imports nothing from tensor, autograd or ops (anywhere in a file): outputs and
    scratch are buffer views the caller allocated or runtime Views, so the kernels stay usable
    on any buffer and the layers above keep Tensor's meaning to themselves."""
    found = kernel_imports_of_tensors(sorted((ROOT / "kernels").rglob("*.py")))
    assert not found, "kernels importing Tensor, autograd or ops (take a BufferView, let the " \
        "caller allocate the outputs, allocate scratch as runtime.buffer_view.View):\n" + \
        "\n".join(f"  {a} imports {b}" for a, b in found)


@pytest.mark.parametrize("source, bad", [
    ("from ..tensor import Tensor", True),
    ("from ..tensor import float32", True),
    ("def f():\n    from ..ops.shape import reshape  # lazily\n", True),
    ("from ..autograd.tape import no_grad", True),
    ("from ..runtime.buffer_view import View, float32", False),
    ("from .map import run_map", False),
])
def test_kernel_import_check_finds_tensors(monkeypatch, source, bad):
    """The kernels check flags Tensor, autograd and ops imports (as if in kernels/rows.py)."""
    monkeypatch.setattr(pathlib.Path, "read_text", lambda self: source)
    assert bool(kernel_imports_of_tensors([ROOT / "kernels" / "rows.py"])) == bad


# Packages in which no modules import each other in a loop even through imports inside functions
# (such a loop still makes which module builds on which unclear, and only works by import order).
NO_LAZY_CYCLES = ("wgrumus.cli",)


def package_graph(package: str) -> dict:
    """Module -> the modules of ``package`` it imports, inside functions too."""
    folder = ROOT.parent.joinpath(*package.split("."))
    graph = {}
    for path in folder.rglob("*.py"):
        me = module_name(path)
        graph[me] = {t for t in imports(path) if t != me and
                     (t == package or t.startswith(package + "."))}
    return graph


@pytest.mark.parametrize("package", NO_LAZY_CYCLES)
def test_no_import_cycle_through_function_imports(package):
    cycles = import_cycles(package_graph(package))
    assert not cycles, f"modules of {package} importing each other in a loop (counting imports " \
                       "inside functions; move what both need into the module that owns it):\n" \
                       + "\n".join("  " + " <-> ".join(c) for c in cycles)


def test_function_import_cycle_is_found():
    """The cli's graph holds its function-level imports: a loop through one is reported."""
    graph = package_graph("wgrumus.cli")
    assert "wgrumus.cli.trainers" in graph["wgrumus.cli.loop"]  # imported inside train()
    graph["wgrumus.cli.trainers"] = graph["wgrumus.cli.trainers"] | {"wgrumus.cli.loop"}
    assert ["wgrumus.cli.loop", "wgrumus.cli.trainers"] in import_cycles(graph)


def function_imports(folder: str) -> list:
    """(file, line number, line) of every import inside a function under wgrumus/``folder``."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        lines = path.read_text().splitlines()
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [(path.relative_to(ROOT), node.lineno, lines[node.lineno - 1])
                          for node in ast.walk(fn)
                          if isinstance(node, (ast.Import, ast.ImportFrom))]
    return sorted(set(found))


def test_cli_imports_inside_functions_say_why():
    """The cli imports at module level; an import left inside a function (an optional
    dependency, or a heavy layer that `--help` does not need) says why on its line."""
    unexplained = [f"{p}:{n}: {line.strip()}" for p, n, line in function_imports("cli")
                   if "#" not in line]
    assert not unexplained, "imports inside functions without a reason:\n  " + \
        "\n  ".join(unexplained)


def test_cycle_finder_finds_loops():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


# Modules of ops defined by other ops: the composite layer and nn.functional's compositions
# (its face, nn/functional/__init__.py, also names ops and updates batch_norm's running stats)
COMPOSITIONS = sorted(p for p in [*(ROOT / "composite").rglob("*.py"),
                                  *(ROOT / "nn" / "functional").glob("*.py")]
                      if p.name != "__init__.py" or p.parent.name == "composite")
# what only a primitive may import: an autograd node of its own, a derivative expression for the
# map kernel, a kernel launch (broadcast_shapes is a shape rule, not a launch)
PRIMITIVE_ONLY = {"wgrumus.autograd.tape": {"record", "needs_grad"},
                  "wgrumus.ops.activations": {"unary_map"},
                  "wgrumus.kernels": None}  # None: every name
SHAPE_RULES = {("wgrumus.kernels.map", "broadcast_shapes")}


def primitive_imports(path: pathlib.Path):
    """(module, name) pairs ``path`` imports that only a primitive op may use."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] \
                if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            pairs = [(target, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            pairs = [(a.name, "*") for a in node.names]
        else:
            continue
        for mod, name in pairs:
            for prefix, names in PRIMITIVE_ONLY.items():
                hit = mod == prefix or mod.startswith(prefix + ".") or \
                    f"{mod}.{name}".startswith(prefix + ".") or f"{mod}.{name}" == prefix
                if hit and (names is None or name in names) and (mod, name) not in SHAPE_RULES:
                    yield mod, name


def test_compositions_define_no_kernel_or_gradient():
    """An op outside ops/ is defined by other ops: it records no autograd node, writes no
    derivative and launches no kernel of its own (those make it a primitive, which belongs in
    ops/), so its gradient comes from the parts."""
    assert len(COMPOSITIONS) >= 10
    found = [(str(p.relative_to(ROOT)), m, n) for p in COMPOSITIONS
             for m, n in primitive_imports(p)]
    assert not found, "compositions importing what only a primitive op uses (move the op to " \
                      "ops/):\n" + "\n".join(f"  {p}: {m} {n}" for p, m, n in found)


def test_primitive_import_finder_finds_them(monkeypatch):
    path = ROOT / "composite" / "repeat.py"
    for source, found in [("from ..autograd.tape import record, no_grad",
                           [("wgrumus.autograd.tape", "record")]),
                          ("from ..kernels import rows", [("wgrumus.kernels", "rows")]),
                          ("from ..kernels.map import broadcast_shapes, run_map",
                           [("wgrumus.kernels.map", "run_map")]),
                          ("from ..ops.activations import unary_map, silu",
                           [("wgrumus.ops.activations", "unary_map")]),
                          ("from ..ops.elementwise import map_op, where", [])]:
        monkeypatch.setattr(pathlib.Path, "read_text", lambda self, s=source: s)
        assert list(primitive_imports(path)) == found, source


LAZY_IMPORTS_MAX = 5  # imports inside functions in ops/ and kernels/, each with its reason


def test_few_lazy_imports_in_ops_and_kernels():
    """ops/ and kernels/ import at module level; an import inside a function (at most
    LAZY_IMPORTS_MAX) says why on its line."""
    lazy = function_imports("ops") + function_imports("kernels")
    assert len(lazy) <= LAZY_IMPORTS_MAX, f"{len(lazy)} imports inside functions:\n" + \
        "\n".join(f"  {p}:{n}: {line.strip()}" for p, n, line in lazy)
    unexplained = [(p, n) for p, n, line in lazy if "#" not in line]
    assert not unexplained, f"imports inside functions without a reason: {unexplained}"


@pytest.mark.parametrize("source, expected", [
    ("from ..ops import losses", {"wgrumus.ops.losses"}),
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
