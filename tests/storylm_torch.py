"""StoryLM-0 in PyTorch, written from issue 13's formulas alone: the tests' independent
reference (scripts/bench_model.py now compares with transformers itself, on a saved folder).

In:  the weights `kina.models.storylm` documents (a dict of NumPy arrays named as in
     `kina.models.storylm.weight_shapes`, projections stored [in, out]), the head count, eps
     and the RoPE base.
Out: `TorchStoryLM`, whose `generate` returns the greedy tokens, the logits that
     chose them and each step's time, with a growing KV cache (prefill, then one position per step) or
     recomputing the whole sequence at every step.

It shares no code with kina.models.storylm beyond the weight names: every formula is
written again here, in torch's own ops. Per layer, pre-norm in Llama's form:
    h   = x + Attn(RMSNorm(x)),  out = h + MLP(RMSNorm(h))
    RMSNorm(x) = x * rsqrt(mean(x*x) + eps) * g
    Attn: q, k, v = x@Wq, x@Wk, x@Wv in heads; NeoX rotary on q and k,
          x*cos + rotate_half(x)*sin with rotate_half(x) = cat(-x2, x1);
          softmax(q k^T / sqrt(Dh) + causal mask) v, then @Wo
    MLP (SwiGLU): (silu(x@W_gate) * (x@W_up)) @ W_down, silu(z) = z * sigmoid(z)
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch


class TorchStoryLM:
    def __init__(self, weights: dict[str, np.ndarray], n_heads: int, eps: float = 1e-6,
                 rope_theta: float = 10000.0):
        self.w = {name: torch.from_numpy(np.ascontiguousarray(a)) for name, a in weights.items()}
        self.vocab_size, self.d_model = self.w["embed"].shape
        self.n_layers = sum(1 for name in self.w if name.endswith(".wq"))
        self.n_heads, self.head_dim = n_heads, self.d_model // n_heads
        self.eps, self.theta = eps, rope_theta
        self.dtype = self.w["embed"].dtype

    def rms_norm(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + self.eps) * g

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [H, T, Dh] at `positions` [T]."""
        half = self.head_dim // 2
        inv_freq = self.theta ** (-torch.arange(0, half, dtype=torch.float64) * 2 / self.head_dim)
        angle = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [T, half]
        cos = torch.cat([angle.cos(), angle.cos()], dim=-1).to(self.dtype)
        sin = torch.cat([angle.sin(), angle.sin()], dim=-1).to(self.dtype)
        x1, x2 = x[..., :half], x[..., half:]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def forward(self, tokens: list[int], start: int, cache: list | None) -> torch.Tensor:
        """Logits [T, vocab] for `tokens` at positions start..; `cache` (per layer [K, V],
        each [H, n, Dh]) holds the `start` positions before them and is extended."""
        w, T, H, Dh = self.w, len(tokens), self.n_heads, self.head_dim
        positions = torch.arange(start, start + T)
        x = w["embed"][torch.tensor(tokens)]
        mask = torch.full((T, start + T), -math.inf, dtype=self.dtype).triu(start + 1)
        for i in range(self.n_layers):
            p = f"layers.{i}."
            a = self.rms_norm(x, w[p + "attn_norm"])
            q, k, v = ((a @ w[p + name]).view(T, H, Dh).transpose(0, 1) for name in ("wq", "wk", "wv"))
            q, k = self.rope(q, positions), self.rope(k, positions)
            if cache is not None:
                if start:
                    k, v = torch.cat([cache[i][0], k], dim=1), torch.cat([cache[i][1], v], dim=1)
                cache[i] = [k, v]
            scores = q @ k.transpose(1, 2) / math.sqrt(Dh) + mask
            context = (torch.softmax(scores, dim=-1) @ v).transpose(0, 1).reshape(T, self.d_model)
            h = x + context @ w[p + "wo"]
            m = self.rms_norm(h, w[p + "mlp_norm"])
            gate = m @ w[p + "w_gate"]
            x = h + (gate * torch.sigmoid(gate) * (m @ w[p + "w_up"])) @ w[p + "w_down"]
        return self.rms_norm(x, w["norm"]) @ w["head"]

    @torch.inference_mode()
    def generate(self, prompt: list[int], n_new: int, use_cache: bool = True):
        """Greedy: the n_new tokens after `prompt`, the logits [n_new, vocab] that chose them,
        and each step's seconds (the first is the prefill)."""
        tokens, rows, seconds = list(prompt), [], []
        cache = [None] * self.n_layers if use_cache else None
        for i in range(n_new):
            t0 = time.perf_counter()
            if not use_cache:
                logits = self.forward(tokens, 0, None)[-1]
            elif i == 0:
                logits = self.forward(tokens, 0, cache)[-1]
            else:
                logits = self.forward(tokens[-1:], len(tokens) - 1, cache)[-1]
            tokens.append(int(torch.argmax(logits)))
            seconds.append(time.perf_counter() - t0)
            rows.append(logits.numpy().copy())
        return tokens[len(prompt):], np.stack(rows), seconds
