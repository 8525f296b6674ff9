"""The compile cache hands out only what it checked, and no work folder is left behind.

Each path that can take a .so from the cache (the API, `kinac -o`, `kinac run`,
`kinac bench`) is given a damaged entry (a truncated .so, a sidecar that does not
parse, a sidecar of another size): each must build again, replace the entry with a
whole one and give a good result. A cache folder that cannot be written (here
KINA_CACHE_DIR is a regular file, or a path under one: the tests run as root, for
whom chmod stops no write; and a store that fails, monkeypatched) is skipped with
one warning naming it. With TMPDIR pointed at an empty folder, no `kina-` work
folder is left there on success, on a user's error, on a bad knob or with an
unwritable cache; a failing tool leaves one, holding only the files its repro
command names.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

import kina
from kina import knobs
from kina.driver import cache as compile_cache, pipeline
from kina.driver.cache import CacheWarning

from test_cli import kinac

SOURCE = "let f = fn(a: tensor<F32, [2], @host>) -> (tensor<F32, [2], @host>) {\n  (a + a)\n}\n"


@pytest.fixture
def cache(tmp_path):
    folder = tmp_path / "cache"
    with knobs.scoped(KINA_CACHE_DIR=folder, KINA_NO_CACHE=None):
        yield folder


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "twice.kina"
    path.write_text(SOURCE)
    return path


def the_entry(cache: Path) -> Path:
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    return entry / "twice.so"


def whole(so: Path) -> bool:
    sidecar = json.loads(so.with_suffix(".json").read_text())
    data = so.read_bytes()
    return sidecar["so_size"] == len(data) and sidecar["so_sha256"] == hashlib.sha256(data).hexdigest()


def replace(path: Path, data: bytes):
    """A new file in `path`'s place (not rewritten in place: this process has the .so mapped)."""
    path.with_name("new").write_bytes(data)
    path.with_name("new").replace(path)


def truncate(so: Path):
    replace(so, so.read_bytes()[:100])


def garble_sidecar(so: Path):
    replace(so.with_suffix(".json"), b'{"format": "kina-sidecar-1", "functions": [')


def resize_sidecar(so: Path):  # parses, and the sha256 is right, but the size is not
    sidecar = json.loads(so.with_suffix(".json").read_text())
    replace(so.with_suffix(".json"), json.dumps({**sidecar, "so_size": sidecar["so_size"] + 1}).encode())


DAMAGE = [truncate, garble_sidecar, resize_sidecar]


def damaged_entry(cache: Path, program: Path, damage) -> Path:
    kina.compile_file(program).close()
    so = the_entry(cache)
    assert whole(so) and compile_cache.entry_ok(so, str(program))
    damage(so)
    assert not compile_cache.entry_ok(so, str(program))
    return so


@pytest.mark.parametrize("damage", DAMAGE)
def test_api_rebuilds_a_damaged_entry(cache, program, damage):
    so = damaged_entry(cache, program, damage)
    assert kina.compile_file(program).f(np.ones(2, np.float32))[0].tolist() == [2.0, 2.0]
    assert the_entry(cache) == so and whole(so) and not [p for p in cache.iterdir() if p.name.startswith(".")]


def test_editing_a_used_file_rebuilds(cache, tmp_path):
    # The key covers every file the uses reach, here one used through another: an edit of
    # the inner file must not serve the .so built from its old text.
    (tmp_path / "blocks.kina").write_text('use "inner.kina";\n')
    inner = tmp_path / "inner.kina"
    inner.write_text(SOURCE.replace("let f =", "let double ="))
    main = tmp_path / "main.kina"
    main.write_text('use "blocks.kina";\n' + SOURCE.replace("(a + a)", "(double(a))"))
    one = np.ones(2, np.float32)
    for i, (source_op, want) in enumerate([("(a + a)", 2.0), ("(a * a)", 1.0), ("(a + a)", 2.0)]):
        inner.write_text(SOURCE.replace("let f =", "let double =").replace("(a + a)", source_op))
        assert kina.compile_file(main).f(one)[0].tolist() == [want, want]
        out = tmp_path / f"out{i}.so"  # a new path each time: dlopen would hand back a loaded one
        assert kinac(main, "-o", out).returncode == 0
        assert kina.load(out).f(one)[0].tolist() == [want, want]
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 2  # the third build was a hit


@pytest.mark.parametrize("damage", DAMAGE)
def test_kinac_o_never_copies_a_damaged_entry(cache, program, tmp_path, damage):
    so = damaged_entry(cache, program, damage)
    proc = kinac(program, "-o", tmp_path / "out.so")
    assert proc.returncode == 0, proc.stderr
    assert whole(tmp_path / "out.so") and whole(so)
    assert kina.load(tmp_path / "out.so").f(np.ones(2, np.float32))[0].tolist() == [2.0, 2.0]


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("damage", [truncate, garble_sidecar])
def test_kinac_run_and_bench_rebuild_a_damaged_entry(cache, program, command, damage):
    so = damaged_entry(cache, program, damage)
    proc = kinac(command, program, *(["--repeats", "1"] if command == "bench" else []))
    assert proc.returncode == 0, proc.stderr
    assert ("results agree" if command == "bench" else "result 0: float32 [2]") in proc.stdout
    assert whole(so)


def test_a_replaced_entry_in_the_way_is_kept_when_whole(cache, program):
    """Two builds racing: the entry another process stored first stays."""
    kina.compile_file(program)
    so = the_entry(cache)
    before = so.stat().st_ino
    b = pipeline.run_stages(SOURCE, str(program))
    compile_cache._store(b.so_path, so.parent, str(program))
    compile_cache.discard(b.so_path)
    assert so.stat().st_ino == before and whole(so)


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_unwritable_cache_is_one_warning_not_a_failure(tmp_path, monkeypatch, program, where):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    folder = blocker if where == "file" else blocker / "cache"
    monkeypatch.setattr(compile_cache, "_warned", set())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with knobs.scoped(KINA_CACHE_DIR=folder), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert kina.compile_file(program).f(np.ones(2, np.float32))[0].tolist() == [2.0, 2.0]
    messages = [str(w.message) for w in caught if w.category is CacheWarning]
    assert len(messages) == 1 and f"the compile cache {folder} cannot be written" in messages[0], messages
    assert not list(tmp_path.glob("kina-*"))


def test_a_store_that_fails_is_one_warning(cache, program, monkeypatch, tmp_path):
    def read_only(*args):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(compile_cache, "_store", read_only)
    monkeypatch.setattr(compile_cache, "_warned", set())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.warns(CacheWarning, match=r"cannot be written \(Permission denied\); compiling without it"):
        kina.compile_file(program)
    assert not list(tmp_path.glob("kina-*"))


def test_kinac_with_an_unwritable_cache_warns_once(tmp_path, program):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    for args in ([program, "-o", tmp_path / "out.so"], ["run", program]):
        proc = kinac(*args, env={"KINA_CACHE_DIR": str(blocker)})
        assert proc.returncode == 0, proc.stderr
        warned = [line for line in proc.stderr.splitlines() if line.startswith("kinac: warning:")]
        assert warned == [f"kinac: warning: the compile cache {blocker} cannot be written (File exists); "
                          "compiling without it"], proc.stderr
    assert whole(tmp_path / "out.so")


# -- no work folder left in TMPDIR -------------------------------------------------------------

def test_no_work_folder_is_left_in_tmpdir(tmp_path, cache, program):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    bad = tmp_path / "bad.kina"
    bad.write_text("let f = fn(")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    runs = [
        ([program, "-o", tmp_path / "a.so"], {}, 0),  # a build stored in the cache
        ([program, "-o", tmp_path / "a.so"], {}, 0),  # a cache hit
        ([program, "-o", tmp_path / "b.so"], {"KINA_NO_CACHE": "1"}, 0),
        ([program, "-o", tmp_path / "c.so"], {"KINA_CACHE_DIR": str(blocker)}, 0),
        ([program, "--emit", "llvm"], {}, 0),
        ([program, "--emit", "obj", "-o", tmp_path / "x.o"], {}, 0),
        (["run", program], {"KINA_NO_CACHE": "1"}, 0),
        (["bench", program, "--repeats", "1"], {"KINA_CACHE_DIR": str(blocker)}, 0),
        ([bad], {}, 1),
        (["run", bad], {}, 1),
        ([program, "-o", tmp_path / "d.so"], {"KINA_NO_CACHE": "1", "KINA_TRANSLATE": "nope"}, 1),
        ([program, "-o", tmp_path / "e.so"], {"KINA_NO_CACHE": "1", "KINA_CC": str(tmp_path / "no-cc")}, 1),  # OSError
    ]
    for args, env, status in runs:
        proc = kinac(*args, env={"TMPDIR": str(tmp), **env})
        assert proc.returncode == status, (args, proc.stderr)
        assert list(tmp.iterdir()) == [], (args, list(tmp.iterdir()))


def test_a_failing_tool_keeps_only_the_files_its_command_names(tmp_path, cache, program):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    fake = tmp_path / "fake-cc"
    fake.write_text("#!/bin/sh\necho 'fake-cc: no' >&2\nexit 3\n")
    fake.chmod(0o755)
    proc = kinac(program, env={"TMPDIR": str(tmp), "KINA_NO_CACHE": "1", "KINA_CC": str(fake)})
    assert proc.returncode == 2 and "fake-cc: no" in proc.stderr
    (work,) = tmp.iterdir()
    command = shlex.split(proc.stderr.split("to reproduce, run:\n")[1].strip())
    assert work.name.startswith("kina-") and [str(p) for p in work.iterdir()] == [str(work / "out.o")]
    assert str(work / "out.o") in command
