"""The floor model: the least time a step can take, from the bytes it moves.

In:  the bytes a step reads (R) and writes (W), and the machine's read_bw and copy_bw
     (bandwidth.bandwidth, per thread count).
Out: floor seconds; fit_floors raises the bandwidths so that no measured sample beats its
     floor; add_floors writes each size's floors and every variant's ratio to its floor.

A step moves m = min(R, W) of its bytes as a copy and the other R - m as plain reads
(writes beyond the reads are counted as free):

    t_floor(n threads) = m / copy_bw[n] + (R - m) / read_bw[n]

  functional step (one-off and host loop): R = K_past + V_past + q + k_new + v_new + scale,
      W = K_next + V_next + context (W = R - 4 bytes): the floor is about (K+V) / copy_bw.
  in place: R = the filled K and V prefix (S_past+1 positions) + q + k_new + v_new,
      W = the new position + context: the floor is about (K+V) / read_bw.

read_bw[n] and copy_bw[n] are the best the machine was seen to do on n threads in the run:
  1. the dedicated kernels of bandwidth.py (the best pass counts: noise only slows one down);
  2. on n threads, at least what fewer threads did (a run may leave a thread idle);
  3. every variant on at most n threads, at any size: if its best sample beats its floor,
     the bandwidth its kind rests on (read for in place, copy for the others) is raised to
     what that sample implies, and the report names the variant. Raising a bandwidth only
     lowers floors, so the result holds for every variant: "x floor" is never below 1.
"""
from __future__ import annotations

F32 = 4


def floor_seconds(read_bytes: int, write_bytes: int, read_bw: float, copy_bw: float) -> float:
    m = min(read_bytes, write_bytes)
    return m / copy_bw + (read_bytes - m) / read_bw


def bytes_moved(B: int, H: int, Dh: int, S: int) -> dict[str, tuple[int, int]]:
    """{"functional" | "in place": (bytes read, bytes written)} of one F32 decode step at S_past = S."""
    kv_past, kv_next = 2 * B * H * Dh * S * F32, 2 * B * H * Dh * (S + 1) * F32
    small_in, one_pos, ctx = (B * H * Dh * 3 + 1) * F32, 2 * B * H * Dh * F32, B * H * Dh * F32
    return {"functional": (kv_past + small_in, kv_next + ctx), "in place": (kv_next + small_in, one_pos + ctx)}


def fit_floors(results: list[dict], bw: dict[int, dict]) -> None:
    """Steps 2 and 3 of the model, in place on `bw`, from the sizes' results (their "bytes"
    and every variant's "min_s", "floor" and "threads")."""
    prev = None
    for n in sorted(bw):
        b = bw[n]
        for kind in ("read", "copy"):
            if prev is not None and prev[kind] > b[kind]:
                b[kind], b[f"{kind}_by"] = prev[kind], prev[f"{kind}_by"]
        for kind in ("in place", "functional"):  # in place raises read; then the rest raise copy
            for r in results:
                R, W = r["bytes"][kind]["read"], r["bytes"][kind]["written"]
                m = min(R, W)
                for name, v in r["variants"].items():
                    t = v["min_s"]
                    if v["floor"] != kind or v["threads"] > n or floor_seconds(R, W, b["read"], b["copy"]) <= t:
                        continue
                    which = "read" if kind == "in place" else "copy"
                    rest = m / b["copy"] if which == "read" else (R - m) / b["read"]
                    if rest < t:
                        b[which] = (R - m if which == "read" else m) / (t - rest)
                    f = floor_seconds(R, W, b["read"], b["copy"])
                    if f > t:  # the other bandwidth is beaten too (never seen): raise both
                        b["read"], b["copy"] = b["read"] * f / t, b["copy"] * f / t
                    b[f"{which}_by"] = (f"{name} at H={r['H']} Dh={r['Dh']} S_past={r['S_past']} "
                                        f"(its best sample)")
        prev = b


def floor_of(r: dict, bw: dict[int, dict], kind: str, threads: int) -> float:
    m = r["bytes"][kind]
    return floor_seconds(m["read"], m["written"], bw[threads]["read"], bw[threads]["copy"])


def add_floors(r: dict, bw: dict[int, dict]) -> None:
    """Fill in one size's floors and every variant's ratio to its floor."""
    r["floor_s_threads"] = {str(n): {k: floor_of(r, bw, k, n) for k in r["bytes"]} for n in bw}
    r["floor_s"] = r["floor_s_threads"][str(min(bw))]  # one thread's, as the plot draws them
    for v in r["variants"].values():
        v["floor_s"] = r["floor_s_threads"][str(v["threads"])][v["floor"]]
        v["ratio_floor"] = v["median_s"] / v["floor_s"]
