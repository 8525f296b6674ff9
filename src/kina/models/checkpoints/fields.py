"""Reading a checkpoint's config fields, and the one error a checkpoint raises.

In:  a mapping of field names to values (a config.json object, a GGUF file's metadata)
     and where it came from (the file, for messages).
Out: `Fields`, whose readers return a field checked for its kind (`integer`,
     `number`, `flag`, `text`) or raise `CheckpointError` naming the file and the field;
     `refuse(name, why)` for a value Kina does not implement.

Guarantees: every message reads `FILE: field 'NAME' = VALUE: why` (or `... is
missing`), so a family's config mapping says only what it checks. A leaf of the
checkpoints package: imports nothing of kina.
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping, NoReturn


class CheckpointError(ValueError):
    """A model folder or file that Kina cannot run: the message names the file and the field or tensor."""


_ABSENT = object()


class Fields:
    """A config's fields, read with checks: `f.integer("hidden_size")`, `f.refuse("mlp_bias", why)`."""

    def __init__(self, values: Mapping[str, Any], where: str, prefix: str = ""):
        self.values, self.where, self.prefix = values, str(where), prefix

    def has(self, name: str) -> bool:
        return self.values.get(self.prefix + name) is not None

    def get(self, name: str, default=None, required: bool = False):
        value = self.values.get(self.prefix + name, _ABSENT)
        if value is _ABSENT or value is None:
            if required:
                raise CheckpointError(f"{self.where}: field {self.prefix + name!r} is missing")
            return default
        return value

    def refuse(self, name: str, why: str) -> NoReturn:
        shown = self.values.get(self.prefix + name)
        try:
            shown = json.dumps(shown)
        except TypeError:
            shown = repr(shown)
        raise CheckpointError(f"{self.where}: field {self.prefix + name!r} = {shown}: {why}")

    def integer(self, name: str, default=None, required: bool = False, minimum: int = 1) -> int | None:
        v = self.get(name, default, required)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < minimum):
            self.refuse(name, f"expected an integer >= {minimum}")
        return v

    def number(self, name: str, default=None, required: bool = False, positive: bool = True) -> float | None:
        v = self.get(name, default, required)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
            self.refuse(name, "expected a number > 0" if positive else "expected a finite number")
        return float(v)

    def flag(self, name: str, default: bool = False) -> bool:
        v = self.get(name, default)
        if not isinstance(v, bool):
            self.refuse(name, "expected true or false")
        return v

    def text(self, name: str, default=None, required: bool = False) -> str | None:
        v = self.get(name, default, required)
        if v is not None and not isinstance(v, str):
            self.refuse(name, "expected a string")
        return v
