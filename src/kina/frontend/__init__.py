"""The front end: Kina source to a checked, typed AST.

    grammar.lark  the language reference       syntax.py  source -> ast.Program
    ast.py        frozen nodes, each with loc  check.py   types and shapes, specialisation
    uses.py       the files `use` brings in    inline.py  calls, inlined as check meets them
    rules.py      each op family's typing rule, which check.py's function checker inherits
    types.py      dtypes, dims, signatures     axes.py    which leading axes are independent
    ops.py        the op table: each operation once, read by every stage (and kina.ir, the interpreter)
    diagnostics.py  whether a diagnostic is coloured (the error types and their renderer: kina.errors)

Guarantees: nothing in this package imports `mlir`, so a program can be parsed and
checked without the toolchain (a test blocks `mlir` and imports every module here).
Importing the package itself loads nothing.
"""
