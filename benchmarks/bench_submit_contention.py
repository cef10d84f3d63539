"""Benchmark: how request submission from another thread slows the engine's step launches (CPU, no model).

    PYTHONPATH=. python3 benchmarks/bench_submit_contention.py                  # 1,000 prompts of 2,048 ids
    PYTHONPATH=. python3 benchmarks/bench_submit_contention.py --requests 8 --out contention.json
    PYTHONPATH=. python3 benchmarks/bench_submit_contention.py --submit many    # one submit_many call

Why: in bench_throughput.py's 8B runs every request is submitted at t = 0 from the main thread, and each
run's first step takes several times its size's device time while the host launches it (session 33). A
served step launches hundreds of Triton kernels, and Triton's launcher releases the GIL around the driver
call; a thread doing pure-Python work (here: ``LLMEngine.submit``'s validation and bookkeeping)
then keeps the GIL for up to Python's switch interval (5 ms) before the engine thread gets it back.

The executor here has no model: each step runs ``--launches`` stand-ins for a kernel launch (a little
Python, then ``time.sleep(0)``, which releases the GIL as the launchers do) and returns zero logits. The
script submits ``--requests`` prompts of ``--prompt-len`` random ids from the main thread while the engine
steps, and reports the submission loop's time, the first steps' host time and the host time of a step
with nothing submitted (the median of the later steps). The figures are this CPU's; the ratio is the point.
``--submit many`` queues the same prompts in one ``LLMEngine.submit_many`` call instead: the engine
sleeps while they are checked and its first step schedules from all of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from trtforge._fileio import atomic_write_text
from trtforge.llm.engine import LLMEngine
from trtforge.llm.executors.base import ExecutorFacts
from trtforge.llm.sampling import SamplingParams
from trtforge.llm.sched.scheduler import SchedulerConfig

VOCAB = 128256  # Llama 3's: the validation's range check sees realistic ids


class LaunchingExecutor:
    """A StepExecutor without a model: `launches` GIL-releasing stand-ins for kernel launches a step."""

    def __init__(self, launches: int, max_model_len: int) -> None:
        self.facts = ExecutorFacts(
            num_blocks=1 << 20, block_size=16, vocab_size=VOCAB, max_model_len=max_model_len,
            eos_token_ids=(2,), num_layers=32, num_kv_heads=8, head_dim=128, kv_dtype="bfloat16",
            kv_element_bytes=2, kv_pool_bytes=1 << 30,
        )  # fmt: skip
        self.launches = launches
        self.host_s: list[float] = []

    def step(self, batch):
        t = time.perf_counter()
        for _ in range(self.launches):
            sum(range(50))  # the Python around a launch (arguments, grid)
            time.sleep(0)  # the launch: the GIL released around the driver call
        self.host_s.append(time.perf_counter() - t)
        return np.zeros((len(batch.logits_indices), VOCAB), np.float32)


def run(requests: int, prompt_len: int, launches: int, submit: str = "one", seed: int = 0) -> dict:
    """Submit `requests` prompts (`submit`: "one" a call each while the engine steps, "many" in one
    submit_many call); the submission's and the steps' host times."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, VOCAB, size=prompt_len).tolist() for _ in range(requests)]
    executor = LaunchingExecutor(launches, max_model_len=prompt_len + 64)
    config = SchedulerConfig(max_num_seqs=512, max_num_batched_tokens=8192, max_prefill_chunk=1024)
    with LLMEngine(executor, config) as engine:
        t = time.perf_counter()
        params = SamplingParams(max_tokens=32, ignore_eos=True)
        if submit == "many":
            handles = engine.submit_many(prompts, params)
        else:
            handles = [engine.submit(p, params) for p in prompts]
        submit_s = time.perf_counter() - t
        deadline = time.perf_counter() + 30
        while len(executor.host_s) < 12 and time.perf_counter() < deadline:
            time.sleep(0.01)
        for h in handles:
            h.cancel()
    steps = executor.host_s
    if len(steps) < 12:
        raise SystemExit(f"the engine ran {len(steps)} steps in 30 s; expected at least 12")
    alone = statistics.median(steps[6:12])
    return {
        "submit": submit,
        "requests": requests,
        "prompt_len": prompt_len,
        "launches_per_step": launches,
        "submit_loop_ms": submit_s * 1e3,
        "submit_us_per_request": submit_s / requests * 1e6,
        "first_steps_host_ms": [round(s * 1e3, 2) for s in steps[:4]],
        "step_host_ms_alone": alone * 1e3,
        "first_step_over_alone": steps[0] / alone,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1000, help="prompts submitted at once (default 1000)")
    ap.add_argument("--prompt-len", type=int, default=2048, help="ids a prompt (default 2048)")
    ap.add_argument("--launches", type=int, default=300, help="GIL-releasing launches a step (default 300)")
    ap.add_argument(
        "--submit", choices=("one", "many"), default="one", help="a submit call each (default) or submit_many"
    )
    ap.add_argument("--out", help="write the result here as JSON (whole: a temporary file, then renamed)")
    args = ap.parse_args()
    for name in ("requests", "prompt_len", "launches"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    result = run(args.requests, args.prompt_len, args.launches, args.submit)
    result["python"] = sys.version.split()[0]
    result["switch_interval_ms"] = sys.getswitchinterval() * 1e3
    print(
        f"[submit {result['submit']}] {result['requests']} prompts of {result['prompt_len']} ids submitted "
        f"in {result['submit_loop_ms']:.0f} ms "
        f"({result['submit_us_per_request']:.0f} us each); steps of {result['launches_per_step']} launches: "
        f"first {result['first_steps_host_ms']} ms of host time, {result['step_host_ms_alone']:.1f} ms with "
        f"nothing submitted ({result['first_step_over_alone']:.1f}x)"
    )
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
