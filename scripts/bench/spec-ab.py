#!/usr/bin/env python3
"""N-gram speculative decoding, A B A B in one run: output tok/s at 1 stream on an
input-grounded workload (the answer copies from the prompt: repeat a text, edit code,
quote a passage), with and without `--speculative-config`.

Starts two `pagoda serve` processes on the same model (A: no speculation, B: the given
config), both loaded for the whole run, then alternates rounds A, B, A, B, ...: each
round sends every prompt once, one request at a time (greedy chat completions,
`max_tokens` capped), and reports completion tokens / wall time of the round. Also
checks that A and B answered every prompt with the same text (greedy output is
unchanged by speculation) and prints B's spec-decode counters from /metrics.

usage: spec-ab.py --bin target/release/pagoda --model MODEL.gguf [--rounds 2]
                  [--max-tokens 160] [--spec JSON] [--extra "--flag value"]
Standard library only.
"""
import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import time
import urllib.request

PASSAGE = (
    "The city council met on Tuesday evening to discuss the new library. After a long "
    "debate, the members approved the budget for the building, but they postponed the "
    "decision about the park until the next meeting. The mayor said that the library "
    "would open in the spring and that the park would be discussed again in March. "
    "Several residents spoke during the public comment period. One teacher asked for "
    "longer opening hours on weekends, and a local business owner offered to donate "
    "books for the children's section. The council thanked everyone for coming and "
    "closed the meeting at nine o'clock."
)
CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def average_price(items):
    count = 0
    total = 0
    for item in items:
        total += item.price
        count += 1
    return total / count
"""

PROMPTS = [
    f"Repeat the following text exactly, word for word.\n\n{PASSAGE}",
    f"Rewrite this function with the variable `subtotal` renamed to `net`. "
    f"Output only the code.\n\n{CODE}",
    f"Copy the following text, but replace every occurrence of \"library\" with "
    f"\"museum\".\n\n{PASSAGE}",
    f"Add a docstring to each function below and output the full code.\n\n{CODE}",
    f"Quote the sentence of the following text that mentions the mayor, then quote "
    f"the first sentence.\n\n{PASSAGE}",
]


def post(base, body):
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def start(binary, model, port, extra, log):
    cmd = [binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--model", model]
    cmd += extra
    print("$", " ".join(shlex.quote(c) for c in cmd), flush=True)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    return wait_healthy(p, port, log)


def wait_healthy(p, port, log):
    """Waits for the server process `p` to answer /health on `port`: (p, base URL)."""
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return p, base
        except Exception:
            time.sleep(0.5)
    p.kill()
    sys.exit(f"server on {port} did not start; see {log}")


def stream(base, body):
    """One streamed chat completion: (completion tokens, text, t_first, t_last, t_start)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    first = last = None
    text, tokens = [], 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for c in ev.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(piece)
    return tokens, "".join(text), first or t0, last or t0, t0


def run_round(base, max_tokens):
    """Every prompt once, one at a time: (tokens, wall seconds, decode seconds, texts).
    Decode seconds run from each answer's first streamed text to its last, so prefill
    (the same work with or without speculation) is left out of the decode rate."""
    tokens, decode, texts = 0, 0.0, []
    t0 = time.perf_counter()
    for prompt in PROMPTS:
        n, text, first, last, _ = stream(base, {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        })
        tokens += n
        decode += last - first
        texts.append(text)
    return tokens, time.perf_counter() - t0, decode, texts


def spec_metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return [l for l in text.splitlines() if l.startswith("vllm:spec_decode") and not l.startswith("#")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--spec", default='{"method": "ngram", "num_speculative_tokens": 4, '
                    '"prompt_lookup_min": 2, "prompt_lookup_max": 4}')
    ap.add_argument("--extra", default="--max-model-len 2048")
    a = ap.parse_args()
    extra = shlex.split(a.extra)
    ports = random.sample(range(18100, 18999), 2)
    pa, base_a = start(a.bin, a.model, ports[0], extra, "/tmp/spec-ab-A.log")
    pb, base_b = start(a.bin, a.model, ports[1], extra + ["--speculative-config", a.spec],
                       "/tmp/spec-ab-B.log")
    try:
        run_round(base_a, 8)  # warm-up, untimed
        run_round(base_b, 8)
        results = {"A": [], "B": []}
        decode_rates = {"A": [], "B": []}
        answers = {}
        for r in range(a.rounds):
            for label, base in (("A", base_a), ("B", base_b)):
                tok, secs, dec, texts = run_round(base, a.max_tokens)
                results[label].append(tok / secs)
                # Decode tokens: all but each answer's first (it comes with the prefill).
                decode_rates[label].append((tok - len(PROMPTS)) / dec)
                answers.setdefault(label, texts)
                print(f"round {r + 1} {label}: {tok} tokens in {secs:.2f} s = "
                      f"{tok / secs:.2f} tok/s end to end, "
                      f"{decode_rates[label][-1]:.2f} tok/s decoding", flush=True)
        same = answers["A"] == answers["B"]
        print(f"identical answers A vs B: {same}")
        for label in "AB":
            v, d = results[label], decode_rates[label]
            print(f"{label}: mean {sum(v) / len(v):.2f} tok/s end to end, "
                  f"{sum(d) / len(d):.2f} tok/s decoding, over {len(v)} rounds")
        mean = lambda x: sum(x) / len(x)
        print(f"speed-up B / A: {mean(results['B']) / mean(results['A']):.2f}x end to end, "
              f"{mean(decode_rates['B']) / mean(decode_rates['A']):.2f}x decoding")
        for l in spec_metrics(base_b):
            print(l)
        if not same:
            sys.exit(1)
    finally:
        for p in (pa, pb):
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
