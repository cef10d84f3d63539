"""Tensor parallelism: one model over N ranks, each a worker process running a sharded torch executor.

Design. The engine's process is the *driver*: it keeps the one scheduler and the one sampler and is no
rank itself. :class:`TensorParallelExecutor` implements the step protocol there: each step's
:class:`StepBatch` is pickled once and sent to every worker over its pipe; each worker (rank r of N,
started by torch.multiprocessing's spawn context) runs the step on its :class:`TorchExecutor`, which
holds rank r's share of the weights and of the KV heads (:mod:`trtforge.llm.models.parallel`) and runs
the all-reduces and the LM head's all-gather with ``torch.distributed`` (gloo on CPUs, NCCL with one
GPU per rank on CUDA). Rank 0 writes the gathered logits into a buffer it shares with the driver
once, at start (shared memory on the CPU, a CUDA IPC handle on GPU 0), and answers with the row count:
the logits never travel through the pipe, and the driver samples them in place.

Why the driver is no rank: it must never block in a collective. It waits on the workers' pipes and
process sentinels only (``multiprocessing.connection.wait``, with a step timeout), so a worker that
dies or fails (any worker error desynchronises the collectives) is seen at once: the driver kills the
remaining workers and raises :class:`~.base.ExecutorLostError`, on which the engine fails every request
it holds and stops. Nothing hangs on a dead peer, NCCL included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import socket
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

from trtforge.errors import UserError
from trtforge.llm.contract import DEFAULT_BLOCK_SIZE
from trtforge.llm.executors.base import ExecutorFacts, ExecutorLostError, StepBatch

#: rows of rank 0's first shared logits buffer (it grows when a step asks for more)
_LOGIT_ROWS = 256


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_world(world: Any) -> None:
    """UserError unless `world` is an integer >= 2 (one rank runs without workers)."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 2:
        raise UserError(
            f"tensor_parallel_size must be an integer >= 1 (2 or more splits the model), got {world!r}."
        )


def check_model(model: Any, world: int) -> None:
    """UserError, before any worker starts, when `world` is no integer >= 2 or `world` ranks cannot split
    the heads of `model` evenly: an nn.Module's config, or a save_pretrained directory's config.json (a
    factory, or a directory whose config does not load, is checked by the workers' loader and adapter).
    An nn.Module's adapter checks the rest (:meth:`~trtforge.llm.models.base.DecoderAdapter.check_shard`:
    a family or layer it does not split, an MLP width `world` does not divide) here too; a directory's
    model is checked so by each worker."""
    from torch import nn

    from trtforge.llm.models.families import adapter_for
    from trtforge.llm.models.parallel import check_divisible

    check_world(world)
    config = getattr(model, "config", None)
    if (
        config is None
        and isinstance(model, (str, os.PathLike))
        and os.path.isfile(os.path.join(model, "config.json"))
    ):
        import transformers

        try:
            config = transformers.AutoConfig.from_pretrained(
                str(model), local_files_only=True, trust_remote_code=False
            )
        except Exception:  # the workers' loader reports an unreadable directory
            return
    heads = getattr(config, "num_attention_heads", None)
    if heads is not None:  # (none: a family the adapter refuses with its own message)
        kv = getattr(config, "num_key_value_heads", None) or heads
        what = f"{getattr(config, 'model_type', 'the')} model"
        check_divisible(
            what,
            {"attention heads (num_attention_heads)": int(heads), "KV heads (num_key_value_heads)": int(kv)},
            world,
        )
    if isinstance(model, nn.Module):
        adapter_for(model, "tensor parallelism").check_shard(world)


def pick_device(device: str | None, world: int) -> tuple[str, str]:
    """(device kind, backend): "cpu" + gloo with at most one rank per CPU, or "cuda" + NCCL with one GPU
    per rank (UserError, before any worker starts, when the host has fewer CPUs or GPUs than ranks: a
    factory model's heads are only checked inside the workers, so 10**6 ranks started that many)."""
    import os

    import torch

    kind = "cuda" if device is None and torch.cuda.is_available() else str(device or "cpu").split(":")[0]
    if kind == "cpu":
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if world > cpus:
            raise UserError(
                f"tensor_parallel_size {world}: on the CPU each rank is a worker process with its share of "
                f"the CPUs, and this machine gives {cpus}; use tensor_parallel_size <= {cpus}."
            )
        return "cpu", "gloo"
    if kind != "cuda":
        raise UserError(f"tensor parallelism runs on 'cpu' or 'cuda', got device {device!r}.")
    count = torch.cuda.device_count()
    if world > count:
        raise UserError(
            f"tensor_parallel_size {world} needs one GPU per rank; this host has {count} CUDA device(s). "
            f"Use tensor_parallel_size <= {count}, or device='cpu'."
        )
    return "cuda", "nccl"


class TensorParallelExecutor:
    """The step protocol over `world` worker processes, each a rank of a sharded :class:`TorchExecutor`.

    `model`: an nn.Module (pickled to each worker), a save_pretrained directory or ``module:factory``
    (each worker loads it itself). `executor_kwargs` go to every rank's TorchExecutor. `num_blocks`
    None: each rank sizes its pool with ``size_pool(model, tensor_parallel=...)`` (e.g.
    :func:`trtforge.llm.sizing.torch_pool` partially applied) and the smallest wins. `step_timeout`
    bounds one step (first steps capture graphs and tune kernels: generous), `start_timeout` the start.
    Close it (:meth:`close`) to stop the workers; they are daemons, so they also end with the driver.
    """

    def __init__(
        self,
        model: Any,
        world: int,
        *,
        num_blocks: int | None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        device: str | None = None,
        dtype: Any = None,
        max_model_len: int | None = None,
        executor_kwargs: dict[str, Any] | None = None,
        size_pool: Any = None,
        start_timeout: float = 1800.0,
        step_timeout: float = 600.0,
    ) -> None:
        import torch.multiprocessing as mp

        check_model(model, world)
        kind, backend = pick_device(device, world)
        self.world, self.device, self.backend = world, kind, backend
        self.step_timeout = float(step_timeout)
        self._lost: ExecutorLostError | None = None
        self._closed = False
        options = {
            "num_blocks": num_blocks,
            "block_size": block_size,
            "dtype": dtype,
            "max_model_len": max_model_len,
            "executor_kwargs": dict(executor_kwargs or {}),
            "size_pool": size_pool,
        }
        ctx = mp.get_context("spawn")
        port = _free_port()
        self._conns, self._procs = [], []
        try:
            for rank in range(world):
                mine, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_worker_main,
                    args=(rank, world, port, kind, backend, model, options, theirs, os.getpid()),
                    name=f"trtforge-tp-rank{rank}",
                    daemon=True,
                )
                proc.start()
                theirs.close()
                self._conns.append(mine)
                self._procs.append(proc)
            self._start(start_timeout)
        except BaseException:
            self._stop_workers()
            raise

    # ---- start and stop --------------------------------------------------------------------------
    def _start(self, timeout: float) -> None:
        """Wait for every rank's ready message (its facts; rank 0's shared logits buffer too)."""
        facts: dict[int, ExecutorFacts] = {}
        deadline = time.monotonic() + timeout
        while len(facts) < self.world:
            left = deadline - time.monotonic()
            ready = wait(self._conns + [p.sentinel for p in self._procs], timeout=max(left, 0))
            if not ready:
                raise ExecutorLostError(f"the tensor-parallel workers did not start within {timeout:g} s")
            for rank, conn in enumerate(self._conns):
                if conn in ready and rank not in facts:
                    msg = self._recv(rank)
                    if msg[0] == "error" and isinstance(msg[1], UserError):
                        raise msg[1]  # the user's mistake, as the worker found it
                    if msg[0] == "error":
                        raise ExecutorLostError(
                            f"tensor-parallel worker rank {rank} failed to start: {msg[1]!r}\n"
                            f"worker traceback:\n{msg[2]}"
                        ) from msg[1]
                    if msg[0] == "died":
                        raise ExecutorLostError(self._death(rank, "while starting"))
                    facts[rank] = msg[1]
                    if rank == 0:
                        self._logits = msg[2]
            for rank, proc in enumerate(self._procs):
                if proc.sentinel in ready and rank not in facts and not self._conns[rank].poll():
                    raise ExecutorLostError(self._death(rank, "while starting"))
        # rank 0's facts with the whole model's KV heads and pool bytes (every other field is shared)
        self.facts = dataclasses.replace(
            facts[0],
            num_kv_heads=sum(x.num_kv_heads for x in facts.values()),
            kv_pool_bytes=sum(x.kv_pool_bytes for x in facts.values()),
            tensor_parallel_size=self.world,
        )
        self.rank_facts = [facts[r] for r in range(self.world)]

    def _recv(self, rank: int) -> tuple:
        try:
            return self._conns[rank].recv()
        except (EOFError, OSError):
            return ("died",)

    def _death(self, rank: int, when: str) -> str:
        proc = self._procs[rank]
        proc.join(timeout=2.0)
        code = proc.exitcode
        if code is None:
            how = "its pipe closed; still exiting"
        else:
            how = f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
        return f"tensor-parallel worker rank {rank} (pid {proc.pid}) died {when} ({how})"

    def close(self) -> None:
        """Stop the workers (asked first, then terminated, then killed: a few seconds at most)."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send_bytes(pickle.dumps(("stop",)))
        self._stop_workers(grace=5.0)

    def _stop_workers(self, grace: float = 0.0) -> None:
        deadline = time.monotonic() + grace
        for proc in self._procs:
            proc.join(timeout=max(deadline - time.monotonic(), 0))
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10.0)  # SIGKILL cannot be ignored: only a loaded machine's reaping waits
        for conn in self._conns:
            conn.close()
        self._closed = True

    def _fail(self, message: str) -> ExecutorLostError:
        """Record the loss, stop every worker at once (some may be stuck in a collective), and return
        the error to raise."""
        self._lost = ExecutorLostError(
            f"{message}; the tensor-parallel group cannot run further steps and was shut down"
        )
        self._stop_workers()
        return self._lost

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self._stop_workers()

    # ---- the step protocol -----------------------------------------------------------------------
    def step(self, batch: StepBatch) -> Any:
        """Send the batch to every rank; return rank 0's logits ``[N, vocab]`` (float32, in the buffer
        it shares with the driver, valid until the next step)."""
        if self._lost is not None:
            raise self._lost
        if self._closed:
            raise ExecutorLostError("the tensor-parallel executor is closed")
        payload = pickle.dumps(("step", batch), protocol=pickle.HIGHEST_PROTOCOL)
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(payload)
            except (OSError, ValueError):
                raise self._fail(self._death(rank, "before a step")) from None
        watched = self._conns + [p.sentinel for p in self._procs]
        ready = wait(watched, timeout=self.step_timeout)
        if not ready:
            raise self._fail(f"a step did not finish within {self.step_timeout:g} s (a worker hangs)")
        if self._conns[0] in ready:
            msg = self._recv(0)
            if msg[0] == "ok":
                if msg[2] is not None:
                    self._logits = msg[2]  # rank 0 grew its buffer
                return self._logits[: msg[1]]
            raise self._fail(self._what_went_wrong({0: msg}, ready))
        raise self._fail(self._what_went_wrong({}, ready))

    def _what_went_wrong(self, msgs: dict[int, tuple], ready: list) -> str:
        """The root cause of an abnormal step: a worker that died without a word (killed: the others'
        errors follow from it, their collectives lost a peer), else the errors the workers reported
        (a failing worker reports, then exits)."""
        for proc in self._procs:
            if proc.sentinel in ready:  # exiting: its sentinel fires before the OS can reap it
                proc.join(timeout=2.0)
        for rank, conn in enumerate(self._conns):
            if rank not in msgs and conn.poll():
                msgs[rank] = self._recv(rank)
        for rank, proc in enumerate(self._procs):  # a closed pipe without an error: it is exiting
            said = msgs.get(rank, ("",))[0]
            if said == "died" or (said != "error" and not proc.is_alive()):
                return self._death(rank, "during a step")
        errors = [
            f"tensor-parallel worker rank {rank} failed a step: {msg[1]!r}\nworker traceback:\n{msg[2]}"
            for rank, msg in sorted(msgs.items())
            if msg[0] == "error"
        ]
        return "; ".join(errors) or "a tensor-parallel worker closed its pipe during a step"


# ---- the worker (rank) side ----------------------------------------------------------------------
def _worker_main(
    rank: int,
    world: int,
    port: int,
    kind: str,
    backend: str,
    source: Any,
    options: dict,
    conn: Any,
    driver: int,
) -> None:
    """One rank of the driver whose process id is `driver`: join the group, load and shard the model,
    build its executor, then run steps."""
    _tie_to_driver(driver)  # (first: importing torch alone takes seconds, in which the driver may die)
    import torch
    import torch.distributed as dist

    try:
        if kind == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        else:
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=600),
        )
        executor = _build_rank(rank, world, kind, source, options)
        buffer = _logits_buffer(executor, _LOGIT_ROWS) if rank == 0 else None
        conn.send(("ready", executor.facts, buffer))
        _serve(rank, executor, buffer, conn)
        dist.destroy_process_group()
        os._exit(0)  # nothing to flush; the interpreter's teardown of torch takes seconds
    except BaseException as exc:  # every failure is reported to the driver (unless it is gone)
        with contextlib.suppress(Exception):
            conn.send(("error", _portable(exc), traceback.format_exc()))
        os._exit(1)  # never run atexit hooks of a half-initialised process group


def _tie_to_driver(driver: int) -> None:
    """A worker's life belongs to the driver (process id `driver`, its parent): Ctrl-C in a terminal
    (SIGINT to the whole process group) reaches the driver alone, which drains and then stops its
    workers; and on Linux the kernel kills the worker if the driver dies without stopping it (a rank
    stuck in an NCCL collective would otherwise outlive it). A driver already gone when that is set up
    (killed while its workers started: the kernel signals only a death after it) ends the worker here,
    before it loads its share of the model: gigabytes of (GPU) memory a run started again would find
    taken."""
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != driver:  # (orphaned: nobody to report to, and nothing of the model loaded yet)
        os._exit(1)


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it pickles (a UserError stays one for the caller), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # an exception carrying unpicklable state
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _build_rank(rank: int, world: int, kind: str, source: Any, options: dict) -> Any:
    import torch
    import torch.distributed as dist

    from trtforge.llm.executors.torch_exec import TorchExecutor
    from trtforge.llm.models.families import adapter_for
    from trtforge.llm.models.loader import load_causal_lm
    from trtforge.llm.models.parallel import TensorParallel

    if isinstance(source, (str, os.PathLike)):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # N ranks' loading bars; tqdm's lock would outlive os._exit
    tp = TensorParallel(rank, world)
    device = torch.device(kind, rank) if kind == "cuda" else torch.device("cpu")
    # every rank is up, and NCCL's communicator exists before any CUDA graph captures a collective
    dist.all_reduce(torch.zeros(1, device=device))
    lm = load_causal_lm(source)
    adapter_for(lm, "tensor parallelism").shard(tp)  # on the host, before the device sees any weight
    if any(p.is_meta for p in lm.parameters()):
        materialize_random(lm, device, options["dtype"])
    num_blocks = options["num_blocks"]
    if num_blocks is None:
        if options["size_pool"] is None:
            raise UserError("tensor parallelism needs num_blocks, or a size_pool to size each rank's pool.")
        lm.to(device=device, dtype=options["dtype"])
        mine = torch.tensor([int(options["size_pool"](lm, tensor_parallel=tp).num_blocks)], device=device)
        dist.all_reduce(mine, op=dist.ReduceOp.MIN)  # every rank's pool has the same blocks
        num_blocks = int(mine.item())
    return TorchExecutor(
        lm,
        num_blocks=num_blocks,
        block_size=options["block_size"],
        device=device,
        dtype=options["dtype"],
        max_model_len=options["max_model_len"],
        tensor_parallel=tp,
        **options["executor_kwargs"],
    )


def materialize_random(lm: Any, device: Any, dtype: Any) -> None:
    """Give a shape-only (meta) model random weights on `device` in `dtype`, after sharding (benchmarks
    build a model too large for one device this way): N(0, 0.02) matrices, unit norms and zero biases,
    and the rotary tables recomputed (they are buffers derived from the config)."""
    import torch

    if dtype is not None:
        lm.to(dtype=dtype)  # still on meta: allocate in the final dtype only
    lm.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
        for module in lm.modules():
            if type(module).__name__.endswith("RotaryEmbedding") and hasattr(module, "inv_freq"):
                fresh = type(module)(module.config)
                module.inv_freq = fresh.inv_freq.to(device)
                if hasattr(module, "original_inv_freq"):
                    module.original_inv_freq = fresh.inv_freq.to(device)


def _logits_buffer(executor: Any, rows: int) -> Any:
    """Rank 0's logits buffer the driver reads: shared memory on the CPU, GPU 0 memory (CUDA IPC)."""
    import torch

    buf = torch.zeros((rows, executor.facts.vocab_size), dtype=torch.float32, device=executor.device)
    return buf.share_memory_() if buf.device.type == "cpu" else buf


def _serve(rank: int, executor: Any, buffer: Any, conn: Any) -> None:
    """Run the driver's steps until it says stop (or goes away); rank 0 answers each with its rows."""
    import torch

    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the driver is gone
        if msg[0] == "stop":
            return
        logits = executor.step(msg[1])
        if rank != 0:
            continue
        n, grown = int(logits.shape[0]), None
        if n > buffer.shape[0]:
            buffer = grown = _logits_buffer(executor, max(n, 2 * buffer.shape[0]))
        buffer[:n].copy_(logits)
        if buffer.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # the driver reads it from another process
        conn.send(("ok", n, grown))
