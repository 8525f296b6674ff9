"""The package walls and the import graph.

The front end (`kina.frontend`) never imports `mlir`, and the runtime (`kina.runtime`)
imports neither `mlir` nor `lark`: each is imported here, module by module, in a fresh
interpreter in which those packages cannot be found. A process whose builds are all
compile-cache hits (a model loaded by `kina generate`, a program compiled again) imports
neither either. And no module of `kina` takes part in an import cycle (module-level
imports, the ones that run at import time).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "kina"


def modules(package: str) -> list[str]:
    """Every module of `package` (a dotted name under src/), the package itself first."""
    root = SRC.joinpath(*package.split("."))
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return sorted(names, key=lambda n: (n != package, n))


BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is blocked by test_layout", name=name)
        return None
sys.meta_path.insert(0, Block())
for m in MODULES:
    __import__(m)
print("imported", len(MODULES))
"""


def import_blocked(names: list[str], blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    code = f"BLOCKED = {blocked!r}\nMODULES = {names!r}\n" + BLOCKER
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


@pytest.mark.parametrize("package,blocked", [
    ("kina.frontend", ("mlir",)),
    ("kina.runtime", ("mlir", "lark")),
])
def test_package_wall(package, blocked):
    names = modules(package)
    assert len(names) > 3, names
    proc = import_blocked(names, blocked)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"imported {len(names)}"


def test_the_blocker_blocks():
    """The wall test can fail: a module that does import mlir is caught."""
    proc = import_blocked(["kina.ir.lower"], ("mlir",))
    assert proc.returncode != 0 and "blocked by test_layout" in proc.stderr


def import_graph() -> dict[str, set[str]]:
    """module -> the kina modules it imports at module level (not inside functions)."""
    known = set(modules("kina"))
    graph: dict[str, set[str]] = {}
    for name in known:
        path = SRC.joinpath(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text())
        edges: set[str] = set()
        for node in tree.body:  # module level only; `if`/`try` blocks at module level too
            for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
                if isinstance(sub, ast.Import):
                    edges.update(a.name for a in sub.names if a.name in known)
                elif isinstance(sub, ast.ImportFrom):
                    if sub.level:
                        base = name.split(".") if is_package else name.split(".")[:-1]
                        base = base[:len(base) - (sub.level - 1)]
                        target = ".".join(base + ([sub.module] if sub.module else []))
                    else:
                        target = sub.module or ""
                    for a in sub.names:
                        child = f"{target}.{a.name}"
                        edges.add(child if child in known else target)
        graph[name] = {e for e in edges if e in known and e != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_no_import_cycle_inside_kina():
    graph = import_graph()
    assert "kina.frontend.check" in graph and "kina.frontend.ast" in graph["kina.frontend.check"]
    assert cycles(graph) == []


def test_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_readme_map_matches_the_tree():
    """Every package and module the README's map names exists, and every package is in it."""
    readme = (PACKAGE.parent.parent / "README.md").read_text()
    start = readme.index("## Where things are")
    section = readme[start:readme.index("\n## ", start + 1)]
    for pkg in sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        assert f"{pkg.name}/" in section, f"README's map lacks {pkg.name}/"
    import re
    for path in re.findall(r"`(kina/[A-Za-z_/]+(?:\.py|\.lark|/))`", section):
        assert (SRC / path).exists(), f"README's map names {path}, which does not exist"


def test_the_models_never_import_the_apps():
    """kina.apps (the commands and the server) sits on kina.models, never the other way round, and
    only its server module imports the HTTP stack, inside its functions."""
    graph = import_graph()
    assert any(e.startswith("kina.models") for e in graph["kina.apps.decoding"])
    assert [(m, e) for m, edges in graph.items() if not m.startswith("kina.apps") for e in edges
            if e.startswith("kina.apps")] == []
    proc = import_blocked([m for m in modules("kina.apps") if not m.endswith("__main__")], ("starlette", "uvicorn"))
    assert proc.returncode == 0, proc.stderr


CACHE_HIT = """
import sys
if BLOCK:  # an import of either fails, where it happens (finding where mlir's tools are is no import)
    def refuse(event, args):
        if event == "import" and args[0].split(".")[0] in ("mlir", "lark"):
            raise ImportError(f"{args[0]} is imported on a cache hit")
    sys.addaudithook(refuse)
from kina.apps.cli import main
from kina.driver.options import Options
import kina
code = main(["generate", MODEL, "--prompt-ids", "1,2,3", "-n", "2", "--json"])
assert code == 0, code
f = kina.compile_source(SOURCE, "twice.kina", Options(pass_options="matmul-loops{fma=true}")).f
print("heavy:", sorted(m for m in ("mlir", "lark", "ml_dtypes") if m in sys.modules))  # (ml_dtypes: ~0.6 s, only for BF16)
"""
TWICE = "let f = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {\n  (a + a)\n}\n"


def test_a_cache_hit_imports_neither_mlir_nor_lark(tmp_path):
    """Once a model's layers and a program are built, a new process that loads the model (`kina
    generate` on a quantized GGUF file: its pass options, its kernel's parameters, its builds) and
    compiles the same program takes everything from the compile cache without loading the
    compiler: an import of `mlir` or `lark` fails there, and neither is loaded at the end (nor
    `ml_dtypes`, which an F32 model never needs)."""
    gguf_files = pytest.importorskip("gguf_files")
    rng = np.random.default_rng(0)
    D, F, V, L = 64, 128, 256, 2
    tensors = {"model.embed_tokens.weight": rng.standard_normal((V, D)), "model.norm.weight": 1 + rng.random(D)}
    for i in range(L):
        for name, shape in [("self_attn.q_proj", (D, D)), ("self_attn.k_proj", (D // 2, D)),
                            ("self_attn.v_proj", (D // 2, D)), ("self_attn.o_proj", (D, D)),
                            ("mlp.gate_proj", (F, D)), ("mlp.up_proj", (F, D)), ("mlp.down_proj", (D, F))]:
            tensors[f"model.layers.{i}.{name}.weight"] = 0.1 * rng.standard_normal(shape)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{norm}.weight"] = 1 + 0.1 * rng.random(D)
    config = dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=True)
    model = tmp_path / "tiny.gguf"
    gguf_files.write(model, tensors, config, "Q4_1", embed_type="Q8_0")
    code = f"MODEL = {str(model)!r}\nSOURCE = {TWICE!r}\n" + CACHE_HIT
    first = subprocess.run([sys.executable, "-c", "BLOCK = False\n" + code], capture_output=True, text=True)
    assert first.returncode == 0, first.stderr  # built, or taken from the cache
    again = subprocess.run([sys.executable, "-c", "BLOCK = True\n" + code], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().endswith("heavy: []"), again.stdout
