"""The driver: the ordered stage table from source to .so, the tools it runs, and the CLI.

    pipeline.py   stages, options                       toolchain.py  the pinned tools and cc
    cache.py      the compile cache (build_so)          translate.py  LLVM dialect -> LLVM IR, in process
    api.py        compile_file, compile_source          cli.py        kinac
    commands.py   kinac run and kinac bench             interrupts.py Ctrl-C; outputs written whole
    options.py    Options (no MLIR, no lark)            facts.py      the cache folder, the compiler's hash, remembered facts
    llvm_parts.py a large LLVM module cut by function, for opt and llc at once
"""
