"""A real `trtforge serve` process on 127.0.0.1 for the server tests, over the trained 21M model.

The model is ``<repo root>/../shared/models/code-llama-21m``; tests skip with the reason when absent.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT.parent / "shared" / "models" / "code-llama-21m"
API_KEY = "sk-trtforge-test"
# a template of our own: the trained model ships none
CHAT_TEMPLATE = (
    "{% for m in messages %}# {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}# assistant:{% endif %}"
)


def need_model() -> Path:
    if not MODEL.is_dir():
        pytest.skip(f"the trained model is absent: {MODEL} (../shared/models beside the repo)")
    pytest.importorskip("fastapi", reason="trtforge serve needs the [serve] extra (fastapi)")
    pytest.importorskip("openai", reason="the server tests use the official openai client ([dev] extra)")
    return MODEL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`trtforge serve MODEL ARGS` in a subprocess; its stderr goes to a file the tests read."""

    def __init__(self, model: str, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 (closed in stop)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "trtforge.cli.main", "serve", model, "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 120.0) -> None:
        import httpx

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"the server did not come up in {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        import httpx

        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def wait_blocks_free(self, timeout: float = 20.0) -> dict[str, float]:
        """The metrics once no sequence runs or waits and no KV block is held (AssertionError if never)."""
        end = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = m["trtforge_num_requests_running"] == 0 and m["trtforge_num_requests_waiting"] == 0
            if idle and m["trtforge_kv_cache_blocks_used"] == 0:
                return m
            if time.monotonic() > end:
                raise AssertionError(f"blocks still held after {timeout} s: {m}")
            time.sleep(0.1)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def wait_for(cond: Callable[[], bool], timeout: float = 60.0) -> None:
    """Returns once `cond()` holds; AssertionError past `timeout` seconds (a hang guard, not a measure)."""
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {getattr(cond, '__name__', cond)}"
        time.sleep(0.05)


@contextlib.contextmanager
def chat_server(tmp: Path, args: list[str]) -> Iterator[Server]:
    """A server over the trained model with :data:`CHAT_TEMPLATE` and `args`, its files in `tmp`; on
    leaving, it must stop with exit code 0 and have logged no traceback."""
    model = need_model()
    (tmp / "chat.jinja").write_text(CHAT_TEMPLATE)
    s = Server(str(model), ["--chat-template", str(tmp / "chat.jinja"), *args], tmp / "server.log")
    yield s
    assert s.stop() == 0, s.log()
    assert "Traceback" not in s.log(), s.log()
