#!/usr/bin/env python3
"""Runs the reproductions of issue 9 against a running `pagoda serve` and prints
what happened to each (the figures in RELIABILITY.md).

    scripts/reliability-repros.py --base http://127.0.0.1:8000 --pid PID

Loopback only. Needs `requests`. The silent-socket check wants this process to
be allowed >= 2,100 open files (it raises its own soft limit).
"""
import argparse
import json
import resource
import socket
import threading
import time

import requests


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def post(base, body, timeout=120):
    t0 = time.time()
    r = requests.post(f"{base}/v1/completions", json=body, timeout=timeout)
    return r.status_code, r.text[:160], time.time() - t0


def health_ok(base):
    try:
        return requests.get(f"{base}/health", timeout=10).status_code == 200
    except requests.RequestException:
        return False


def probe_health_while(base, fn):
    """Runs fn() while timing /health every 50 ms; returns (fn's result, worst latency)."""
    stop = threading.Event()
    worst = [0.0]

    def probe():
        while not stop.is_set():
            t0 = time.time()
            try:
                requests.get(f"{base}/health", timeout=30)
            except requests.RequestException:
                pass
            worst[0] = max(worst[0], time.time() - t0)
            time.sleep(0.05)

    t = threading.Thread(target=probe)
    t.start()
    try:
        out = fn()
    finally:
        stop.set()
        t.join()
    return out, worst[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--pid", type=int, required=True)
    a = ap.parse_args()
    base = a.base
    results = {}

    # 1. Tiny repetition penalty, with a concurrent stream.
    stream_ok = {}

    def stream():
        r = requests.post(f"{base}/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 32,
                          "temperature": 0, "ignore_eos": True, "stream": True}, stream=True, timeout=120)
        lines = [l for l in r.iter_lines() if l]
        stream_ok["errors"] = sum(1 for l in lines if b'"error"' in l)
        stream_ok["done"] = lines[-1] == b"data: [DONE]"

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.2)
    results["1_repetition_penalty_1e-38"] = post(base, {"prompt": "The capital of France is", "max_tokens": 5,
                                                        "repetition_penalty": 1e-38})[:2]
    t.join()
    results["1_concurrent_stream"] = stream_ok
    results["1_health_after"] = health_ok(base)

    # 2. Every token masked.
    results["2_all_masked"] = post(base, {"prompt": "Hi", "max_tokens": 4, "min_tokens": 2,
                                          "stop_token_ids": list(range(49152))})[:2]
    results["2_health_after"] = health_ok(base)

    # 3. 2,000 silent sockets, then /health.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = base.split("//")[1].split(":")
    socks = []
    for _ in range(2000):
        try:
            socks.append(socket.create_connection((host, int(port)), timeout=5))
        except OSError as e:
            results["3_connect_error"] = str(e)
            break
    t0 = time.time()
    results["3_health_with_2000_silent"] = (health_ok(base), round(time.time() - t0, 3))
    for s in socks:
        s.close()

    # 4. Eight concurrent 8 MB prompts: /health latency, answers, RSS before/after idle.
    rss0 = rss_mib(a.pid)
    big = "lorem ipsum dolor sit amet " * (8 * 1024 * 1024 // 27 - 64)

    def eight():
        out = [None] * 8

        def one(i):
            out[i] = post(base, {"prompt": big, "max_tokens": 4})
        ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        return out

    answers, worst = probe_health_while(base, eight)
    rss_peak = rss_mib(a.pid)
    time.sleep(6)  # the idle trimmer runs every 2 s
    results["4_eight_8MB_prompts"] = {
        "statuses": sorted({s for s, _, _ in answers}),
        "slowest_answer_s": round(max(d for _, _, d in answers), 3),
        "worst_health_latency_s": round(worst, 3),
        "rss_before_mib": round(rss0), "rss_after_burst_mib": round(rss_peak),
        "rss_after_idle_mib": round(rss_mib(a.pid)),
    }

    # 5. 7 prompts x n=128, then a 1-token request.
    lists = [[504 + i, 3458, 314] for i in range(7)]
    results["5_896_sequences"] = post(base, {"prompt": lists, "n": 128, "max_tokens": 2000})[:2]
    s, _, d = post(base, {"prompt": "Hi", "max_tokens": 1})
    results["5_one_token_after"] = (s, round(d, 3))

    # 6. Capacity is checked at start (see the Rust test); here: /v1/models.
    results["6_models_max_model_len"] = requests.get(f"{base}/v1/models", timeout=10).json()["data"][0]["max_model_len"]

    # Smaller: text/plain.
    r = requests.post(f"{base}/v1/completions", data='{"prompt":"Hi"}', headers={"Content-Type": "text/plain"})
    results["text_plain"] = r.status_code
    results["health_at_end"] = health_ok(base)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
