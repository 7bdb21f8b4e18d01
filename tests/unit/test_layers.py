"""The layering of docs/ARCHITECTURE.md, checked on the code's own imports: every import
(module level or inside a function) goes to a lower layer or stays inside its own package,
so no package imports one that imports it back."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# package prefix -> layer; a package may import its own modules and lower layers only.
LAYERS = [
    ("native", 0),
    ("determinizer", 1),
    ("llft.protocol", 1),
    ("membership", 2),
    ("llft.replica", 3),
    ("llft.sim", 4),
    ("llft.runtime", 4),
    ("llft.tools", 5),
    ("llft.spark", 6),
    ("llft.demos", 7),
    ("llft.bench", 7),
    ("llft.cli", 8),
    ("llft.__main__", 9),
    ("llft", 0),          # llft/__init__.py (constants), llft/lifetime.py (prctl)
]
OURS = ("native", "determinizer", "membership", "llft")


def layer_of(module: str) -> tuple[str, int]:
    for prefix, rank in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    raise AssertionError(f"{module}: in no layer of {LAYERS}")


def modules():
    for top in OURS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py") and f != "shm_build.py":   # the cffi build script
                    rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3]
                    name = rel.replace(os.sep, ".").removesuffix(".__init__")
                    yield name, os.path.join(dirpath, f)


def imported(path: str, module: str):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                # `from llft import keys` imports llft.keys when keys is a module
                sub = f"{node.module}.{a.name}"
                yield node.lineno, sub if os.path.exists(
                    os.path.join(ROOT, *sub.split("."))) or os.path.exists(
                    os.path.join(ROOT, *sub.split(".")) + ".py") else node.module


def test_imports_only_go_down():
    bad = []
    for module, path in modules():
        mine, rank = layer_of(module)
        for line, target in imported(path, module):
            if target.split(".")[0] not in OURS:
                continue
            theirs, their_rank = layer_of(target)
            if theirs != mine and their_rank >= rank:
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} ({mine}, layer {rank}) imports "
                           f"{target} ({theirs}, layer {their_rank})")
    assert not bad, "imports that go up or sideways:\n" + "\n".join(bad)


def test_every_package_is_in_a_layer():
    for module, _ in modules():
        layer_of(module)
