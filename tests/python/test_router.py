"""Issue 26: `pagoda serve` replicas behind the real vLLM router (PyPI `vllm-router`),
on loopback, with the `round_robin`, `cache_aware` and `kv_aware` policies.

Through the router: completions, chat and streaming answer as they do direct. Each
tenant's prefix is first computed on one replica directly, behind the router's
back; with `kv_aware` the router reads each replica's KV-cache events
(`--kv-events-config`, its `--kv-event-source`) and must send every request of a
tenant, its first included, to the replica that holds the tenant's blocks: the
prefix-cache hit rate summed over the replicas' own `/metrics` is then the ideal,
well above round robin's, which splits each tenant over both replicas. The figures per policy
go to BENCHMARKS.md (printed with `-s`).
"""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

from conftest import _model_path, running_server

ROUTER = os.environ.get("VLLM_ROUTER_BIN") or shutil.which("vllm-router")
if ROUTER is None:
    pytest.skip(
        "vllm-router is not installed (scripts/test.sh installs vllm-router==0.1.17 from PyPI)",
        allow_module_level=True,
    )

TENANTS = 3
PER_TENANT = 4


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(base, name):
    text = requests.get(base + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextlib.contextmanager
def _replicas(n):
    """`n` replicas, each publishing KV events; yields [(base, pub_endpoint)]."""
    with contextlib.ExitStack() as stack:
        out = []
        for _ in range(n):
            pub = _port()
            cfg = json.dumps({"enable_kv_cache_events": True, "endpoint": f"tcp://*:{pub}"})
            args = ["--model", str(_model_path()), "--served-model-name", "smol",
                    "--kv-events-config", cfg]
            base = stack.enter_context(running_server(args, log_prefix="pagoda-routed-"))
            out.append((base, f"tcp://127.0.0.1:{pub}"))
        yield out


@contextlib.contextmanager
def _router(workers, policy):
    port = _port()
    args = [ROUTER, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--worker-urls", *[b for b, _ in workers], "--log-level", "debug"]
    if policy == "kv_aware":
        for base, ep in workers:
            args += ["--kv-event-source", f"{base}={ep}"]
        args += ["--kv-event-model", "smol"]
    log = tempfile.NamedTemporaryFile(prefix="vllm-router-", suffix=".log", delete=False)
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm-router exited {proc.returncode}:\n{open(log.name).read()}")
            try:
                if requests.get(base + "/v1/models", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                pytest.fail(f"vllm-router did not come up:\n{open(log.name).read()}")
            time.sleep(0.2)
        yield base, log.name
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(log.name)


def _tenant_prompt(t, q):
    # ~70 tokens of tenant-specific system prompt (4 full blocks of 16), then a question.
    return (
        f"System for tenant {t}: you are assistant number {t} of the harbour office. "
        f"Answer briefly and politely, in plain English, about ships, tides, storms, "
        f"lighthouses and the rules of the harbour of town {t}; never invent facts, "
        f"and say when you do not know. Question {q}: what should a sailor do now?"
    )


def _warm(workers):
    """Each tenant's prefix computed on one replica, directly: the router never sees
    these requests, so only the replicas' KV events can tell it where they are."""
    for t in range(TENANTS):
        base = workers[t % len(workers)][0]
        r = requests.post(base + "/v1/completions", timeout=120, json={
            "model": "smol", "prompt": _tenant_prompt(t, "warm-up"),
            "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
    time.sleep(0.5)


def _workload(router):
    for q in range(PER_TENANT):
        for t in range(TENANTS):
            r = requests.post(router + "/v1/completions", timeout=120, json={
                "model": "smol", "prompt": _tenant_prompt(t, q),
                "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
            # The events of this request reach the router before the next one.
            time.sleep(0.15)


def _api_through(router):
    r = requests.post(router + "/v1/chat/completions", timeout=120, json={
        "model": "smol", "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    with requests.post(router + "/v1/completions", timeout=120, stream=True, json={
            "model": "smol", "prompt": "Once upon a time", "max_tokens": 4,
            "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200
        lines = [l for l in r.iter_lines() if l.startswith(b"data: ")]
    assert lines[-1] == b"data: [DONE]"
    assert any(json.loads(l[6:])["choices"][0]["text"] for l in lines[:-1])


def _ideal_rate(base):
    """The hit rate if every request went where its tenant's blocks are: it finds the
    full 16-token blocks it shares with its tenant's earlier prompts (the warm-up's
    included)."""
    hits = queries = 0
    for t in range(TENANTS):
        seen = [requests.post(base + "/tokenize", json={"prompt": _tenant_prompt(t, "warm-up")},
                              timeout=30).json()["tokens"]]
        for q in range(PER_TENANT):
            ids = requests.post(base + "/tokenize", json={"prompt": _tenant_prompt(t, q)},
                                timeout=30).json()["tokens"]
            best = 0
            for prev in seen:
                n = 0
                while n < min(len(ids), len(prev)) and ids[n] == prev[n]:
                    n += 1
                best = max(best, n // 16 * 16)
            hits, queries = hits + best, queries + len(ids)
            seen.append(ids)
    return hits / queries


def _hit_rate(workers, before):
    hits = sum(_metric(b, "vllm:prefix_cache_hits_total") for b, _ in workers) - before[0]
    queries = sum(_metric(b, "vllm:prefix_cache_queries_total") for b, _ in workers) - before[1]
    return hits / queries


@pytest.mark.parametrize("policy", ["round_robin", "cache_aware", "kv_aware"])
def test_routed_workload(policy, request):
    with _replicas(2) as workers, _router(workers, policy) as (router, log):
        _api_through(router)
        _warm(workers)
        before = (
            sum(_metric(b, "vllm:prefix_cache_hits_total") for b, _ in workers),
            sum(_metric(b, "vllm:prefix_cache_queries_total") for b, _ in workers),
        )
        _workload(router)
        rate = _hit_rate(workers, before)
        ideal = _ideal_rate(workers[0][0])
        print(f"\nrouter policy {policy}: prefix-cache hit rate {rate:.3f} of an ideal "
              f"{ideal:.3f} ({TENANTS} tenants x {PER_TENANT} requests, 2 replicas)")
        request.config.cache.set(f"pagoda/router_hit_rate/{policy}", rate)
        text = re.sub(r"\x1b\[[0-9;]*m", "", open(log).read())
        if policy == "kv_aware":
            assert "must be a tagged map" not in text and "decode batch" not in text, text[-4000:]
            credited = [int(m) for m in re.findall(r"credited_prefix_tokens=(\d+)", text)]
            decisions = [l for l in text.splitlines() if "decision" in l]
            assert max(credited, default=0) >= 16, "\n".join(decisions)[-6000:]
            # Every request, the first of each tenant included, finds its prefix
            # blocks where the router sent it: known only from the events.
            assert rate >= ideal - 0.01, (rate, ideal)
        if policy == "round_robin":
            # Alternation splits every tenant over both replicas (each pays twice).
            assert rate < ideal - 0.1, (rate, ideal)
