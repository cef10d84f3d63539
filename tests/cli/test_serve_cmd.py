"""`trtforge serve` refuses bad input before it loads anything: exit 2, one message, no traceback."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtforge.cli.main import main

pytest.importorskip("fastapi", reason="trtforge serve needs the [serve] extra (fastapi)")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "/no/such/model-dir"], "MODEL '/no/such/model-dir' does not exist"),
        (["serve", b"caf\xe9".decode("utf-8", "surrogateescape")], "MODEL is not valid UTF-8"),
        (["serve", ".", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["serve", ".", "--port", "70000"], "--port"),
        (["serve", ".", "--max-num-seqs", "0"], "--max-num-seqs"),
        (["serve", ".", "--max-prefill-tokens-with-decodes", "0"], "--max-prefill-tokens-with-decodes"),
        (["serve", ".", "--max-num-seqs", str(10**23)], "'--max-num-seqs': 1000000000000000000000"),
        (["serve", ".", "--max-num-batched-tokens", str(2**21)], "2097152 is more than 1,048,576"),
        (["serve", ".", "--chat-template", "/no/such.jinja"], "--chat-template"),
        # before: a prefill cap past the step's token budget was taken silently and ran as that budget
        (
            [
                "serve",
                "/no/such",
                "--max-num-batched-tokens",
                "512",
                "--max-prefill-tokens-with-decodes",
                "1024",
            ],
            "--max-prefill-tokens-with-decodes 1024 exceeds --max-num-batched-tokens 512: a step takes",
        ),
        (
            ["serve", "/no/such", "--max-prefill-tokens-with-decodes", "8192"],
            "8192 exceeds --max-num-batched-tokens 4096 (its default)",
        ),
        # before: an empty key (an unset $KEY) matched a request with no Authorization header: open to all
        (["serve", "/no/such", "--api-key", ""], "--api-key '': expected a non-empty key"),
        # before: an empty host (an unset $HOST) listened on every interface
        (["serve", "/no/such", "--host", ""], "--host '': expected an address or host name"),
        (["serve", "/no/such", "--host", " "], "--host ' ': expected an address or host name"),
        (["serve", "/no/such", "--api-key", " sk-x"], "--api-key ' sk-x': expected"),  # never matched
        (["serve", "/no/such", "--api-key", "sk-ключ"], "--api-key 'sk-ключ': expected"),  # never matched
        (["serve", "/no/such", "--served-model-name", ""], "--served-model-name '': expected a name"),
        # before: NaN passed the > 0 range: every request timed out at once (or a drain never ended)
        (["serve", "/no/such", "--request-timeout", "nan"], "--request-timeout nan: expected a number"),
        (["serve", "/no/such", "--body-timeout", "nan"], "--body-timeout nan: expected a number"),
        (["serve", "/no/such", "--head-timeout", "nan"], "--head-timeout nan: expected a number"),
        (["serve", "/no/such", "--head-timeout", "0"], "--head-timeout"),
        (["serve", "/no/such", "--send-timeout", "nan"], "--send-timeout nan: expected a number"),
        (["serve", "/no/such", "--send-timeout", "0"], "--send-timeout"),
        (["serve", "/no/such", "--shutdown-grace", "nan"], "--shutdown-grace nan: expected a number"),
        # a browser's Origin has no path: with the trailing slash no page was ever granted CORS
        (["serve", "/no/such", "--allowed-origins", "http://localhost:3000/"], "--allowed-origins 'http"),
        (["serve", "/no/such", "--allowed-origins", "localhost:3000"], "scheme://host[:port]"),
    ],
)
def test_bad_input_exits_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-num-seqs", "9" * 5000], "(5,000 characters): expected an integer in the range x>=1"),
        (["--port", "7" * 4300], "(4,300 characters): expected an integer in the range 0<=x<=65535"),
        (["--request-timeout", "x" * 10_000], "(10,000 characters): expected a number in the range x>0"),
        (["--max-num-seqs", "9" * 100], "(100 digits) is more than 65,536"),
        (["--api-key", " " + "k" * 10_000], "(10,001 characters): expected a non-empty key"),
        (["--served-model-name", "\n" * 10_000], "(10,000 characters): expected a name"),
    ],
)
def test_a_huge_option_value_is_quoted_short(capsys, argv, message):
    """Before: click and the option checks quoted the whole value (past 4,300 digits, click's failed
    int() was quoted instead)."""
    assert main(["serve", "/no/such", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert len(err) < 400, err


TRAINED = Path(__file__).resolve().parents[2].parent / "shared" / "models" / "code-llama-21m"


@pytest.mark.skipif(not TRAINED.is_dir(), reason=f"the trained model {TRAINED} is absent")
def test_a_draft_model_that_cannot_load_is_named_as_the_flag(capsys):
    """The loader's refusal of the draft read as MODEL's ("cannot import module ..."); it names
    --speculative-model, before the target's weights load."""
    argv = ["serve", str(TRAINED), "--port", "0", "--speculative-model", "nosuch_pkg.module:factory"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: --speculative-model: cannot import module 'nosuch_pkg.module'" in err, err
    assert "Traceback" not in err


@pytest.mark.skipif(not TRAINED.is_dir(), reason=f"the trained model {TRAINED} is absent")
def test_a_factory_targets_draft_is_compared_through_its_tokenizer_option(capsys, tmp_path):
    """As generate does: a module:factory target's tokenizer is --tokenizer's, and a draft of another
    tokenizer is refused before either model loads (before: the server started with it, every proposal
    of the draft rejected)."""
    from tests.cli.test_generate_speculative import draft_with_tokenizer, permute_regular_ids

    draft = draft_with_tokenizer(tmp_path / "draft", permute_regular_ids)
    argv = ["serve", "tests.cli.test_generate_speculative:trained_target_factory", "--port", "0"]
    argv += ["--tokenizer", str(TRAINED), "--speculative-model", str(draft)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"and the target '--tokenizer {TRAINED}' have different tokenizers" in err, err
    assert "Traceback" not in err


def test_an_empty_chat_template_is_refused(tmp_path, capsys):
    empty = tmp_path / "chat.jinja"
    empty.write_text("  \n")
    assert main(["serve", str(tmp_path), "--chat-template", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err


def test_a_chat_template_that_is_not_jinja_is_refused_naming_its_line(tmp_path, capsys):
    """Before: the server started, and every chat request got a 400 blaming the client for the template."""
    bad = tmp_path / "chat.jinja"
    bad.write_text("{% for m in messages %}\n{{ m['content'] }}\n")
    assert main(["serve", "/no/such", "--chat-template", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"--chat-template '{bad}': not a valid Jinja template, line 2:" in err, err
    assert "Traceback" not in err


def test_a_chat_template_of_transformers_extensions_is_accepted(tmp_path):
    """Loop controls and the {% generation %} tag are Jinja as transformers compiles chat templates."""
    from trtforge.llm.text import read_chat_template

    ok = tmp_path / "chat.jinja"
    ok.write_text(
        "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}"
        "{% if loop.last %}{% break %}{% endif %}{% endfor %}"
    )
    assert read_chat_template(ok) == ok.read_text()


@pytest.fixture
def tokenizer_with_bad_template(tmp_path) -> Path:
    """The bundled demo tokenizer saved with a chat template that is not Jinja (line 2: ``}`` alone)."""
    from trtforge.calibration.data import DEMO_TOKENIZER, resolve_tokenizer

    tok = resolve_tokenizer(DEMO_TOKENIZER)
    tok.chat_template = "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}"
    tok.save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


# `trtforge serve` of the tiny llama on the CPU (to which each test adds its own flags)
TINY_SERVE = (
    "serve",
    "tests.llm.tiny_models:llama_factory",
    "--device",
    "cpu",
    "--num-blocks",
    "8",
    "--port",
    "0",
)


def _no_server(monkeypatch) -> list:
    """Stand in for the server's run: (llm, options) of each call, the llm closed."""
    import importlib

    server_run = importlib.import_module("trtforge.llm.server.run")  # (the package exports a function `run`)
    served: list = []

    def run(llm, tok, name, options, **kw):
        served.append((llm, options))
        llm.close()

    monkeypatch.setattr(server_run, "run", run)
    return served


def test_a_tokenizers_own_chat_template_that_is_not_jinja_is_refused_naming_its_line(
    tokenizer_with_bad_template, monkeypatch, capsys
):
    """Before: the server started, answered /health and completions, and every chat request got a 400
    that blamed the client for the template the tokenizer shipped. Refused before the model loads."""
    served = _no_server(monkeypatch)
    argv = [*TINY_SERVE, "--tokenizer", str(tokenizer_with_bad_template)]
    assert main(argv) == 2 and not served
    err = capsys.readouterr().err
    where = f"the chat template of --tokenizer '{tokenizer_with_bad_template}' (chat_template.jinja)"
    assert f"{where}: not a valid Jinja template, line 2: unexpected '}}'" in err, err
    assert "Give --chat-template FILE" in err and "Traceback" not in err


def test_a_chat_template_given_replaces_the_tokenizers_broken_one(
    tokenizer_with_bad_template, tmp_path, monkeypatch
):
    """--chat-template FILE is what chats are rendered with: the tokenizer's own, unused, is no error."""
    served = _no_server(monkeypatch)
    good = tmp_path / "chat.jinja"
    good.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    argv = [*TINY_SERVE, "--tokenizer", str(tokenizer_with_bad_template), "--chat-template", str(good)]
    assert main(argv) in (0, None)
    ((_, options),) = served
    assert options.chat_template == good.read_text()


MODEL = Path(__file__).resolve().parents[2] / ".." / "shared" / "models" / "code-llama-21m"


@contextlib.contextmanager
def _live_server(tmp_path: Path, model: str) -> Iterator[tuple[str, int]]:
    """`trtforge serve MODEL --port 0` on the CPU in a child process: yields the URL and port its startup
    line names; then SIGTERM, and the server must exit 0 without a traceback."""
    log = tmp_path / "serve.log"
    argv = [sys.executable, "-m", "trtforge.cli.main", "serve", model, "--device", "cpu"]
    argv += ["--num-blocks", "64", "--max-num-seqs", "2", "--port", "0"]
    with open(log, "wb") as out:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.Popen(
            argv, cwd=Path(__file__).resolve().parents[2], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        end = time.monotonic() + 120
        while not (m := re.search(r"listening on (http://127\.0\.0\.1:(\d+)) ", log.read_text())):
            assert proc.poll() is None and time.monotonic() < end, log.read_text()
            time.sleep(0.2)
        yield m.group(1), int(m.group(2))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "Traceback" not in log.read_text(), log.read_text()


@pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model {MODEL} is absent")
def test_the_startup_line_says_how_the_pool_was_sized(monkeypatch, capsys):
    """Before it listens, the server prints the sized pool and what the sizing counted (on a GPU: the
    weights, the measured step peak and the measured CUDA graphs; on the CPU: the RAM share)."""
    import importlib

    server_run = importlib.import_module("trtforge.llm.server.run")  # (the package exports a function `run`)
    served = []
    monkeypatch.setattr(server_run, "run", lambda llm, *a, **k: served.append(llm))
    argv = [
        "serve",
        str(MODEL),
        "--device",
        "cpu",
        "--max-num-seqs",
        "4",
        "--max-prefill-tokens-with-decodes",
        "96",
        "--port",
        "0",
    ]
    assert main(argv) in (0, None)
    err = capsys.readouterr().err
    (llm,) = served
    try:
        assert llm.engine.config.max_num_seqs == 4 and llm.engine.config.max_prefill_tokens_with_decodes == 96
        sized = llm.pool_size
        assert sized is not None and sized.num_blocks == llm.executor.facts.num_blocks
        assert f"trtforge serve: KV pool of {sized.num_blocks:,} blocks" in err and sized.how in err
    finally:
        llm.close()


# the model as a user types it: relative to the checkout, with a trailing slash
TYPED = os.path.relpath(MODEL, Path(__file__).resolve().parents[2]) + "/"


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """One `trtforge serve TYPED --port 0` for the module's tests that talk to a live server (a server's
    start and stop took ~40 s each on the loaded 2-core box); its clean exit is checked at the end."""
    if not MODEL.is_dir():
        pytest.skip(f"the trained model {MODEL} is absent")
    with _live_server(tmp_path_factory.mktemp("serve"), TYPED) as served:
        yield served


def test_requests_may_name_the_model_as_typed_on_the_command_line(live_server):
    """vLLM serves `serve PATH` under PATH; trtforge lists PATH's base name. Before, a request naming the
    model as typed (a vLLM client's habit) got 404; now it is answered as the listed name, which
    /v1/models alone lists. --served-model-name replaces both."""
    import httpx

    url, _ = live_server
    listed = httpx.get(url + "/v1/models", timeout=10).json()
    assert [c["id"] for c in listed["data"]] == ["code-llama-21m"]
    for name in ("code-llama-21m", TYPED, TYPED.rstrip("/")):
        body = {"model": name, "prompt": "def f(", "max_tokens": 2}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "code-llama-21m", (name, r.text)
    r = httpx.post(url + "/v1/completions", json={"model": "code-llama-3m", "prompt": "x"}, timeout=60)
    assert r.status_code == 404 and "code-llama-3m" in r.json()["error"]["message"]


def test_port_0_prints_the_port_the_os_chose(live_server):
    """Before: `--port 0` (which the option's range allows) printed "listening on http://127.0.0.1:0", a
    URL no client can reach; the line names the port the socket was bound to."""
    import httpx

    url, port = live_server
    assert port > 0
    assert httpx.get(url + "/health", timeout=10).status_code == 200


@pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model {MODEL} is absent")
def test_a_max_model_len_past_the_models_positions_is_refused_naming_the_limit(capsys):
    """Before: `--max-model-len 100000` on a 2048-position model (unscaled rotary) started the server,
    which then served positions the model never saw."""
    argv = [
        "serve",
        str(MODEL),
        "--device",
        "cpu",
        "--num-blocks",
        "4",
        "--max-model-len",
        "100000",
        "--port",
        "0",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--max-model-len 100000 exceeds the 2048 positions" in err, err
    assert "max_position_embeddings in its config" in err and "Traceback" not in err, err


@pytest.fixture
def tokenizer_with_named_templates(tmp_path) -> Path:
    """The bundled demo tokenizer saved with named chat templates ({"tool_use": ..., "rag": ...})."""
    from trtforge.calibration.data import DEMO_TOKENIZER, resolve_tokenizer

    tok = resolve_tokenizer(DEMO_TOKENIZER)
    tok.chat_template = {"tool_use": "T{{ messages[0]['content'] }}", "rag": "R{{ messages[0]['content'] }}"}
    tok.save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def test_chat_template_names_one_of_the_tokenizers_named_templates(
    tokenizer_with_named_templates, monkeypatch
):
    """--chat-template NAME picks that template (its text is what chats are rendered with)."""
    served = _no_server(monkeypatch)
    argv = [*TINY_SERVE, "--tokenizer", str(tokenizer_with_named_templates), "--chat-template", "rag"]
    assert main(argv) in (0, None)
    ((_, options),) = served
    assert options.chat_template == "R{{ messages[0]['content'] }}"


@pytest.mark.parametrize(
    ("name", "names"), [("nope", "its named templates are rag, tool_use"), ("default", "rag, tool_use")]
)
def test_an_unknown_chat_template_name_is_refused_listing_the_names(
    tokenizer_with_named_templates, monkeypatch, capsys, name, names
):
    """Refused before the model loads (exit 2), naming the flag and listing the names there are."""
    served = _no_server(monkeypatch)
    argv = [*TINY_SERVE, "--tokenizer", str(tokenizer_with_named_templates), "--chat-template", name]
    assert main(argv) == 2 and not served
    err = capsys.readouterr().err
    assert f"--chat-template '{name}': the tokenizer has no chat template of that name" in err, err
    assert names in err and "Traceback" not in err, err


def test_a_chat_template_name_for_a_tokenizer_without_named_ones_is_refused(tmp_path, monkeypatch, capsys):
    from trtforge.calibration.data import DEMO_TOKENIZER, resolve_tokenizer

    tok = resolve_tokenizer(DEMO_TOKENIZER)
    tok.chat_template = "{{ messages[0]['content'] }}"
    tok.save_pretrained(tmp_path / "tok")
    served = _no_server(monkeypatch)
    argv = [*TINY_SERVE, "--tokenizer", str(tmp_path / "tok"), "--chat-template", "tool_use"]
    assert main(argv) == 2 and not served
    err = capsys.readouterr().err
    assert "--chat-template 'tool_use': the tokenizer has no named chat templates" in err, err


def test_an_empty_chat_template_value_is_refused(capsys):
    assert main(["serve", "/no/such", "--chat-template", ""]) == 2
    assert "--chat-template is empty ('')" in capsys.readouterr().err


@pytest.mark.parametrize("listening", [True, False])
def test_a_port_in_use_is_refused_before_the_model_loads(
    tokenizer_with_named_templates, monkeypatch, capsys, listening
):
    """Before: the model loaded first (minutes for a large one), then uvicorn failed to bind. Now the
    socket is bound first, as vLLM does, and the loader never runs; a plain socket holding the port,
    listening or only bound, is refused alike."""
    import socket

    import trtforge.llm as llm_pkg

    def no_load(*a, **k):
        raise AssertionError("the model loaded before the port was checked")

    monkeypatch.setattr(llm_pkg, "from_pretrained", no_load)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    if listening:
        taken.listen()
    port = taken.getsockname()[1]
    try:
        argv = ["serve", "tests.llm.tiny_models:llama_factory", "--device", "cpu", "--port", str(port)]
        assert main([*argv, "--tokenizer", str(tokenizer_with_named_templates)]) == 2
    finally:
        taken.close()
    err = capsys.readouterr().err
    where = f"cannot listen on 127.0.0.1:{port} (Address already in use)"
    assert f"{where}: port {port} is held there" in err, err
    assert "another trtforge serve" in err and "Traceback" not in err, err


def test_a_port_another_server_has_bound_is_refused_while_it_still_loads():
    """SO_REUSEADDR lets two sockets bind one port while neither listens: the socket bound before the
    model loads did not listen until uvicorn started, so a second server bound the same port (and loaded
    its model) while the first still loaded. It listens at once now, and the second bind is refused."""
    from trtforge.errors import UserError
    from trtforge.llm.server.run import listen

    first = listen("127.0.0.1", 0)
    port = first.getsockname()[1]
    try:
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port} .*held there") as e:
            listen("127.0.0.1", port)
    finally:
        first.close()
    assert "\n" not in str(e.value)


HELD = "TRTFORGE_TEST_HELD_LOAD"  # a directory: held_factory writes `loading` there, then waits


def held_factory():
    """The tiny Llama, whose load holds until the process is killed (up to 120 s): a server still loading
    its model, for as long as a test needs one."""
    from tests.llm.tiny_models import llama_factory

    marker = Path(os.environ[HELD])
    (marker / "loading").write_text("")
    end = time.monotonic() + 120
    while time.monotonic() < end:
        time.sleep(0.05)
    return llama_factory()


@pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model {MODEL} is absent")
def test_a_second_serve_on_the_port_of_one_still_loading_exits_2_before_its_model_loads(tmp_path):
    """Two `trtforge serve` on one port, the first still loading its model: the second bound the port too
    (SO_REUSEADDR, neither listening), loaded its model and served, and the first failed when its own
    load ended (or the other way round). The second now exits 2 at once, naming the port, its model never
    loaded (no pool line)."""
    from tests.llm.server.harness import free_port

    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", HELD: str(tmp_path)}
    root = Path(__file__).resolve().parents[2]
    serve = [sys.executable, "-m", "trtforge.cli.main", "serve", "--device", "cpu", "--port", str(port)]
    first = subprocess.Popen(
        [*serve, "tests.cli.test_serve_cmd:held_factory", "--tokenizer", str(MODEL)],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        end = time.monotonic() + 120
        while not (tmp_path / "loading").exists():  # (it binds before the load begins)
            assert first.poll() is None and time.monotonic() < end, first.returncode
            time.sleep(0.05)
        second = subprocess.run(
            [*serve, str(MODEL), "--num-blocks", "64"], cwd=root, env=env, capture_output=True, timeout=120
        )
    finally:
        first.kill()
        first.wait()
    err = second.stderr.decode()
    assert second.returncode == 2, err
    assert f"error: cannot listen on 127.0.0.1:{port} (Address already in use): port {port} is held" in err
    assert "KV pool" not in err and "Traceback" not in err, err


def test_a_slot_step_graph_is_served_within_its_own_batch(tmp_path, monkeypatch):
    """Before: `trtforge serve step.onnx` (the slot graph compile --save-onnx writes) exited 2 with
    "SchedulerConfig {'--max-num-seqs': 256} exceeds the step graph's limits": the server's default
    batch was passed as if asked for. A graph's own limits are the defaults now, as an engine's are; a
    --max-num-seqs past them is still refused by name."""
    import onnx

    from tests.llm.tiny_models import tiny_model
    from trtforge.calibration.data import DEMO_TOKENIZER, resolve_tokenizer
    from trtforge.llm.compile.export import export_step

    r = export_step(tiny_model("llama"), max_seq=64, max_batch=4, exporter="legacy", workdir=tmp_path)
    onnx.save(r.model, str(tmp_path / "step.onnx"))
    resolve_tokenizer(DEMO_TOKENIZER).save_pretrained(tmp_path / "tok")
    served = _no_server(monkeypatch)
    argv = ["serve", str(tmp_path / "step.onnx"), "--tokenizer", str(tmp_path / "tok"), "--port", "0"]
    assert main(argv) in (0, None)
    ((llm, _),) = served
    assert llm.engine.config.max_num_seqs == 4
    assert main([*argv, "--max-num-seqs", "8"]) == 2 and len(served) == 1


@pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model {MODEL} is absent")
def test_a_max_model_len_past_a_given_pool_is_refused(monkeypatch, capsys):
    """Before: `--num-blocks 1 --max-model-len 64` started a server whose sequences the scheduler cut to
    the pool's 16 tokens, which clients alone were told of (as "this model's maximum context length")."""
    import importlib

    server_run = importlib.import_module("trtforge.llm.server.run")

    def started(llm, *a, **k):
        llm.close()  # (as run does: an engine left running would hold up the session)
        pytest.fail("the server started")

    monkeypatch.setattr(server_run, "run", started)
    argv = ["serve", str(MODEL), "--device", "cpu", "--port", "0", "--num-blocks", "1"]
    argv += ["--max-model-len", "64"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--max-model-len 64: the KV pool (--num-blocks 1: 1 block(s) of 16 tokens) holds 16 tokens" in err
    assert "give --num-blocks 4 or more, or --max-model-len 16 or less" in err and "Traceback" not in err


@pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model {MODEL} is absent")
def test_a_sized_pool_shorter_than_the_max_model_len_is_refused_after_the_load(monkeypatch, capsys):
    """A pool sized to the machine (here: 30 MB of RAM available, 30 blocks of 16 tokens) that cannot
    hold one sequence of --max-model-len is refused once its size is known; the server never starts."""
    import importlib

    server_run = importlib.import_module("trtforge.llm.server.run")

    def started(llm, *a, **k):
        llm.close()  # (as run does: an engine left running would hold up the session)
        pytest.fail("the server started")

    monkeypatch.setattr(server_run, "run", started)
    monkeypatch.setattr(importlib.import_module("trtforge.llm.sizing"), "available_ram", lambda: 30_000_000)
    argv = ["serve", str(MODEL), "--device", "cpu", "--max-model-len", "1024", "--port", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--max-model-len 1024: the KV pool (sized to this machine: 30 block(s) of 16 tokens)" in err
    assert "holds 480 tokens of a sequence" in err
    assert "give --num-blocks 64 or more, or --max-model-len 480 or less" in err and "Traceback" not in err


@pytest.mark.skipif(not MODEL.is_dir(), reason=f"the trained model {MODEL} is absent")
def test_a_pool_shorter_than_the_models_context_is_said_at_startup(monkeypatch, capsys):
    """Before: `--num-blocks 3` served sequences of at most 48 tokens of the model's 2,048 without a word
    on the server's side; it starts, and says so, naming the flags that change it."""
    import importlib

    server_run = importlib.import_module("trtforge.llm.server.run")
    served = []
    monkeypatch.setattr(server_run, "run", lambda llm, *a, **k: served.append(llm))
    assert main(["serve", str(MODEL), "--device", "cpu", "--num-blocks", "3", "--port", "0"]) in (0, None)
    err = capsys.readouterr().err
    (llm,) = served
    try:
        assert llm.engine.max_model_len == 48
        assert "warning: the KV pool (--num-blocks 3: 3 block(s) of 16 tokens) holds 48 tokens" in err, err
        assert "fewer than the model's context of 2,048" in err
        assert "Give --num-blocks 128 or more for the whole context, or --max-model-len 48" in err
    finally:
        llm.close()


def test_the_help_says_the_sizing_defaults_and_units(capsys):
    """Before: --request-timeout read "Seconds per request." (no default, no word of the 504 past it),
    --num-blocks "KV-cache blocks (default: sized)" (of how many tokens?), --gpu-memory-utilization gave no
    range and no word of the CPU, where it does nothing."""
    import inspect

    from trtforge.llm import from_pretrained, sizing

    assert main(["serve", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "waiting in the queue included; past them it gets 504" in out and "Default: no limit." in out
    block = inspect.signature(from_pretrained).parameters["block_size"].default
    assert f"KV-cache blocks, of {block} tokens each on the torch executor" in out
    cpu = f"{sizing.CPU_KV_FRACTION:.0%} of the available RAM, at most {sizing.CPU_KV_CAP / 2**30:g} GiB"
    assert "A fraction in (0, 1]: the share of the GPU memory" in out and cpu in out


def test_an_ipv6_host_in_brackets_is_listened_on(tokenizer_with_named_templates, monkeypatch, capsys):
    """Before: `--host [::1]`, an IPv6 address as URLs write it, was "cannot listen on [::1]:0 (Name or
    service not known ...)"; the address inside the brackets is listened on."""
    import importlib
    import socket

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    server_run = importlib.import_module("trtforge.llm.server.run")
    bound = []
    listen = server_run.listen

    def record(host, port):
        sock = listen(host, port)
        bound.append(sock.getsockname()[0])
        sock.close()
        raise server_run.UserError("stop here")

    monkeypatch.setattr(server_run, "listen", record)
    argv = ["serve", "tests.llm.tiny_models:llama_factory", "--device", "cpu", "--port", "0"]
    argv += ["--host", "[::1]"]
    assert main([*argv, "--tokenizer", str(tokenizer_with_named_templates)]) == 2
    assert bound == ["::1"] and "error: stop here" in capsys.readouterr().err
