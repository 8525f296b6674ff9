"""The IR: the checked AST lowered to MLIR, and the passes from there to the LLVM dialect.

    lower.py    ast.Program -> the reference IR (upstream dialects on tensors)
    irbuild.py  builders of that IR's ops, shared by the lowering and the passes
    passes/     the pass table (__init__.py), what a pass is (_pass.py), one module per Kina pass

Everything here imports `mlir`.
"""
