"""`kinac`: the command-line driver.

    kinac FILE.kina [-o OUT] [--emit STAGE] [--dump-dir DIR] [--print-ir-after-all]
                    [--cpu CPU] [--locs] [-O N] [--dtype T=DTYPE ...] [--dim NAME=N ...]
                    [--pass-options 'NAME{opt=value},...']
    kinac --list-passes
    kinac opt FILE.mlir --passes 'NAME[{OPT=VALUE ...}][,NAME...]' [-o OUT] [--print-ir-after-all] [--locs]
    kinac run FILE.kina [--fn NAME] [--input NAME=@FILE.npy|NAME=NUMBER ...] [--dim NAME=N ...]
                        [--seed N] [--interpret | --compare] [--output-dir DIR]
    kinac bench FILE.kina [--fn NAME] [--input ...] [--dim NAME=N ...] [--seed N] [--repeats N]
    kinac --version

`--dtype` gives a generic function's type parameter its dtype; `--dim` fixes a
symbolic dim (a static specialisation when compiling; the size of random inputs
for `run` and `bench`). `run` takes every parameter from `--input` or none (then
seeded random inputs); `--compare` runs compiled and interpreted and prints their
largest differences; `--output-dir` writes the results as .npy files.

Exit status: 0 on success, 1 for a user's error (bad source, missing file, a bad
environment variable), 2 for an internal compiler error or a failing external tool,
130 when interrupted. A user's error is printed as `FILE:LINE:COL: error: ...` with
the source line and a caret, or as one `kinac: error: ...` line, never as a Python
traceback. An interrupt (Ctrl-C) at any moment is the one line `kinac: interrupted`,
and leaves no output file: every file a command writes appears whole, at its end
(`interrupts.write_outputs`).
"""
from __future__ import annotations

import sys

from . import interrupts

# The rest is imported by the functions that use it. kinac's entry point is
# kina.__main__, which takes over Ctrl-C before importing this; a console script
# installed before that calls `main` here, and must reach `interrupts.install()`
# within a millisecond of starting too, not after argparse and pathlib have loaded.


def version_text() -> str:
    from importlib import metadata
    from ..version import __version__
    from ..errors import ToolError
    from . import toolchain
    wheels = []
    for name in toolchain.PINNED:
        try:
            wheels.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            wheels.append(f"{name} (not installed)")
    try:
        llvm = toolchain.llvm_version()
    except ToolError:
        llvm = "not found"
    return f"kinac {__version__}\nMLIR/LLVM {llvm}\n" + "\n".join(wheels)


def _compile_parser():
    import argparse
    from .pipeline import STAGE_NAMES
    p = argparse.ArgumentParser(prog="kinac", description="Compile a Kina program to MLIR and a shared object.",
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("file", nargs="?", help="the .kina source file")
    p.add_argument("-o", "--output", help="output path (default: the .so next to the source; text stages print)")
    p.add_argument("--emit", choices=STAGE_NAMES, default="so", metavar="STAGE",
                   help="stop after this stage (or pass) and emit its output: " + ", ".join(STAGE_NAMES))
    p.add_argument("--list-passes", action="store_true",
                   help="print the pass table, each pass's options with their defaults (and the value a build\n"
                        "for --cpu uses where that differs), and exit")
    p.add_argument("--dump-dir", help="write every stage's output, numbered, into this folder")
    p.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every MLIR pass (stderr)")
    p.add_argument("--cpu", default="native",
                   help="target CPU: native (default, this machine's) or x86-64, x86-64-v2, -v3, -v4 (portable)")
    p.add_argument("--locs", action="store_true", help="print source locations in emitted MLIR")
    p.add_argument("--dtype", action="append", default=[], metavar="T=DTYPE",
                   help="give a type parameter its dtype (fn[T]): --dtype T=F16 (repeatable)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help="fix a symbolic dim, for a static specialisation: --dim S=128 (repeatable)")
    p.add_argument("-O", dest="opt_level", type=int, choices=[0, 1, 2, 3], default=None,
                   help="0: none of the optimisation passes, LLVM at -O0; 1-3: every pass, LLVM at that level")
    p.add_argument("--pass-options", default="", metavar="PASSES",
                   help="options for passes of the build, as kinac opt --passes takes them:\n"
                        "--pass-options 'matmul-loops{fma=true}' (see --list-passes); a pass\n"
                        "named twice takes the options of both")
    p.add_argument("--version", action="version", version=version_text())
    return p


def compile_main(argv: list[str]) -> int:
    from pathlib import Path
    from . import cache, pipeline
    parser = _compile_parser()
    args = parser.parse_args(argv)
    from ..runtime.cpu import CPU_LEVELS, target_flags
    if args.cpu != "native" and args.cpu not in CPU_LEVELS:
        print(f"kinac: error: unknown --cpu {args.cpu!r}: use 'native' or one of {', '.join(CPU_LEVELS)} "
              "(a .so for another CPU could not be checked when it is loaded)", file=sys.stderr)
        return 1
    if args.list_passes:  # the defaults, and what a build for --cpu (this machine's, by default) changes
        from ..ir.passes import table
        sys.stdout.write(table(target_flags(args.cpu), pipeline.target_cores(args.cpu)))
        return 0
    if not args.file:
        parser.error("the .kina source file is required")
    src = Path(args.file)
    from ..files import FileError, read_bytes
    try:
        source = read_bytes(src, "the source")
    except FileError as e:
        print(f"kinac: error: cannot read {e}", file=sys.stderr)
        return 1
    try:
        dtypes = _assignments("--dtype", args.dtype, str)
        dims = _assignments("--dim", args.dim, int)
    except ValueError as e:
        print(f"kinac: error: {e}", file=sys.stderr)
        return 1
    # -O, when given, overrides KINA_OPT_LEVEL, which is then not read (nor checked)
    level = {} if args.opt_level is None else {"opt_level": args.opt_level}
    try:
        options = pipeline.Options(cpu=args.cpu, print_ir_after_all=args.print_ir_after_all, locations=args.locs,
                                   dtypes=tuple(dtypes.items()), dims=tuple(dims.items()),
                                   pass_options=args.pass_options, **level)
    except ValueError as e:
        if not str(e).startswith("pass_options: "):
            raise  # a knob's error: reported as every command reports it
        print(f"kinac: error: --pass-options: {str(e).removeprefix('pass_options: ')}", file=sys.stderr)
        return 1
    dump = Path(args.dump_dir) if args.dump_dir else None
    out = Path(args.output) if args.output else None
    if args.emit == "so":
        so = cache.build_so(source, str(src), options, dump_dir=dump)
        try:
            out = out / f"{src.stem}.so" if out and out.is_dir() else out or src.with_suffix(".so")
            interrupts.write_outputs({out: so, out.with_suffix(".json"): so.with_suffix(".json")})
        finally:
            cache.discard(so)
        print(f"wrote {out} and {out.with_suffix('.json').name}", file=sys.stderr)
        return 0
    build = pipeline.run_stages(source, str(src), args.emit, options, dump_dir=dump)
    try:
        text = pipeline._render(build, args.emit)
    finally:
        pipeline.remove_temporary(build.workdir)
    if isinstance(text, bytes) and not out:
        out = src.with_suffix(".o")
    if out:
        if out.is_dir():
            out = out / f"{src.stem}.{pipeline.DUMP_EXT[args.emit]}"
        interrupts.write_outputs({out: text if isinstance(text, bytes) else text.encode()})
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _assignments(flag: str, items: list[str], kind) -> dict:
    """`NAME=VALUE` flags as a dict; a malformed one or a name given twice is a ValueError."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name.isidentifier() or not value:
            raise ValueError(f"{flag} {item!r}: expected NAME=VALUE, e.g. {flag} {'T=F16' if kind is str else 'S=128'}")
        if name in out:
            raise ValueError(f"{flag} {name} is given twice ({out[name]} and {value})")
        if kind is int:
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"{flag} {item!r}: {value!r} is not an integer") from None
        out[name] = value
    return out


def opt_main(argv: list[str]) -> int:
    """`kinac opt`: run named passes on MLIR text and print the result, like mlir-opt."""
    import argparse
    import re
    from pathlib import Path
    p = argparse.ArgumentParser(prog="kinac opt", description="Run kinac's passes on an MLIR file and print the result.")
    p.add_argument("file", help="the .mlir file ('-' for stdin)")
    p.add_argument("--passes", required=True, metavar="PASS[{OPT=V ...}],...",
                   help="passes in order, with options as in mlir-opt: 'matmul-loops{unroll=4},sum-loops' "
                        "(see kinac --list-passes)")
    p.add_argument("-o", "--output", help="write the result here instead of stdout")
    p.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass (stderr)")
    p.add_argument("--locs", action="store_true", help="print source locations")
    p.add_argument("--split-input-file", action="store_true",
                   help="run the passes on each '// -----' section alone, as mlir-opt does (negative tests)")
    p.add_argument("--allow-unregistered-dialect", action="store_true", help="accept ops of unknown dialects")
    args = p.parse_args(argv)
    from ..ir.passes import PipelineError, parse
    try:
        chosen = parse(args.passes)
    except PipelineError as e:
        print(f"kinac opt: error: {e}", file=sys.stderr)
        return 1
    from ..files import FileError, read_text
    try:
        text = sys.stdin.read() if args.file == "-" else read_text(args.file, "the input IR")
    except FileError as e:
        print(f"kinac opt: error: cannot read {e}", file=sys.stderr)
        return 1
    except UnicodeDecodeError as e:  # stdin
        print(f"kinac opt: error: cannot read the input IR: stdin is not UTF-8 text ({e.reason})", file=sys.stderr)
        return 1
    if not args.split_input_file:
        out, failed = _opt_one(args, chosen, text, None)
    else:  # each section keeps its line numbers: it is parsed after as many blank lines as precede it
        outs, failed, line = [], False, 0
        for section in re.split(r"^// -----[^\n]*\n", text, flags=re.M):
            result, bad = _opt_one(args, chosen, text, "\n" * line + section)
            line += section.count("\n") + 1
            failed |= bad
            outs.append(result)
        out = "// -----\n".join(o for o in outs if o)
    if args.output:
        interrupts.write_outputs({Path(args.output): out.encode()})
    else:
        sys.stdout.write(out)
    return 1 if failed else 0


def _opt_one(args, chosen: list, text: str, section: str | None) -> tuple[str, bool]:
    """Run `chosen` on the file's text (or on one `section` of it); returns the IR
    printed (empty on failure) and whether it failed. A pass's diagnostic is printed
    to stderr at the op it names, as mlir-opt prints it."""
    from mlir import ir
    from . import pipeline
    import dataclasses
    from ..errors import KinaError
    from ..frontend.diagnostics import use_color
    from ..ir.irbuild import print_ir
    from ..ir.passes import PassError

    def parsed() -> ir.Module:  # locations name the file, as mlir-opt's do
        ctx = ir.Context()
        ctx.allow_unregistered_dialects = args.allow_unregistered_dialect
        if section is None and args.file != "-":
            return ir.Module.parseFile(args.file, ctx)
        return ir.Module.parse(text if section is None else section, ctx)
    try:
        module = parsed()
    except ir.MLIRError as e:
        print(f"kinac opt: error: {args.file} is not valid MLIR:\n{e}", file=sys.stderr)
        return "", True
    for i, p in enumerate(chosen):
        try:
            pipeline.apply_pass(module, p, args.print_ir_after_all, args.file,
                                pipeline.replay_passes(parsed, chosen[:i]), users_ir=True)
        except PassError as e:  # the IR is the user's: a diagnostic at the op
            loc = e.loc
            if loc is not None and loc.file == "-":  # parsed from text: the file it came from
                loc = dataclasses.replace(loc, file=args.file if args.file != "-" else "<stdin>")
            if loc is None:
                print(f"kinac opt: error: {e.message}", file=sys.stderr)
            else:
                print(KinaError(loc, e.message, source=text if loc.file in (args.file, "<stdin>") else None)
                      .render(color=use_color(sys.stderr)), file=sys.stderr)
            return "", True
    return print_ir(module, args.locs), False


def run_main(argv: list[str], bench: bool = False) -> int:
    from .commands import run_command
    return run_command(argv, bench)


def main(argv: list[str] | None = None) -> int:
    """kinac with `argv`; returns the exit status.

    With no `argv` this is the program (the console script, `python -m kina`): it
    takes over Ctrl-C first of all (`interrupts`) and reads sys.argv. Given a list it
    is an in-process call, which leaves the signal handlers alone."""
    if argv is None:
        interrupts.install()
        argv = sys.argv[1:]
    try:
        return _main(list(argv))
    except KeyboardInterrupt:  # in-process, or a tool that Ctrl-C ended: the program exits in `interrupts`
        interrupts.announce()
        return 130
    finally:
        interrupts.done()


def _main(argv: list[str]) -> int:
    """Run one command; every error becomes its message and exit status."""
    import warnings
    from ..errors import InternalError, KinaError, ToolError
    from ..frontend.diagnostics import use_color
    from ..knobs import KnobError
    from .cache import CacheWarning
    from .pipeline import SpecializationError
    with warnings.catch_warnings():  # restores showwarning after: an in-process call changes nothing
        warnings.showwarning = _short_warnings(warnings.showwarning, CacheWarning)
        try:
            if argv and argv[0] in ("run", "bench"):
                return run_main(argv[1:], bench=argv[0] == "bench")
            if argv and argv[0] == "opt":
                return opt_main(argv[1:])
            return compile_main(argv)
        except KinaError as e:
            print(e.render(color=use_color(sys.stderr)), file=sys.stderr)
            return 1
        except (SpecializationError, KnobError) as e:  # a bad --dtype/--dim, or a bad environment variable
            print(f"kinac: error: {e}", file=sys.stderr)
            return 1
        except (InternalError, ToolError) as e:
            print(f"kinac: {e}", file=sys.stderr)
            return 2
        except (OSError, MemoryError) as e:  # a bad path or an impossible size: the user's to fix
            print(f"kinac: error: {e}", file=sys.stderr)
            return 1
        except Exception as e:  # anything else is ours
            print(f"kinac: internal compiler error: {type(e).__name__}: {e}\n"
                  "This is a bug in kinac, not in your program.", file=sys.stderr)
            return 2


def _short_warnings(show, category):
    """`warnings.showwarning` that prints a `category` warning as one `kinac: warning: ...` line."""
    def showwarning(message, cat, *rest, **kwargs):
        if issubclass(cat, category):
            print(f"kinac: warning: {message}", file=sys.stderr)
        else:
            show(message, cat, *rest, **kwargs)
    return showwarning


if __name__ == "__main__":
    sys.exit(main())
