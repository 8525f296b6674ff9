"""Build speed: a large module's LLVM IR in parts by function (kina.driver.llvm_parts), whose opt and llc
run at once, and passes for a type the program does not use left out."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from kina import knobs
from kina.driver import llvm_parts, pipeline, toolchain
from kina.errors import ToolError
from kina.ir.passes import UpstreamPass
from kina.runtime import load

# three functions, one with a threaded entry (a matmul of 256 KiB of weights): small, but split
# into parts when MIN_BYTES is 0
SOURCE = """
let mm = fn(x: tensor<F32, [1, 1, 256], @host>, w: tensor<F32, [256, 256], @host>) -> (tensor<F32, [1, 1, 256], @host>) {
  (x @ w)
}
let add = fn(a: tensor<F32, [4, 8], @host>, b: tensor<F32, [4, 8], @host>) -> (tensor<F32, [4, 8], @host>) {
  (a + b)
}
let scaled = fn(a: tensor<F32, [4, 8], @host>, s: tensor<F32, [1, 1], @host>) -> (tensor<F32, [4, 8], @host>) {
  (a * broadcast(s))
}
"""


@pytest.fixture
def always_split(monkeypatch):
    monkeypatch.setattr(llvm_parts, "MIN_BYTES", 0)


def _defined(text: bytes) -> list[str]:
    return re.findall(r"^define [^@]*@([\w.$-]+)\(", text.decode(), re.M)


def test_each_function_is_defined_in_one_part_and_declared_in_the_others(always_split):
    b = pipeline.run_stages(SOURCE, "parts.kina", "team-entries")
    from kina.driver import translate
    raw = translate.to_llvm_ir(b.module, Path("unused.mlir"))
    parts = llvm_parts.split(raw)
    assert parts is not None and 2 <= len(parts) <= llvm_parts.MAX_PARTS
    everywhere = sorted(_defined(raw))
    assert sorted(n for p in parts for n in _defined(p)) == everywhere
    for p in parts:
        declared = set(re.findall(r"^declare [^@]*@([\w.$-]+)\(", p.decode(), re.M))
        assert set(everywhere) - set(_defined(p)) <= declared
    # a C-interface wrapper goes with the function it calls
    for p in parts:
        for name in _defined(p):
            if name.startswith("_mlir_ciface_"):
                assert name[len("_mlir_ciface_"):] in _defined(p)
    assert llvm_parts.split(raw) == parts  # the same text, the same parts


def test_what_is_not_split():
    assert llvm_parts.split(b"; small\n") is None  # under MIN_BYTES
    big = b"x" * llvm_parts.MIN_BYTES
    one = b"define void @f() {\n  ret void\n}\n" + b"; " + big + b"\n"
    assert llvm_parts.split(one) is None  # one function
    two = one + b"define void @g() {\n  ret void\n}\n"
    assert llvm_parts.split(two) is not None
    assert llvm_parts.split(b"@state = global i64 0\n" + two) is None  # a global that two parts cannot both hold
    assert llvm_parts.split(b"@c = private unnamed_addr constant [1 x i8] c\"a\"\n" + two) is not None
    assert llvm_parts.split(two.replace(b"define void @g", b"define internal void @g")) is None


def test_a_split_build_computes_what_a_whole_one_does_and_its_bytes_do_not_depend_on_the_jobs(
        always_split, monkeypatch):
    whole = pipeline.run_stages(SOURCE, "parts.kina", "so")
    monkeypatch.setattr(llvm_parts, "MIN_BYTES", 0)
    sos = []
    for jobs in ("1", "2", "3"):
        with knobs.scoped(KINA_BUILD_JOBS=jobs):
            b = pipeline.run_stages(SOURCE, "parts.kina", "so")
        assert b.llvm_ir.startswith(b"; part 1 of ")
        sos.append(b.so_path.read_bytes())
    assert sos[0] == sos[1] == sos[2]
    monkeypatch.setattr(llvm_parts, "MIN_BYTES", 1 << 40)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 1, 256), np.float32), rng.standard_normal((256, 256), np.float32)
    a, c = rng.standard_normal((4, 8), np.float32), rng.standard_normal((4, 8), np.float32)
    s = np.full((1, 1), 3.0, np.float32)
    got = []
    for so in (whole.so_path, b.so_path):
        mod = load(so)
        got.append([mod.mm(x, w, threads=1)[0], mod.mm(x, w, threads=2)[0], mod.add(a, c)[0], mod.scaled(a, s)[0]])
    for u, v in zip(*got):
        assert np.array_equal(u, v)
    for b_ in (whole, b):
        pipeline.remove_temporary(b_.workdir)


def test_a_part_whose_tool_fails_is_a_tool_error_naming_its_files(always_split, monkeypatch, tmp_path):
    """The failing part's command reruns it by hand: its input file is kept, the others' are not."""
    fake = tmp_path / "fake-llc"
    fake.write_text("#!/bin/sh\necho 'fake-llc: no' >&2\nexit 1\n")
    fake.chmod(0o755)
    toolchain.host(), toolchain.llvm_version()  # cached from the real llc, which they ask
    real = toolchain.find
    monkeypatch.setattr(toolchain, "find", lambda tool: str(fake) if tool == "llc" else real(tool))
    with pytest.raises(ToolError) as e:
        pipeline.run_stages(SOURCE, "parts.kina", "so")
    assert "fake-llc: no" in str(e.value) and "-relocation-model=pic" in str(e.value)
    words = shlex.split(e.value.command)
    ll = Path(next(w for w in words if w.endswith(".ll")))
    assert re.fullmatch(r"opt\.part\d+\.ll", ll.name) and ll.read_bytes().startswith(b"; ModuleID")
    assert sorted(p.name for p in ll.parent.iterdir()) == [ll.name]
    pipeline.remove_temporary(ll.parent)


def test_a_pass_only_for_a_type_the_program_does_not_use_is_not_run(monkeypatch):
    """emulate-bf16 is skipped (its type asked of the small reference IR, not of the loops'
    module) for an F32 program, and runs for a BF16 one."""
    ran = []
    real = UpstreamPass.apply
    monkeypatch.setattr(UpstreamPass, "apply", lambda self, *a, **k: (ran.append(self.name), real(self, *a, **k))[1])
    pipeline.run_stages(SOURCE, "parts.kina", "to-llvm")
    assert "deallocate" in ran and "emulate-bf16" not in ran
    ran.clear()
    pipeline.run_stages(SOURCE.replace("F32", "BF16"), "parts.kina", "to-llvm")
    assert "emulate-bf16" in ran


@pytest.mark.parametrize("level, want", [(3, {("opt", "-O2"), ("llc", "-O1")}), (1, {("opt", "-O1"), ("llc", "-O1")})])
def test_parts_are_compiled_at_the_cheaper_llvm_levels(always_split, monkeypatch, level, want):
    seen = []
    real = toolchain.Chains
    monkeypatch.setattr(toolchain, "Chains", lambda chains, *a: (seen.extend(chains), real(chains, *a))[1])
    b = pipeline.run_stages(SOURCE, "parts.kina", "so", pipeline.Options(opt_level=level))
    assert seen and {(tool, args[0]) for chain in seen for tool, args in chain} == want
    pipeline.remove_temporary(b.workdir)


def test_a_threaded_model_kernel_keeps_no_plain_copy_of_its_functions(monkeypatch):
    """A model large enough to run on threads builds its kernel with threads{copy=false} (half
    the code to compile); a small one splits no symbolic op, so it has no threaded entry to call."""
    import kina
    from kina.models import kernels
    monkeypatch.setattr(kina, "compile_file", lambda kernel, options, **kw: options.pass_options)
    build = kernels.program.__wrapped__
    assert build(Path("k.kina"), (), (), fma=True, threaded=True).split(",")[-1] == "threads{copy=false}"
    assert build(Path("k.kina"), (), (), threaded=False) == "threads{symbolic=false}"
