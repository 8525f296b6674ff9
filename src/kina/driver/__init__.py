"""The driver: the ordered stage table from source to .so, the tools it runs, and the CLI.

    pipeline.py   stages, options, the compile cache     toolchain.py  the pinned tools and cc
    translate.py  LLVM dialect -> LLVM IR, in process     cli.py        kinac
    commands.py   kinac run and kinac bench              interrupts.py Ctrl-C; outputs written whole
"""
