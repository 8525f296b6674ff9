"""Read and copy bandwidth probes: the best this machine was seen to do, on n threads.

In:  thread counts, a number of passes; optionally a Kina copy kernel (COPY_KERNEL, compiled
     by the caller) and torch, whose kernels join the candidates.
Out: samples[str(n)][kind][name] = [bytes/s of each pass] (kind "read" or "copy"), and
     bandwidth(samples): per thread count the best read and copy, which kernel gave it,
     and every kernel's best and median.
Guarantees: every pass runs on arrays of 256 MiB (far beyond any last-level cache), new
ones for each round of passes (one pair of buffers was once seen to copy 3-5x slower than
another for a whole run, so the floor wants the best placement seen), pages faulted in
before timing. The n parts of an n-thread pass run on Kina's own worker threads
(kina.runtime.workers), the pool the split kernels use, bound to separate cores.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np

from kina.runtime import empty as aligned_empty
from kina.runtime import workers

from .timing import SETTLE_S, busy_wait

MIB = 1 << 20
F32 = 4

# A copy kernel for the copy bandwidth: a concat along the contraction axis of a one-row
# matmul is fused into it (fuse-concat-matmul), and the fused loop writes the concat with
# non-temporal stores, each row of c read once with its sums kept in registers (rows of
# D = 128 floats). The arithmetic, one multiply-add per element copied, is far below what a
# core does, so the kernel runs at the speed of its copy (the V half of the decode step).
COPY_KERNEL = """
let copy = fn(w0: tensor<F32, [R, 1, N], @host>, w1: tensor<F32, [R, 1, 1], @host>,
              a: tensor<F32, [R, N, D], @host>, b: tensor<F32, [R, 1, D], @host>)
  -> (tensor<F32, [R, N+1, D], @host>, tensor<F32, [R, 1, D], @host>) {
  let w = concat[axis=2] w0 w1;
  let c = concat[axis=1] a b;
  (c, w @ c)
}
"""


def _invoke(f: Callable) -> None:
    f()


def on_threads(calls: list[Callable]) -> None:
    """Run the calls at once, the first on this thread, the rest on Kina's worker threads
    (NumPy releases the GIL in copies and BLAS; where it does not, the candidate is merely
    slow and never the best)."""
    workers.run_concurrently(_invoke, [[c] for c in calls])


def split(a: np.ndarray, n: int) -> list[np.ndarray]:
    return [a[a.size * i // n: a.size * (i + 1) // n] for i in range(n)]


class BandwidthKernels:
    """The dedicated read and copy kernels on one 256 MiB source (and, for copies, a 256 MiB
    destination), each at a given thread count. Make a new one for each round of passes."""

    def __init__(self, copy_kernel=None, torch=None, nbytes: int = 256 * MIB, copies: bool = True):
        R, D = 32, 128
        N = nbytes // (R * D * F32)
        self.nbytes = R * N * D * F32
        src = aligned_empty((R, N, D))
        src.fill(0.5)  # fault the pages in
        self.flat_src, self.kernel, self.torch, self.copies = src.reshape(-1), copy_kernel, torch, copies
        if copies:
            dst, w0, w1, b, y = (aligned_empty(s) for s in ((R, N + 1, D), (R, 1, N), (R, 1, 1), (R, 1, D), (R, 1, D)))
            for x in (dst, w0, w1, b, y):
                x.fill(0.5)
            self.flat_dst = dst.reshape(-1)[:src.size]
            self.kernel_args, self.kernel_outs = [w0, w1, src, b], [dst, y]

    def candidates(self, n: int) -> dict[str, dict[str, Callable]]:
        """{"read"|"copy": {name: f}}: f() moves self.nbytes (read, or copied) on n threads."""
        src = split(self.flat_src, n)
        read = {"np.sum": lambda: on_threads([p.sum for p in src]),
                "np.dot": lambda: on_threads([lambda p=p: np.dot(p[:p.size // 2], p[p.size // 2:]) for p in src])}
        out = {"read": read}
        if self.torch is not None:
            t_src = self.torch.from_numpy(self.flat_src)
            read["torch.sum"] = lambda: self.torch_on(n, t_src.sum)
        if self.copies:
            dst = split(self.flat_dst, n)
            copy = out["copy"] = {
                "np.copyto": lambda: on_threads([lambda s=s, d=d: np.copyto(d, s) for s, d in zip(src, dst)])}
            if self.kernel is not None:
                copy["kina copy"] = lambda: self.kernel.call_unchecked(self.kernel_args, self.kernel_outs, n)
            if self.torch is not None:
                t_src, t_dst = self.torch.from_numpy(self.flat_src), self.torch.from_numpy(self.flat_dst)
                copy["torch copy_"] = lambda: self.torch_on(n, lambda: t_dst.copy_(t_src))
        return out

    def torch_on(self, n: int, f: Callable) -> None:
        self.torch.set_num_threads(n)
        f()

    def measure(self, threads: list[int], passes: int) -> dict:
        """samples[str(n)][kind][name]: bytes/s of each pass."""
        out: dict = {}
        for _ in range(passes):
            for n in threads:
                for kind, fs in self.candidates(n).items():
                    for name, f in fs.items():
                        t = time.perf_counter()
                        f()
                        dt = time.perf_counter() - t
                        out.setdefault(str(n), {}).setdefault(kind, {}).setdefault(name, []).append(self.nbytes / dt)
                if n > 1 and self.torch is not None:
                    self.torch.set_num_threads(1)
                    busy_wait(SETTLE_S)
        return out


def add_samples(into: dict, more: dict) -> None:
    for n, kinds in more.items():
        for kind, names in kinds.items():
            for name, v in names.items():
                into.setdefault(n, {}).setdefault(kind, {}).setdefault(name, []).extend(v)


def bandwidth(samples: dict) -> dict[int, dict]:
    """Per thread count: read and copy, the best pass of the best kernel on at most that many
    threads (noise only ever slows a pass down), which kernel it was, and every kernel's best
    and median. The floor model may raise these later (floor.fit_floors)."""
    out: dict[int, dict] = {}
    best = {kind: (0.0, "") for n in samples for kind in samples[n]}
    for n in sorted(samples, key=int):
        row: dict = {"candidates": {}}
        for kind, names in samples[n].items():
            for name, v in names.items():
                row["candidates"][f"{kind} {name}"] = {"best": max(v), "median": statistics.median(v)}
                best[kind] = max(best[kind], (max(v), f"{name} on {n} thread{'s' * (n != '1')}"))
        for kind, (bps, by) in best.items():
            row[kind], row[f"{kind}_by"] = bps, by
        out[int(n)] = row
    return out


def read_bandwidth(passes: int) -> float:
    """Bytes/s one thread reads from memory: the best of `passes` passes of np.sum (one
    stream) and np.dot (two), on a new 256 MiB array each pass."""
    return read_bandwidths(passes, [1])[1]


def read_bandwidths(passes: int, threads: list[int]) -> dict[int, float]:
    """{n: bytes/s read on at most n threads}, for each n in `threads`: read_bandwidth's
    probe with the array split in n parts, each summed on its own worker thread (NumPy
    releases the GIL), interleaved with the other thread counts pass by pass."""
    samples: dict = {}
    for _ in range(passes):
        add_samples(samples, BandwidthKernels(copies=False).measure(list(threads), 1))
    return {n: b["read"] for n, b in bandwidth(samples).items()}
