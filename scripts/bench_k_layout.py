#!/usr/bin/env python3
"""How fast one core can read the in-place cache's Kᵀ layout: the ceiling under KVCache.step.

Run it (from the repo root):

    .venv/bin/python scripts/bench_k_layout.py
    .venv/bin/python scripts/bench_k_layout.py --runs 511,2047 --gaps 1,65,257 --working-set-mib 256

KVCache stores Kᵀ as [B, H, Dh, T_max]: the filled prefix of every row is a run of
S floats followed by a gap of T_max - S floats (bench_kv_step.py's in-place rows use
a gap of 257). This program times, on H=32 x Dh=128 rows of each run length and gap,
with inputs rotated through a working set much larger than the last-level cache:

  contiguous read        the same bytes with no gaps, one stream (the read floor)
  read, 8 rows at once   plain loads of the runs, 8 rows side by side (no arithmetic)
  read, row by row       plain loads of the runs, one row after the other
  K pass, 8 rows         acc[j] += q[d] * K[d, j], 8 rows of d per sweep of j: the loop
                         matmul-loops emits for the in-place step's scores
  K pass, row by row     the same sums, one row of d per sweep (the same summation order)

It is C, compiled here with the system cc (-O3 -march=native; -ffp-contract=off so the
sums are fmul then fadd, as Kina's), because the point is the memory system, not a
compiler: every figure is bytes of the runs (S x Dh x H x 4) per second, best of
--repeats, and each but the contiguous read also as a share of it. What it showed on
this project's machine, and the layout that came of it: docs/performance.md, "The Kᵀ layout".
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib.report import positive_ints

SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef float v8 __attribute__((vector_size(32)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static v8 ld(const float *p) { v8 v; memcpy(&v, p, 32); return v; }
static void st(float *p, v8 v) { memcpy(p, &v, 32); }
static float sum8(v8 v) { float s = 0; for (int i = 0; i < 8; i++) s += v[i]; return s; }

static float read_rows(const float *k, int rows, int n, int t, int side) {  /* side rows at once */
    v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (int r = 0; r + side <= rows; r += side)
        for (int j = 0; j + 32 <= n; j += 32)
            for (int u = 0; u < side; u++) {
                const float *p = k + (size_t)(r + u) * t + j;
                s0 += ld(p); s1 += ld(p + 8); s2 += ld(p + 16); s3 += ld(p + 24);
            }
    return sum8(s0 + s1 + s2 + s3);
}

static void k_pass(const float *k, const float *q, float *a, int dh, int n, int t, int side) {
    memset(a, 0, n * sizeof(float));
    for (int d = 0; d < dh; d += side) {
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            v8 acc = ld(a + j);
            for (int u = 0; u < side; u++) {
                v8 x = {q[d + u], q[d + u], q[d + u], q[d + u], q[d + u], q[d + u], q[d + u], q[d + u]};
                acc = acc + x * ld(k + (size_t)(d + u) * t + j);
            }
            st(a + j, acc);
        }
        for (; j < n; j++) { float s = a[j]; for (int u = 0; u < side; u++) s = s + q[d + u] * k[(size_t)(d + u) * t + j]; a[j] = s; }
    }
}

int main(int argc, char **argv) {
    int n = atoi(argv[1]), gap = atoi(argv[2]), repeats = atoi(argv[4]), heads = 32, dh = 128, t = n + gap;
    size_t per = (size_t)heads * dh * t, ws = (size_t)atol(argv[3]) << 20;
    int sets = (int)(ws / (per * 4)) + 2; if (sets > 64) sets = 64;
    float *k[64], *q = malloc(dh * sizeof(float)), *acc = malloc(((size_t)n + 64) * sizeof(float));
    for (int s = 0; s < sets; s++) { k[s] = aligned_alloc(64, (per * 4 + 63) / 64 * 64); for (size_t i = 0; i < per; i++) k[s][i] = 1.0f; }
    for (int d = 0; d < dh; d++) q[d] = 0.01f * d;
    double best[5] = {1e9, 1e9, 1e9, 1e9, 1e9}; volatile float sink = 0; int it = 0;
    for (int r = 0; r < repeats; r++)
        for (int v = 0; v < 5; v++) {
            const float *base = k[it++ % sets]; double t0 = now();
            for (int h = 0; h < heads; h++) {
                const float *kh = base + (size_t)h * dh * t;
                if (v == 0) sink += read_rows(kh, 1, n * dh, 0, 1);  /* contiguous: n*dh floats of the block */
                else if (v == 1) sink += read_rows(kh, dh, n, t, 8);
                else if (v == 2) sink += read_rows(kh, dh, n, t, 1);
                else { k_pass(kh, q, acc, dh, n, t, v == 3 ? 8 : 1); sink += acc[0]; }
            }
            double dt = now() - t0; if (dt < best[v]) best[v] = dt;
        }
    double bytes = (double)heads * dh * n * 4;
    printf("%d %d", n, gap); for (int v = 0; v < 5; v++) printf(" %.2f", bytes / best[v] / 1e9); printf("\n");
    return 0;
}
"""

COLUMNS = ("contiguous read", "read, 8 rows at once", "read, row by row", "K pass, 8 rows", "K pass, row by row")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--runs", type=positive_ints, default="127,511,2047,8191", help="run lengths S (default 127,511,2047,8191)")
    p.add_argument("--gaps", type=positive_ints, default="1,65,257", help="gaps T_max - S in floats (default 1,65,257)")
    p.add_argument("--working-set-mib", type=int, default=512, help="inputs rotated through at least this much")
    p.add_argument("--repeats", type=int, default=9, help="timed passes of each variant (best is kept)")
    a = p.parse_args(argv)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        p.error("no C compiler (cc) on PATH")
    with tempfile.TemporaryDirectory(prefix="kina-k-layout-") as tmp:
        src, exe = Path(tmp) / "k_layout.c", Path(tmp) / "k_layout"
        src.write_text(SOURCE)
        subprocess.run([cc, "-O3", "-march=native", "-ffp-contract=off", "-o", str(exe), str(src)], check=True)
        print(f"GB/s of the runs' bytes (H=32, Dh=128), best of {a.repeats}; working set {a.working_set_mib} MiB")
        print(f"{'S':>6} {'gap':>5}  " + "  ".join(f"{c:>20}" for c in COLUMNS))
        for n in a.runs:
            for gap in a.gaps:
                out = subprocess.run([str(exe), str(n), str(gap), str(a.working_set_mib), str(a.repeats)],
                                     check=True, capture_output=True, text=True).stdout.split()
                rates = [float(x) for x in out[2:]]
                # the contiguous read is the floor; every other rate also as a share of it
                cells = [f"{rates[0]:6.1f}"] + [f"{r:6.1f} ({r / rates[0]:.0%})" for r in rates[1:]]
                print(f"{n:>6} {gap:>5}  " + "  ".join(f"{c:>20}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
