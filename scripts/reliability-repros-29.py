#!/usr/bin/env python3
"""Runs issue 29's structured-output and amplifying-field reproductions (D1-D4, D8)
against a running `pagoda serve` and prints what happened to each, with the
server's RSS before and after (the figures in RELIABILITY.md, "Third round").

    scripts/reliability-repros-29.py --base http://127.0.0.1:8000 --pid PID

Loopback only. Needs `requests`.
"""
import argparse
import json
import threading
import time

import requests


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def ref_chain(n, via="items"):
    defs = {}
    for i in range(n):
        nxt = {"$ref": f"#/$defs/d{i + 1}"} if i + 1 < n else {"type": "integer"}
        if via == "items":
            nxt = {"type": "array", "items": nxt}
        elif via == "anyOf":
            nxt = {"anyOf": [nxt, {"type": "null"}]}
        elif via == "allOf":
            nxt = {"allOf": [nxt]}
        elif via == "properties":
            nxt = {"type": "object", "properties": {"a": nxt}, "required": ["a"]}
        defs[f"d{i}"] = nxt
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def lark_chain(n):
    return "\n".join(["start: r0"] + [f"r{i}: r{i + 1}" for i in range(n - 1)] + [f'r{n - 1}: "x"'])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--pid", type=int, required=True)
    a = ap.parse_args()
    base, pid = a.base, a.pid

    def run(name, path, body, timeout=300):
        rss0 = status_kib(pid, "VmRSS")
        t0 = time.time()
        try:
            r = requests.post(base + path, json=body, timeout=timeout)
            st, text = r.status_code, r.text
        except requests.RequestException as e:
            st, text = None, repr(e)
        dt = time.time() - t0
        time.sleep(0.5)
        rss1 = status_kib(pid, "VmRSS")
        size = len(json.dumps(body))
        try:
            msg = json.loads(text).get("error", {}).get("message", "")[:110]
        except ValueError:
            msg = text[:110]
        print(f"| {name} | {size:,} B | {st} | {dt:.2f} s | {(rss1 - rss0) / 1024:+.0f} MiB | {msg} |")
        return st

    comp, chat = "/v1/completions", "/v1/chat/completions"
    print("| reproduction | body | status | time | RSS change | error message |")
    print("|---|---|---|---|---|---|")
    for via in ["ref", "items", "anyOf", "allOf", "properties"]:
        run(f"D1 700-link `$ref` chain via {via}", comp,
            {"prompt": "List:", "max_tokens": 4, "structured_outputs": {"json": ref_chain(700, via)}})
    run("D1 chain as a schema string", comp,
        {"prompt": "List:", "max_tokens": 4, "structured_outputs": {"json": json.dumps(ref_chain(700))}})
    run("D1 chain via chat response_format", chat,
        {"messages": [{"role": "user", "content": "List"}], "max_tokens": 4,
         "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": ref_chain(700)}}})
    run("D1 Lark rule chain of 1000", comp,
        {"prompt": "X:", "max_tokens": 4, "structured_outputs": {"grammar": lark_chain(1000)}})
    run("D1 `$ref` chain of 3000 via items (past the bound)", comp,
        {"prompt": "X:", "max_tokens": 4, "structured_outputs": {"json": ref_chain(3000)}})
    run("D2 prompt_logprobs -1, 48-token prompt", comp,
        {"prompt": "word " * 47, "max_tokens": 1, "prompt_logprobs": -1})
    vocab = list(range(49152))
    run("D3 logprob_token_ids = vocabulary, 200 tokens", comp,
        {"prompt": "Hi", "max_tokens": 200, "logprob_token_ids": vocab})
    run("D3 same, chat n=8", chat,
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 200, "n": 8,
         "logprob_token_ids": vocab})
    run("D3 logprob_token_ids at the cap (128), 200 tokens", comp,
        {"prompt": "Hi", "max_tokens": 200, "logprob_token_ids": vocab[:128], "ignore_eos": True})
    run("D8 `$ref` self-cycle", comp,
        {"prompt": "X:", "max_tokens": 4,
         "structured_outputs": {"json": {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}})
    run("D8 regex (a{1000}){1000}", comp,
        {"prompt": "X:", "max_tokens": 4, "structured_outputs": {"regex": "(a{1000}){1000}"}})

    # D4: a plain stream's inter-token latency alone, then beside 8 heavy compiles
    # (1500-link chains) whose clients hang up after 0.5 s.
    def itl():
        t_prev, gaps = None, []
        with requests.post(base + comp, stream=True, timeout=300,
                           json={"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0,
                                 "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    now = time.time()
                    if t_prev is not None:
                        gaps.append(now - t_prev)
                    t_prev = now
        gaps.sort()
        return gaps[len(gaps) // 2], gaps[int(len(gaps) * 0.9)]

    idle = itl()

    def heavy():
        try:
            requests.post(base + comp, timeout=0.5,
                          json={"prompt": "X:", "max_tokens": 4,
                                "structured_outputs": {"json": ref_chain(1500, "properties")}})
        except requests.RequestException:
            pass
    threads = [threading.Thread(target=heavy) for _ in range(8)]
    for t in threads:
        t.start()
    loaded = itl()
    for t in threads:
        t.join()
    print(f"\nD4: plain stream ITL p50/p90 alone {idle[0] * 1e3:.1f}/{idle[1] * 1e3:.1f} ms, "
          f"beside 8 abandoned heavy compiles {loaded[0] * 1e3:.1f}/{loaded[1] * 1e3:.1f} ms "
          f"(p50 ratio {loaded[0] / idle[0]:.2f})")
    print(f"RSS now {status_kib(pid, 'VmRSS') / 1024:.0f} MiB, peak {status_kib(pid, 'VmHWM') / 1024:.0f} MiB")
    h = requests.get(base + "/health", timeout=10).status_code
    print(f"/health {h}")


if __name__ == "__main__":
    main()
