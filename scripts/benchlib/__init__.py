"""What the benchmark scripts share, one module per concern.

    machine    the CPU, its last-level cache, NumPy's OpenBLAS, the commit: where a figure comes from
    timing     input sets rotated round robin, variants timed in interleaved rounds, best-of and medians
    bandwidth  read and copy bandwidth probes (the floor's denominators)
    floor      the floor model: the time a step cannot beat, from the bytes it moves
    kvstep     the Section 19 decode step's sizes, input sets and Kina's rows (bench_kv_step.py)
    peers      the same step in NumPy, PyTorch and onnxruntime
    engines    one Hugging Face folder in Kina, transformers and llama.cpp (bench_model.py)
    report     the targets (checks), the JSON report, the printed tables, --markdown and --plot

Dependencies point one way: machine, timing and floor import nothing from here; bandwidth
takes timing, report takes machine, peers and engines take timing and bandwidth, and kvstep
all but report. Only bandwidth, kvstep and engines import kina, so a script that needs neither
(bench_k_layout.py, which takes report's argument type) stays light.
"""
