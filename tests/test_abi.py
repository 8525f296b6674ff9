"""The ABI's one table (kina/abi.py) against its C header (kina/runtime/kina_abi.h) and the
C runtime (kina/runtime/kina_threads.c): every function the table names is declared in
the header and defined in the C file, every function the C file exports is one of them,
and the header spells the entry-name conventions and the team's size as the table does.
A threaded .so exports them under those names.
"""
from __future__ import annotations

import re
import subprocess

import pytest

from kina import abi
from kina.driver import toolchain

HEADER, SOURCE = abi.HEADER.read_text(), abi.C_SOURCE.read_text()


def strip_comments(c: str) -> str:
    return re.sub(r"/\*.*?\*/", "", c, flags=re.S)


def declared(c: str) -> set[str]:
    """Names of the functions declared at file scope (`type name(...);`), not typedefs."""
    return {m.group(1) for m in re.finditer(r"^(?!typedef)[A-Za-z_][\w ]*?\b(\w+)\([^;{]*\);", strip_comments(c), re.M)}


def defined(c: str, static: bool = False) -> set[str]:
    """Names of the functions defined (`type name(...) {`), static ones only with `static`."""
    found = re.finditer(r"^(static )?[A-Za-z_][\w ]*?\b(\w+)\([^;{]*\)\s*\{", strip_comments(c), re.M)
    return {m.group(2) for m in found if bool(m.group(1)) == static}


def defines(c: str) -> dict[str, str]:
    return dict(re.findall(r"^#define (KINA_\w+) (\S+)", c, re.M))


def test_the_parsers_see_declarations_and_definitions():
    assert declared("int64_t f(int a);\ntypedef void (*g)(void);\nstatic int h(void) { return 0; }") == {"f"}
    assert defined("void f(int a) {\n}\nstatic int h(void) { return 0; }") == {"f"}
    assert defined("static int h(void) { return 0; }", static=True) == {"h"}


def test_the_header_declares_and_the_source_defines_every_runtime_function():
    names = {*abi.ENTRY_CALLS, *abi.HOST_CALLS}
    assert declared(HEADER) == names
    assert defined(SOURCE) == names, "every function kina_threads.c exports is in the table, and only those"
    assert '#include "kina_abi.h"' in SOURCE


def test_the_header_spells_the_names_as_the_table_does():
    macros = defines(HEADER)
    strings = {k: v.strip('"') for k, v in macros.items() if v.startswith('"')}
    assert strings == {"KINA_PREFIX": abi.PREFIX, "KINA_C_INTERFACE": abi.C_INTERFACE,
                       "KINA_SUFFIX_THREADED": abi.THREADED, "KINA_SUFFIX_WORKSPACE": abi.WORKSPACE,
                       "KINA_SUFFIX_COUNTERS": abi.COUNTERS, "KINA_SUFFIX_PACKED": abi.PACKED,
                       "KINA_SUFFIX_TEAM": abi.TEAM}
    assert int(macros["KINA_TEAM_BYTES"]) == abi.TEAM_BYTES


def test_the_header_and_source_compile_cleanly():
    proc = subprocess.run([toolchain.find("cc"), "-fsyntax-only", "-Wall", "-Wextra", "-Werror", str(abi.C_SOURCE)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_names_compose():
    assert abi.c_interface("f") == "_mlir_ciface_kina_f"
    assert abi.c_interface("f", abi.THREADED) == "_mlir_ciface_kina_f_threaded"
    assert abi.exported("f", abi.TEAM) == "kina_f_team"


@pytest.mark.parametrize("source", ["let f = fn(x: tensor<F32, [64, 4096], @host>) -> (tensor<F32, [64, 4096], @host>) "
                                    "{\n  (x + x)\n}\n"])
def test_a_threaded_so_exports_the_table_s_names(source, tmp_path):
    from kina.driver import pipeline
    b = pipeline.run_stages(source, "f.kina")
    symbols = subprocess.run([toolchain.find("llvm-nm"), "-D", "--defined-only", str(b.so_path)],
                             capture_output=True, text=True, check=True).stdout.split()
    want = {*abi.ENTRY_CALLS, *abi.HOST_CALLS, abi.c_interface("f"),
            *(abi.c_interface("f", s) for s in (abi.THREADED, abi.WORKSPACE, abi.COUNTERS)),
            abi.exported("f", abi.PACKED), abi.exported("f", abi.TEAM)}
    assert want <= set(symbols), want - set(symbols)
    pipeline.remove_temporary(b.workdir)
