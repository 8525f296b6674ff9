"""The config.json fields that transformers spells alike for every architecture, read once for
all families.

In:  `Fields` over a Hugging Face config.json.
Out: `rope(f, where, params)`: the `Rope` of one set of rotary parameters (transformers 5's
     `rope_parameters`, or the older `rope_scaling` with `rope_theta`), `where` naming the field
     they came from.

Guarantees: a rotary type Kina does not compute, a partial rotary factor other than 1, a theta
that is not a number > 0, or parameters the type lacks are refused naming `where`.
"""
from __future__ import annotations

from ..config import ROPE_TYPES, Rope


def rope(f, where: str, params: dict) -> Rope:
    """`params` ({"rope_type" or the older "type", "rope_theta", the type's numbers}) as a Rope."""
    params = dict(params)
    if "type" in params and "rope_type" not in params:  # the older spelling
        params["rope_type"] = params.pop("type")
    kind = params.get("rope_type", "default")
    if kind not in ROPE_TYPES:
        f.refuse(where, f"rope_type {kind!r} is not supported (Kina computes {', '.join(ROPE_TYPES)})")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        f.refuse(where, f"partial_rotary_factor {params['partial_rotary_factor']} is not supported (only 1.0)")
    theta = params.get("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        f.refuse(where, f"rope_theta must be a number > 0, got {theta!r}")
    try:
        return Rope.of(float(theta), {k: v for k, v in params.items()
                                      if k not in ("rope_theta", "partial_rotary_factor")})
    except (TypeError, ValueError) as e:
        f.refuse(where, str(e))
