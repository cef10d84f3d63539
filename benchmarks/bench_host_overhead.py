"""Host time per serving step, by phase, of this tree against a baseline commit, in one run.

    PYTHONPATH=. python benchmarks/bench_host_overhead.py --baseline dd9c347 --out host_overhead.json

The real Scheduler, BlockManager, sampler and LLMEngine run over a null executor (the StepExecutor
protocol, no model: it hands back precomputed float32 logits rows of a 32000-token vocabulary as
torch CPU tensors). The baseline's ``trtforge`` is extracted with ``git archive`` and imported
beside this tree's; both run the same trace, a step of one then a step of the other, so noise on a
shared machine hits both alike. Phases per step (median ms): schedule (planning: ``Scheduler._plan``,
``_schedule`` before the step loop's split), build (``StepPlan.make_batch``, before ``_build_batch``),
launch (the null executor), sample (``sample``), bookkeeping (the rest of the step: applying tokens),
total, and total less sample (per step, then the median). Every step's sampled tokens of the two
trees are checked equal. Either tree may have either layout (``trtforge.llm.scheduler`` stepping
itself, or ``trtforge.llm.sched`` plans run by ``trtforge.llm.loop``).

    PYTHONPATH=. python benchmarks/bench_host_overhead.py --baseline b24eb17 --batches 256,512,1024 \
        --params greedy --async-loop --vocab 1024 --clock thread --out host_overhead_large.json

``--async-loop`` runs the asynchronous loop the GPU serves with (one step in flight, tokens fed on the
"device"; its sample phase is ``sample_async``), ``--clock thread`` times with the thread's CPU time (a
loaded, shared machine preempts the process; CPU time counts the host work only), ``--vocab`` shrinks
the null logits (their CPU argmax is no GPU cost), ``--params`` picks the sampling cases.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 32000
BLOCK_SIZE = 16
PHASES = ("schedule", "build", "launch", "sample", "bookkeeping", "total", "host_wo_sample")


def load_tree(root: Path) -> SimpleNamespace:
    """Import the serving modules of the trtforge under `root`, detached from sys.modules afterwards."""
    for name in [m for m in sys.modules if m == "trtforge" or m.startswith("trtforge.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        split = (root / "trtforge" / "llm" / "loop.py").exists()
        names = {"sampling": "sampling", "engine": "engine"}
        moved = (root / "trtforge" / "llm" / "sched").is_dir()
        names["scheduler"] = "sched.scheduler" if moved else "scheduler"
        if split:
            names.update(plan="sched.plan", loop="loop")
        if (root / "trtforge" / "llm" / "async_loop.py").exists():
            names["async_loop"] = "async_loop"
        if (root / "trtforge" / "llm" / "executors" / "base.py").exists():
            names["executor"] = "executors.base"  # ExecutorFacts, which later trees' schedulers read
        mods = {short: importlib.import_module(f"trtforge.llm.{name}") for short, name in names.items()}
        mods["split"] = split
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == "trtforge" or m.startswith("trtforge.")]:
            del sys.modules[name]
    return SimpleNamespace(**mods)


def extract_baseline(ref: str, dest: Path) -> str:
    """Write `ref`'s trtforge/ under `dest`; return the full commit id."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", ref], check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "trtforge"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return commit


class NullExecutor:
    """The StepExecutor protocol without a model: returns the first N rows of fixed random logits."""

    def __init__(self, num_blocks: int, max_rows: int, seed: int = 0, facts_type: type | None = None) -> None:
        # trees before the executor facts read these attributes; later ones read `facts`
        self.num_blocks = num_blocks
        self.block_size = BLOCK_SIZE
        self.vocab_size = VOCAB
        self.max_model_len = 8192
        self.eos_token_id = None
        if facts_type is not None:
            self.facts = facts_type(
                num_blocks=num_blocks,
                block_size=BLOCK_SIZE,
                vocab_size=VOCAB,
                max_model_len=8192,
                eos_token_ids=(),
                num_layers=0,
                num_kv_heads=0,
                head_dim=0,
                kv_dtype="float32",
                kv_element_bytes=4,
                kv_pool_bytes=0,
            )
        gen = torch.Generator().manual_seed(seed)
        self._logits = torch.randn(max_rows, VOCAB, generator=gen) * 3

    def step(self, batch):
        return self._logits[: len(batch.logits_indices)]


class AsyncNullExecutor(NullExecutor):
    """The null executor offering ``step_async``, so the engine runs its asynchronous loop (one step in
    flight, tokens fed "on the device"), the loop the GPU serving path runs; the logits are host tensors."""

    def step_async(self, batch, feed):
        return self._logits[: len(batch.logits_indices)]


def facts_type(tree: SimpleNamespace) -> type | None:
    """The tree's ExecutorFacts class, or None for trees from before it (executors read as attributes)."""
    return getattr(getattr(tree, "executor", None), "ExecutorFacts", None)


EXECUTOR: list[type] = [NullExecutor]  # the null executor class the cases run (main picks it)
# the phase timers' clock: wall time, or this thread's CPU time (--clock thread: a shared, loaded machine
# preempts the process; CPU time counts only the host work itself)
CLOCK = [time.perf_counter]


def make_stepper(tree: SimpleNamespace, executor, config):
    """What steps: the step loop over a scheduler (split layout) or the scheduler itself (before)."""
    if tree.split:
        return tree.engine.make_step_loop(executor, config)
    return tree.scheduler.Scheduler(executor, config)


def scheduler_of(tree: SimpleNamespace, stepper):
    return stepper.scheduler if tree.split else stepper


class PhaseTimer:
    """Host timers around one stepper's phases (instance and class wrappers plus its module's `sample`)."""

    def __init__(self, tree: SimpleNamespace, sched) -> None:
        self.cur: dict[str, float] = defaultdict(float)
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.tree = tree
        self.sched = sched
        if tree.split:
            sched.scheduler._plan = self._wrap(sched.scheduler._plan, "schedule")
            plan_cls = tree.plan.StepPlan
            plan_cls.make_batch = self._wrap(plan_cls.make_batch, "build")
        else:
            sched._schedule = self._wrap(sched._schedule, "schedule")
            sched._build_batch = self._wrap(sched._build_batch, "build")
        launch = "step_async" if getattr(sched, "async_scheduling", False) else "step"
        setattr(sched.executor, launch, self._wrap(getattr(sched.executor, launch), "launch"))
        self._sample_module = tree.loop if tree.split else tree.scheduler
        # the sampler the step calls: sample_async in the asynchronous loop, sample_with_logprobs in trees
        # with logprobs, else sample
        if launch == "step_async":
            self._sample_module = tree.async_loop
        names = ("sample_async", "sample_with_logprobs", "sample")
        self._sample_name = next(n for n in names if hasattr(self._sample_module, n))
        self._sample = getattr(self._sample_module, self._sample_name)

    def _wrap(self, fn, name):
        def timed(*args, **kwargs):
            t0 = CLOCK[0]()
            out = fn(*args, **kwargs)
            self.cur[name] += CLOCK[0]() - t0
            return out

        return timed

    def step(self, record: bool) -> list:
        self.cur.clear()
        setattr(self._sample_module, self._sample_name, self._wrap(self._sample, "sample"))
        try:
            t0 = CLOCK[0]()
            outs = self.sched.step()
            total = CLOCK[0]() - t0
        finally:
            setattr(self._sample_module, self._sample_name, self._sample)
        if record:
            for k in ("schedule", "build", "launch", "sample"):
                self.samples[k].append(self.cur[k])
            self.samples["bookkeeping"].append(total - sum(self.cur.values()))
            self.samples["total"].append(total)
            # on a GPU the sampler's argmax/sort are kernels; on this CPU they are compute, so apart
            self.samples["host_wo_sample"].append(total - self.cur["sample"])
        return outs

    def medians(self) -> dict[str, float]:
        return {k: float(np.median(self.samples[k])) * 1e3 for k in PHASES}


def make_params(tree, kind: str, i: int):
    sp = tree.sampling.SamplingParams
    if kind == "greedy" or (kind == "mixed-params" and i % 3 == 0):
        return sp(max_tokens=100_000, ignore_eos=True)
    if kind == "sampled" or i % 3 == 1:
        return sp(max_tokens=100_000, ignore_eos=True, temperature=0.8, top_p=0.95, seed=1000 + i)
    return sp(max_tokens=100_000, ignore_eos=True, temperature=1.0, top_k=50, seed=1000 + i)


def run_case(trees: dict, batch: int, kind: str, steps: int, prefill: bool, warmup: int = 5) -> dict:
    """Run both trees side by side: `batch` running sequences, decode steps (plus one new prompt per
    step when `prefill`: the oldest request is aborted and a 512-token prompt joins)."""
    rng = np.random.default_rng(batch)
    prompts = [rng.integers(0, VOCAB, size=int(rng.integers(64, 512))).tolist() for _ in range(batch)]
    fresh = [rng.integers(0, VOCAB, size=512).tolist() for _ in range(steps + warmup)]
    num_blocks = (batch + 2) * (512 + steps + warmup + 64) // BLOCK_SIZE
    state = {}
    for name, tree in trees.items():
        config = tree.scheduler.SchedulerConfig(
            max_num_seqs=batch + 1, max_num_batched_tokens=max(2048, batch + 512), seed=0
        )
        sched = make_stepper(
            tree,
            EXECUTOR[0](num_blocks, batch + 1, facts_type=facts_type(tree)),
            config,
        )
        inner = scheduler_of(tree, sched)
        for i, p in enumerate(prompts):
            sched.add_request(i, p, make_params(tree, kind, i))
        while inner.num_waiting or any(len(s.tokens) == s.prompt_len for s in inner._running):
            sched.step()  # prefill everyone (untimed)
        state[name] = PhaseTimer(tree, sched)
    for step in range(steps + warmup):
        tokens = {}
        for name, tree in trees.items():
            timer = state[name]
            if prefill:
                sched = timer.sched
                sched.abort(scheduler_of(tree, sched).running_request_ids()[0])
                sched.add_request(f"new{step}", fresh[step], make_params(tree, kind, batch + step))
            outs = timer.step(record=step >= warmup)
            tokens[name] = [(o.request_id, o.new_token_ids) for o in outs]
        first = next(iter(tokens.values()))
        assert all(t == first for t in tokens.values()), f"trees disagree at step {step}"
    running = {name: scheduler_of(trees[name], s.sched).num_running for name, s in state.items()}
    return {"medians": {name: s.medians() for name, s in state.items()}, "running": running}


def run_engine_case(trees: dict, batch: int, steps: int) -> dict:
    """LLMEngine (its thread, inbox and handles) with `batch` greedy requests of `steps` tokens each:
    median ms of a decode step and of its dispatch to the handles, and wall ms per generated step
    (prompts of 128 tokens included)."""
    result = {}
    prompts = [np.random.default_rng(i).integers(0, VOCAB, size=128).tolist() for i in range(batch)]
    for rnd in range(2):
        for name, tree in trees.items():
            config = tree.scheduler.SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=4096)
            blocks = batch * (128 + steps + 32) // BLOCK_SIZE + 8
            engine = tree.engine.LLMEngine(EXECUTOR[0](blocks, batch, facts_type=facts_type(tree)), config)
            times: dict[str, list[float]] = defaultdict(list)
            stepper = engine._steps if tree.split else engine._scheduler

            def wrap(obj, attr, key, times=times):
                fn = getattr(obj, attr)

                def timed(*a, **k):
                    t0 = time.perf_counter()
                    out = fn(*a, **k)
                    times[key].append(time.perf_counter() - t0)
                    return out

                setattr(obj, attr, timed)

            wrap(stepper, "step", "step")
            wrap(engine, "_dispatch", "dispatch")
            params = tree.sampling.SamplingParams(max_tokens=steps, ignore_eos=True)
            t0 = time.perf_counter()
            handles = [engine.submit(p, params) for p in prompts]
            for h in handles:
                h.completion()
            wall = time.perf_counter() - t0
            engine.close()
            if rnd == 1:
                decode = slice(2, None)  # past the prefill steps
                result[name] = {
                    "step_ms": float(np.median(times["step"][decode])) * 1e3,
                    "dispatch_ms": float(np.median(times["dispatch"][decode])) * 1e3,
                    "wall_ms_per_token_step": wall / steps * 1e3,
                }
    return result


def machine() -> dict:
    info = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__}
    try:
        text = Path("/proc/cpuinfo").read_text()
        model = next(line.split(":", 1)[1].strip() for line in text.splitlines() if "model name" in line)
        flags = next(line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags"))
        isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "amx_tile") if f in flags]
        info.update(cpu=model, isa=isa, cores=text.count("processor\t:"))
    except (OSError, StopIteration):
        info.update(cpu=platform.processor() or platform.machine())
    info["torch_threads"] = torch.get_num_threads()
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="dd9c347", help="git ref whose trtforge/ is the 'before'")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per greedy case")
    ap.add_argument("--sampled-steps", type=int, default=10, help="timed steps per sampled case")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--params", default="greedy,mixed-params,sampled", help="which sampling-params cases")
    ap.add_argument(
        "--async-loop",
        action="store_true",
        help="run the asynchronous loop (what the GPU serves with) instead of the synchronous one",
    )
    ap.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="phase timers: wall time, or the thread's CPU time (steadier on a shared machine)",
    )
    ap.add_argument(
        "--vocab", type=int, default=VOCAB, help="logit columns (the CPU argmax grows with it; apart anyway)"
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    globals()["VOCAB"] = args.vocab
    EXECUTOR[0] = AsyncNullExecutor if args.async_loop else NullExecutor
    CLOCK[0] = time.thread_time if args.clock == "thread" else time.perf_counter
    kinds = args.params.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        commit = extract_baseline(args.baseline, Path(tmp))
        trees = {"before": load_tree(Path(tmp)), "after": load_tree(ROOT)}
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        report = {
            "machine": machine(),
            "baseline": commit,
            "head": head,
            "args": {k: str(v) for k, v in vars(args).items()},
            "cases": [],
        }
        print(json.dumps(report["machine"]))
        print(f"before = {commit[:10]}, after = working tree at {head}")
        cases = [("decode", "greedy", b, args.steps, False) for b in batches if "greedy" in kinds]
        cases += [
            ("decode", k, b, args.sampled_steps, False)
            for k in ("mixed-params", "sampled")
            if k in kinds
            for b in batches
        ]
        cases += [
            ("prefill+decode", "greedy", b, args.steps, True) for b in batches if b > 1 and "greedy" in kinds
        ]
        for label, kind, b, steps, prefill in cases:
            res = run_case(trees, b, kind, steps, prefill)
            row = {"case": label, "params": kind, "batch": b, "steps": steps, **res}
            report["cases"].append(row)
            bm, am = res["medians"]["before"], res["medians"]["after"]
            cells = "  ".join(f"{k} {bm[k]:.3f}->{am[k]:.3f}" for k in PHASES)
            ratio = bm["host_wo_sample"] / am["host_wo_sample"]
            print(f"{label:15s} {kind:12s} B={b:<4d} {cells}  host w/o sample x{ratio:.2f}")
            sys.stdout.flush()
        for b in batches:
            res = run_engine_case(trees, b, args.steps)
            report["cases"].append({"case": "engine", "params": "greedy", "batch": b, **res})
            print(f"engine B={b}: " + json.dumps(res))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
