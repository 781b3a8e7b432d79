"""Starts the real `pagoda serve` once per test session on a free loopback port.

The binary is `$PAGODA_BIN` or `target/release/pagoda`; the model is `$PAGODA_MODEL`
or `~/.cache/pagoda/models/SmolLM2-135M-Instruct.Q4_1.gguf`.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
API_KEY = "python-test-key"


def _model_path() -> Path:
    p = os.environ.get("PAGODA_MODEL") or os.path.expanduser(
        "~/.cache/pagoda/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    if not os.path.exists(p):
        pytest.fail(f"test model {p} is missing: run scripts/fetch-model.sh or set PAGODA_MODEL")
    return Path(p)


def _binary() -> Path:
    p = Path(os.environ.get("PAGODA_BIN") or REPO / "target" / "release" / "pagoda")
    if not p.exists():
        pytest.fail(f"{p} is missing: run `cargo build --release -p pagoda-server` or set PAGODA_BIN")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def reference():
    for p in [os.environ.get("PAGODA_REFERENCE"), REPO / "tests/data/smollm2-greedy.json"]:
        if p and os.path.exists(p):
            with open(p) as f:
                return json.load(f)
    pytest.fail("smollm2-greedy.json not found (set PAGODA_REFERENCE)")


@contextlib.contextmanager
def running_server(args, log_prefix="pagoda-py-", check_exit=True):
    """`pagoda serve ARGS` on a free loopback port, healthy; yields its base URL.
    Stopped with SIGTERM at the end (a clean exit is asserted when `check_exit`)."""
    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix=log_prefix, suffix=".log", delete=False)
    env = dict(os.environ)
    env.pop("PAGODA_API_KEY", None)
    proc = subprocess.Popen(
        [str(_binary()), "serve", *args, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=log, env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{open(log.name).read()}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"server did not become healthy:\n{open(log.name).read()}")
        time.sleep(0.1)
    yield base
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    os.unlink(log.name)
    if check_exit:
        assert code == 0, f"server exit status {code}"


@pytest.fixture(scope="session")
def server():
    # f32 weights: the reference's greedy ids hold on the exact path (the default
    # keeps the GGUF's quantization, which moves log-probs by up to ~0.6).
    with running_server(["--model", str(_model_path()), "--api-key", API_KEY, "--dtype", "float32"]) as base:
        yield base


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def model(client):
    return client.models.list().data[0].id
