"""Every Kina pass, through `kinac opt`, on odd and mutated IR: no internal errors.

The inputs are the pass tests' own files (tests/passes/*.mlir) and small odd
modules (an empty module, scalars, dynamic and unranked shapes, unknown ops, a
declaration, several blocks), each also mutated: static dims made dynamic, f32
made f16, f64 or i32, identity layouts made strided. A run may succeed (exit 0)
or refuse its input with a diagnostic at an op (exit 1, `FILE:LINE:COL: error:
PASS: ...`); an input that does not parse is exit 1 too. What must never happen is
exit 2 (a pass that raised, or left invalid IR) or a traceback. The last test runs
the build's whole chain of passes on each example's reference IR and its mutants.
"""
from __future__ import annotations

import random
import re

import pytest

from kina.driver import cli
from kina.ir.passes import PASSES

from conftest import ROOT

KINA_PASSES = [p.name for p in PASSES if p.kind == "kina"]

ODD = {
    "empty": "module {}\n",
    "scalars": "func.func @f(%x: f32, %y: i32) -> f32 {\n  %e = math.exp %x : f32\n  return %e : f32\n}\n",
    "dynamic": ("func.func @f(%x: tensor<?x?xf32>) -> tensor<?x?xf32> {\n"
                "  %e = math.exp %x : tensor<?x?xf32>\n  return %e : tensor<?x?xf32>\n}\n"),
    "unranked": "func.func @f(%x: tensor<*xf32>) -> tensor<*xf32> {\n  return %x : tensor<*xf32>\n}\n",
    "unknown-op": ('func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n'
                   '  %y = "mystery.op"(%x) : (tensor<4xf32>) -> tensor<4xf32>\n  return %y : tensor<4xf32>\n}\n'),
    "declaration": "func.func private @g(tensor<4xf32>) -> tensor<4xf32>\n",
    "blocks": ("func.func @f(%x: tensor<4xf32>, %c: i1) -> tensor<4xf32> {\n  cf.cond_br %c, ^a, ^b\n"
               "^a:\n  return %x : tensor<4xf32>\n^b:\n  return %x : tensor<4xf32>\n}\n"),
    "vector-exp": "func.func @f(%x: vector<4xf32>) -> vector<4xf32> {\n  %e = math.exp %x : vector<4xf32>\n"
                  "  return %e : vector<4xf32>\n}\n",
    "no-func": '"mystery.op"() : () -> ()\n',
    "memref-copy-mixed": ("func.func @f(%a: memref<?xf32>, %b: memref<4xf32, strided<[2]>>) {\n"
                          "  memref.copy %a, %b : memref<?xf32> to memref<4xf32, strided<[2]>>\n  return\n}\n"),
}


def _mutants(name: str, text: str, rng: random.Random) -> list[tuple[str, str]]:
    """`text` and mutants of it: dims made dynamic, element types changed, layouts strided."""
    out = [(name, text)]
    dims = list(re.finditer(r"(?<=[<x])\d+(?=x)", text))
    if dims:
        out.append((f"{name}/dyn", re.sub(r"(?<=[<x])\d+(?=x)", "?", text)))
        pick = rng.sample(dims, min(3, len(dims)))
        mutated = text
        for m in sorted(pick, key=lambda m: -m.start()):
            mutated = mutated[:m.start()] + "?" + mutated[m.end():]
        out.append((f"{name}/some-dyn", mutated))
    for dtype in ("f16", "f64", "i32"):
        if "f32" in text:
            out.append((f"{name}/{dtype}", text.replace("f32", dtype)))
    if "xf32>" in text:
        out.append((f"{name}/strided", re.sub(r"memref<(\d+)xf32>", r"memref<\1xf32, strided<[3]>>", text)))
    return out


def _cases() -> list[tuple[str, str]]:
    rng = random.Random(0)
    cases = []
    for path in sorted((ROOT / "tests" / "passes").glob("*.mlir")):
        cases += _mutants(path.stem, path.read_text(), rng)
    for name, text in ODD.items():
        cases += _mutants(name, text, rng)
    return cases


CASES = _cases()


@pytest.mark.parametrize("pass_name", KINA_PASSES)
def test_no_internal_errors(pass_name, tmp_path, capsys):
    internal, refused, ran = [], 0, 0
    for i, (name, text) in enumerate(CASES):
        path = tmp_path / f"{i:03d}.mlir"
        path.write_text(text)
        status = cli.main(["opt", str(path), "--passes", pass_name, "--allow-unregistered-dialect",
                           "--split-input-file"])
        out = capsys.readouterr()
        if status not in (0, 1) or "Traceback" in out.err or "internal compiler error" in out.err:
            internal.append(f"{name} (exit {status}): {out.err.strip()[:400]}")
        elif status == 1 and re.search(rf"^\S+:\d+:\d+: error: {pass_name}: ", out.err, re.M):
            refused += 1
        ran += status == 0
    assert not internal, f"{pass_name}: {len(internal)} internal errors of {len(CASES)} inputs:\n" + "\n".join(internal)
    assert ran >= 10, f"{pass_name}: only {ran} of {len(CASES)} inputs ran: the fuzz is not reaching the pass"


def _reference_irs() -> list[tuple[str, str]]:
    """Each example's reference IR as `kinac --emit mlir` prints it, and its mutants."""
    from kina.driver import pipeline
    from kina.ir.irbuild import print_ir
    rng = random.Random(1)
    cases = []
    for path in sorted((ROOT / "examples").glob("*.kina")):
        b = pipeline.run_stages(path.read_text(), path.name, "mlir")
        cases += _mutants(path.stem, print_ir(b.module), rng)
    return cases


def test_the_whole_chain_on_mutated_reference_ir(tmp_path, capsys):
    """The build's own order of passes, Kina's and upstream, on each example's
    reference IR and its mutants (dims made dynamic, other element types): each
    runs or is refused at an op; no pass raises or leaves invalid IR."""
    names = [p.name for p in PASSES]
    chain = ",".join(names[:names.index("fence-nontemporal") + 1])
    cases = _reference_irs()
    internal, ran = [], 0
    for i, (name, text) in enumerate(cases):
        path = tmp_path / f"{i:03d}.mlir"
        path.write_text(text)
        status = cli.main(["opt", str(path), "--passes", chain])
        out = capsys.readouterr()
        if status not in (0, 1) or "Traceback" in out.err or "internal compiler error" in out.err:
            internal.append(f"{name} (exit {status}): {out.err.strip()[:600]}")
        ran += status == 0
    assert not internal, f"{len(internal)} internal errors of {len(cases)} inputs:\n" + "\n".join(internal)
    assert ran >= len(cases) // 3, f"only {ran} of {len(cases)} ran the whole chain"  # i32 mutants do not parse
