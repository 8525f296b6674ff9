"""The Section 19 decode step in NumPy, PyTorch and onnxruntime: the rows Kina is compared with.

In:  a size (kvstep.Size), its input sets (kvstep.make_functional_sets, make_in_place_sets)
     and the softmax's scratch buffers (Scratch); torch and onnxruntime sessions if they import.
Out: timing.Variant rows, each writing into its set's preallocated results (no allocation
     while timed), so every peer moves the same bytes as Kina's call_into:

  numpy           np.concatenate and np.matmul with out=, a stable softmax, into preallocated buffers.
  numpy in place  k_new/v_new copied into [B,H,Dh,T_max] / [B,H,T_max,Dh] buffers, then attention
                  over the filled prefix (strided views), results into scratch.
  torch nT        PyTorch eager with out= (torch.cat, torch.matmul, aten._softmax.out) on the same
                  memory (torch.from_numpy), with torch.set_num_threads(n).
  ort nT          onnxruntime (intra_op_num_threads=n, sequential) on an ONNX graph of the step
                  built with onnx.helper (Concat, Concat, MatMul, Mul, Softmax(axis=-1), MatMul;
                  symbolic dims, one model for every size), run with IO binding on the same
                  NumPy inputs and preallocated results.
After each multi-threaded torch or ort sample (not timed) torch goes back to one thread and
the run busy-waits SETTLE_S: their idle workers spin for a while after a run and would steal
the other core from whatever runs next (docs/performance.md, "Waiting between variants").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .timing import SETTLE_S, InputSets, Variant, busy_wait, written


@dataclass
class Scratch:
    """The softmax's buffers, shared by the NumPy and PyTorch steps of one size."""

    scores: np.ndarray
    m: np.ndarray
    s: np.ndarray

    @classmethod
    def of(cls, z) -> "Scratch":
        return cls(np.zeros((z.B, z.H, 1, z.S + 1), np.float32), np.zeros((z.B, z.H, 1, 1), np.float32),
                   np.zeros((z.B, z.H, 1, 1), np.float32))


def softmax_numpy(scores, m, s):
    np.max(scores, axis=3, keepdims=True, out=m)
    np.subtract(scores, m, out=scores)
    np.exp(scores, out=scores)
    np.sum(scores, axis=3, keepdims=True, out=s)
    np.divide(scores, s, out=scores)


def attend_numpy(q, k, v, scale, x: Scratch, out) -> None:
    """softmax(q @ k * scale) @ v into `out`, through the scratch buffers."""
    np.matmul(q, k, out=x.scores)
    np.multiply(x.scores, scale, out=x.scores)
    softmax_numpy(x.scores, x.m, x.s)
    np.matmul(x.scores, v, out=out)


def numpy_functional(sets: InputSets, x: Scratch) -> list[Variant]:
    def step(d):
        np.concatenate([d["k_past"], d["k_new"]], axis=3, out=d["k_next"])
        np.concatenate([d["v_past"], d["v_new"]], axis=2, out=d["v_next"])
        attend_numpy(d["q"], d["k_next"], d["v_next"], d["scale"], x, d["context"])
    return [Variant("numpy", sets, step, result=written(step))]


def numpy_in_place(z, in_place, x: Scratch) -> list[Variant]:
    S = z.S
    items = [{"k": k, "v": v, "small": small, "context": np.zeros((z.B, z.H, 1, z.Dh), np.float32)}
             for k, v, small in zip(in_place.k, in_place.v, in_place.small)]

    def step(item):
        d, k, v = item["small"], item["k"], item["v"]
        np.copyto(k[..., S:S + 1], d["k_new"])
        np.copyto(v[:, :, S:S + 1], d["v_new"])
        attend_numpy(d["q"], k[..., :S + 1], v[:, :, :S + 1], d["scale"], x, item["context"])
    return [Variant("numpy in place", InputSets(items, in_place.nbytes_each), step, ref="numpy in place",
                    floor="in place", group="in place")]


def import_torch(notes: list[str]):
    """torch on one thread, or None (with a note) when it does not import."""
    try:
        import torch
    except ImportError:
        notes.append("torch is not installed: the torch rows are skipped")
        return None
    torch.set_num_threads(1)
    return torch


def settle(torch) -> Callable:
    def after():  # let torch's OpenMP (or onnxruntime's) workers stop spinning before the next variant
        if torch is not None:
            torch.set_num_threads(1)
        busy_wait(SETTLE_S)
    return after


def torch_functional(z, sets: InputSets, x: Scratch, torch, threads: list[int]) -> list[Variant]:
    for d in sets.sets:
        d["t"] = {k: torch.from_numpy(v) for k, v in d.items() if isinstance(v, np.ndarray)}
    t_scores, t_probs = torch.from_numpy(x.scores), torch.zeros((z.B, z.H, 1, z.S + 1))
    softmax_out = torch.ops.aten._softmax.out

    def step(d):
        t = d["t"]
        torch.cat([t["k_past"], t["k_new"]], dim=3, out=t["k_next"])
        torch.cat([t["v_past"], t["v_new"]], dim=2, out=t["v_next"])
        torch.matmul(t["q"], t["k_next"], out=t_scores)
        torch.mul(t_scores, t["scale"], out=t_scores)
        softmax_out(t_scores, 3, False, out=t_probs)
        torch.matmul(t_probs, t["v_next"], out=t["context"])
    return [Variant(f"torch {n}T", sets, step, before=lambda n=n: torch.set_num_threads(n),
                    after=settle(torch) if n > 1 else None, threads=n, result=written(step)) for n in threads]


ORT_INPUTS = ("q_new", "k_past", "k_new", "v_past", "v_new", "scale")
ORT_OUTPUTS = ("k_next", "v_next", "context")


def ort_step_model(onnx) -> bytes:
    """The step as an ONNX graph (opset 17), symbolic in B, H, Dh, S: one model for every size."""
    h, f = onnx.helper, onnx.TensorProto.FLOAT
    shapes = {"q_new": ["B", "H", 1, "Dh"], "k_past": ["B", "H", "Dh", "S"], "k_new": ["B", "H", "Dh", 1],
              "v_past": ["B", "H", "S", "Dh"], "v_new": ["B", "H", 1, "Dh"], "scale": [1, 1, 1, 1],
              "k_next": ["B", "H", "Dh", "S1"], "v_next": ["B", "H", "S1", "Dh"], "context": ["B", "H", 1, "Dh"]}
    nodes = [h.make_node("Concat", ["k_past", "k_new"], ["k_next"], axis=3),
             h.make_node("Concat", ["v_past", "v_new"], ["v_next"], axis=2),
             h.make_node("MatMul", ["q_new", "k_next"], ["scores"]),
             h.make_node("Mul", ["scores", "scale"], ["scaled"]),
             h.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
             h.make_node("MatMul", ["probs", "v_next"], ["context"])]
    graph = h.make_graph(nodes, "kv_step", [h.make_tensor_value_info(n, f, shapes[n]) for n in ORT_INPUTS],
                         [h.make_tensor_value_info(n, f, shapes[n]) for n in ORT_OUTPUTS])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="bench_kv_step")
    model.ir_version = 8  # what onnxruntime 1.16 and later read
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ort_sessions(threads: list[int], notes: list[str]) -> tuple[dict, str | None]:
    """({n: an onnxruntime session of the step on n intra-op threads}, onnxruntime's version),
    or ({}, None) with a note when onnxruntime or onnx does not import."""
    try:
        import onnx
        import onnxruntime as ort
    except ImportError:
        notes.append("onnxruntime or onnx is not installed (the [bench] extra): the ort rows are skipped")
        return {}, None
    model = ort_step_model(onnx)
    sessions = {}
    for n in threads:
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = n, 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        sessions[n] = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    return sessions, ort.__version__


def ort_functional(sets: InputSets, sessions: dict, torch) -> list[Variant]:
    """onnxruntime with every input and result bound to the set's own NumPy buffers."""
    for d in sets.sets:
        d["ort"] = {}
        for n, sess in sessions.items():
            b = sess.io_binding()
            for name, a in zip(ORT_INPUTS, d["args"]):
                b.bind_input(name, "cpu", 0, np.float32, list(a.shape), a.ctypes.data)
            for name, a in zip(ORT_OUTPUTS, d["outs"]):
                b.bind_output(name, "cpu", 0, np.float32, list(a.shape), a.ctypes.data)
            d["ort"][n] = b
    variants = []
    for n, sess in sessions.items():
        def run(d, n=n, sess=sess):
            sess.run_with_iobinding(d["ort"][n])
        variants.append(Variant(f"ort {n}T", sets, run, after=settle(torch) if n > 1 else None, threads=n,
                                result=written(run)))
    return variants
