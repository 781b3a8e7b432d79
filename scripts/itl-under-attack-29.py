#!/usr/bin/env python3
"""Issue 29's latency bound: a plain stream's inter-token latency (ITL) beside each
attack of D4 (abandoned heavy compiles), D6 (the most stop strings a request may
carry, at n: 16), D7 (a 600-lexeme Lark grammar at n: 32) and one n: 64 request
(the seat share), against the same plain stream beside the same request without
its expensive part (the same batch shape: what the attack itself costs) and alone.

    scripts/itl-under-attack-29.py --base http://127.0.0.1:8000 [--rounds 3]

Prints one line per case with ITL p50/p90 and the ratios. Loopback only. Needs
`requests`. Run against a release `pagoda serve` on a quiet machine.
"""
import argparse
import json
import statistics
import threading
import time

import requests

COMP = "/v1/completions"


def plain_itl(base, tokens=48):
    """p50 and p90 of the gaps between a plain greedy stream's chunks."""
    t_prev, gaps = None, []
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with requests.post(base + COMP, stream=True, timeout=600, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                now = time.perf_counter()
                if t_prev is not None:
                    gaps.append(now - t_prev)
                t_prev = now
    gaps.sort()
    return gaps[len(gaps) // 2], gaps[int(len(gaps) * 0.9)]


class Background:
    """A streamed request read in a thread until `stop()` hangs up."""

    def __init__(self, base, body):
        self.started = threading.Event()
        self.status = None
        self.done = False
        self._resp = None
        self._thread = threading.Thread(target=self._run, args=(base, body), daemon=True)
        self._thread.start()

    def _run(self, base, body):
        try:
            with requests.post(base + COMP, stream=True, timeout=600,
                               json=dict(body, stream=True)) as r:
                self._resp = r
                self.status = r.status_code
                for line in r.iter_lines():
                    if line.startswith(b"data: {"):
                        self.started.set()
                    if self.done:
                        break
        except (requests.RequestException, AttributeError, ValueError):
            # stop() closes the response under the reader: how the hang-up ends it.
            pass
        finally:
            self.started.set()

    def stop(self):
        self.done = True
        if self._resp is not None:
            self._resp.close()
        self._thread.join(timeout=30)


def beside(base, body, warm_s=1.0):
    """The plain stream's ITL while `body` streams (after its first chunk)."""
    bg = Background(base, body)
    bg.started.wait(timeout=300)
    time.sleep(warm_s)
    try:
        if bg.status != 200:
            raise SystemExit(f"the background request got {bg.status}: {json.dumps(body)[:200]}")
        return plain_itl(base)
    finally:
        bg.stop()


def lark_600():
    names = [f"T{i}" for i in range(600)]
    rules = [f'{n}: "w{i}x"' for i, n in enumerate(names)]
    return "\n".join(["start: item (\" \" item)*", "item: " + " | ".join(names)] + rules)


def ref_chain(n):
    defs = {}
    for i in range(n):
        nxt = {"$ref": f"#/$defs/d{i + 1}"} if i + 1 < n else {"type": "integer"}
        defs[f"d{i}"] = {"type": "object", "properties": {"a": nxt}, "required": ["a"]}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def d4(base):
    """8 heavy compiles (1500-link chains) whose clients hang up after 0.5 s."""
    def heavy():
        try:
            requests.post(base + COMP, timeout=0.5,
                          json={"prompt": "X:", "max_tokens": 4,
                                "structured_outputs": {"json": ref_chain(1500)}})
        except requests.RequestException:
            pass
    threads = [threading.Thread(target=heavy) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    r = plain_itl(base)
    for t in threads:
        t.join()
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    base = a.base
    long_gen = {"prompt": "Write a long story about a dragon.", "max_tokens": 4000,
                "temperature": 1.0, "seed": 1, "ignore_eos": True}
    stops = [f"never-{i:04d}-" + "z" * 1000 for i in range(256)]
    cases = [
        ("D4 8 abandoned heavy compiles", None, None),
        ("D6 256 stop strings x 1 KB, n=16", dict(long_gen, n=16, stop=stops), dict(long_gen, n=16)),
        ("D7 600-lexeme Lark grammar, n=32",
         dict(long_gen, n=32, structured_outputs={"grammar": lark_600()}), dict(long_gen, n=32)),
        ("seat share: one n=64 request", dict(long_gen, n=64), None),
    ]
    plain_itl(base)  # warm-up
    for name, attack, same_shape in cases:
        rows = {"alone": [], "attack": [], "shape": []}
        for _ in range(a.rounds):
            rows["alone"].append(plain_itl(base))
            if attack is None:
                rows["attack"].append(d4(base))
            else:
                rows["attack"].append(beside(base, attack))
            if same_shape is not None:
                rows["shape"].append(beside(base, same_shape))
        med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
               for k, v in rows.items() if v}
        line = (f"{name}: ITL p50/p90 alone {med['alone'][0] * 1e3:.1f}/{med['alone'][1] * 1e3:.1f} ms, "
                f"beside the attack {med['attack'][0] * 1e3:.1f}/{med['attack'][1] * 1e3:.1f} ms "
                f"(x{med['attack'][0] / med['alone'][0]:.2f} of alone)")
        if "shape" in med:
            line += (f", beside the same request without it {med['shape'][0] * 1e3:.1f}/"
                     f"{med['shape'][1] * 1e3:.1f} ms (attack x{med['attack'][0] / med['shape'][0]:.2f})")
        print(line, flush=True)


if __name__ == "__main__":
    main()
