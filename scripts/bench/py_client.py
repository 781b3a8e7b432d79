#!/usr/bin/env python3
"""An external load generator: a Python streaming client on the same machine as the server.

`pagoda bench serve` is compiled Rust and, in side-by-side.sh, niced; a user's client is
usually neither. This client is what an independent measurement used: text prompts of
about INPUT_LEN tokens (random common words, distinct per request), streamed
`/v1/completions` with `ignore_eos`, one asyncio task per stream, run as an ordinary
process (no `nice`). Its CPU use competes with the server for the same cores, which is
the point: a server whose threads spin while the client needs a core loses here.

Writes the same JSON as `pagoda bench serve --json` (levels[].summary with
output_throughput, ttft_ms/itl_ms/e2e_ms/tpot_ms distributions in ms), so
scripts/bench/summarize.py reads it. Needs httpx (installed with the openai package).

usage: py_client.py --base-url URL --model NAME --concurrency 1,8,32 --input-len 64
                    --output-len 128 [--num-prompts N] [--seed S] [--json OUT] [--label L]
"""
import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import httpx

WORDS = (
    "time year people way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city name "
    "president team minute idea kid body information back parent face others level "
    "office door health person art war history party result change morning reason "
    "research girl guy moment air teacher force education river garden winter summer"
).split()


def prompt_text(rng, n_tokens):
    # SmolLM2's tokenizer gives about one token per common word plus the space.
    return " ".join(rng.choice(WORDS) for _ in range(n_tokens))


def dist(samples_s):
    ms = sorted(x * 1e3 for x in samples_s)
    if not ms:
        return dict(mean=0.0, std=0.0, p50=0.0, p90=0.0, p99=0.0, max=0.0, count=0)

    def pct(p):
        # Linear interpolation between closest ranks (numpy's default), as stats.rs.
        k = (len(ms) - 1) * p / 100.0
        lo = int(k)
        hi = min(lo + 1, len(ms) - 1)
        return ms[lo] + (ms[hi] - ms[lo]) * (k - lo)

    return dict(
        mean=statistics.fmean(ms),
        std=statistics.pstdev(ms) if len(ms) > 1 else 0.0,
        p50=pct(50),
        p90=pct(90),
        p99=pct(99),
        max=ms[-1],
        count=len(ms),
    )


async def one_request(client, url, body, level_start):
    r = dict(ok=False, start_s=time.perf_counter() - level_start, ttft_s=0.0, e2e_s=0.0,
             itl_s=[], chunks=0, output_tokens=0, prompt_tokens=0, error=None)
    sent = time.perf_counter()
    last = None
    usage = None
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                r["error"] = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return r
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if ev.get("usage"):
                    usage = ev["usage"]
                choices = ev.get("choices") or []
                if choices and choices[0].get("text"):
                    now = time.perf_counter()
                    if last is None:
                        r["ttft_s"] = now - sent
                    else:
                        r["itl_s"].append(now - last)
                    last = now
                    r["chunks"] += 1
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        r["error"] = repr(e)
        return r
    r["e2e_s"] = time.perf_counter() - sent
    r["output_tokens"] = (usage or {}).get("completion_tokens") or r["chunks"]
    r["prompt_tokens"] = (usage or {}).get("prompt_tokens") or 0
    r["ok"] = r["chunks"] > 0
    if not r["ok"]:
        r["error"] = "no tokens"
    return r


async def level(args, conc, prompts):
    url = args.base_url.rstrip("/") + "/v1/completions"
    limits = httpx.Limits(max_connections=conc, max_keepalive_connections=conc)
    queue = list(prompts)
    results = []
    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        async def worker():
            while queue:
                p = queue.pop()
                body = dict(model=args.model, prompt=p, max_tokens=args.output_len,
                            temperature=0.0, ignore_eos=True, stream=True,
                            stream_options=dict(include_usage=True))
                results.append(await one_request(client, url, body, start))

        await asyncio.gather(*(worker() for _ in range(conc)))
    duration = time.perf_counter() - start
    ok = [r for r in results if r["ok"]]
    out_tok = sum(r["output_tokens"] for r in ok)
    in_tok = sum(r["prompt_tokens"] or args.input_len for r in ok)
    summary = dict(
        concurrency=conc,
        num_prompts=len(prompts),
        completed=len(ok),
        failed=len(results) - len(ok),
        duration_s=duration,
        request_throughput=len(ok) / duration,
        output_throughput=out_tok / duration,
        total_token_throughput=(out_tok + in_tok) / duration,
        total_input_tokens=in_tok,
        total_output_tokens=out_tok,
        ttft_ms=dist([r["ttft_s"] for r in ok]),
        tpot_ms=dist([(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1)
                      for r in ok if r["output_tokens"] > 1]),
        itl_ms=dist([x for r in ok for x in r["itl_s"]]),
        e2e_ms=dist([r["e2e_s"] for r in ok]),
    )
    errors = {r["error"] for r in results if not r["ok"]}
    if errors:
        print(f"  errors: {sorted(errors)[:3]}", file=sys.stderr)
    return dict(summary=summary, requests=results)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-prompts", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--label")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    levels = []
    for conc in [int(c) for c in args.concurrency.split(",")]:
        n = args.num_prompts or max(2 * conc, 8)
        prompts = [prompt_text(rng, args.input_len) for _ in range(n)]
        lv = asyncio.run(level(args, conc, prompts))
        s = lv["summary"]
        print(f"{args.label or ''} @{conc}: {s['output_throughput']:.1f} tok/s, "
              f"TTFT p50/p99 {s['ttft_ms']['p50']:.0f}/{s['ttft_ms']['p99']:.0f} ms, "
              f"ITL p50 {s['itl_ms']['p50']:.1f} ms, {s['completed']}/{s['num_prompts']} ok",
              file=sys.stderr)
        levels.append(lv)
    report = dict(base_url=args.base_url, model=args.model, input_len=args.input_len,
                  output_len=args.output_len, shared_prefix_len=0, seed=args.seed,
                  new_connection_per_request=False, label=args.label,
                  started_unix_s=int(time.time()), levels=levels)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main()
