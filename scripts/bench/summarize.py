#!/usr/bin/env python3
"""Summarises a side-by-side.sh results directory as a markdown table.

Reads {pagoda,llama}-{main,prefix}-r<N>.json (written by `pagoda bench serve --json`),
{name}-r<N>.rss (VmHWM/VmRSS in kB) and pagoda's server logs (KV cache size), takes
the median over rounds per metric, and prints the medians, the per-round ratios and
the ratios Pagoda / llama-server against the targets of issue 5. Standard library only.
"""
import glob
import json
import os
import re
import statistics
import sys

SERVERS = ("pagoda", "llama")


def load(out):
    """{(server, variant, round): report}"""
    runs = {}
    for path in glob.glob(os.path.join(out, "*-r*.json")):
        m = re.match(r"(\w+)-(main|prefix)-r(\d+)\.json$", os.path.basename(path))
        if m:
            with open(path) as f:
                runs[(m.group(1), m.group(2), int(m.group(3)))] = json.load(f)
    return runs


def level(report, conc):
    for lv in report["levels"]:
        if lv["summary"]["concurrency"] == conc:
            return lv["summary"]
    return None


def rss_mib(out, server, rnd, key="VmHWM"):
    try:
        with open(os.path.join(out, f"{server}-r{rnd}.rss")) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def kv_mib(out):
    for path in sorted(glob.glob(os.path.join(out, "pagoda-r*.log"))):
        with open(path, errors="replace") as f:
            m = re.search(r"KV cache: .*?\(\d+ usable tokens.*?; ([\d.]+) MiB\)", f.read())
            if m:
                return float(m.group(1))
    return None


def main(out):
    runs = load(out)
    rounds = sorted({r for (_, _, r) in runs})
    if not rounds:
        sys.exit(f"no results in {out}")
    concs = sorted({lv["summary"]["concurrency"] for (s, v, _), rep in runs.items() if v == "main" for lv in rep["levels"]})
    pconcs = sorted({lv["summary"]["concurrency"] for (s, v, _), rep in runs.items() if v == "prefix" for lv in rep["levels"]})

    # metric name -> (variant, concurrency, extractor, unit, higher_is_better)
    metrics = []
    for c in concs:
        metrics.append((f"output tok/s @{c}", "main", c, lambda s: s["output_throughput"], "tok/s", True))
    for c in concs:
        metrics.append((f"TTFT p50 @{c}", "main", c, lambda s: s["ttft_ms"]["p50"], "ms", False))
        metrics.append((f"TTFT p99 @{c}", "main", c, lambda s: s["ttft_ms"]["p99"], "ms", False))
    for c in concs:
        metrics.append((f"ITL p50 @{c}", "main", c, lambda s: s["itl_ms"]["p50"], "ms", False))
        metrics.append((f"ITL p99 @{c}", "main", c, lambda s: s["itl_ms"]["p99"], "ms", False))
    for c in concs:
        metrics.append((f"E2E p50 @{c}", "main", c, lambda s: s["e2e_ms"]["p50"], "ms", False))
    for c in pconcs:
        metrics.append((f"shared-prefix output tok/s @{c}", "prefix", c, lambda s: s["output_throughput"], "tok/s", True))
        metrics.append((f"shared-prefix TTFT p50 @{c}", "prefix", c, lambda s: s["ttft_ms"]["p50"], "ms", False))
        metrics.append((f"shared-prefix TTFT p99 @{c}", "prefix", c, lambda s: s["ttft_ms"]["p99"], "ms", False))

    def values(server, variant, conc, fn):
        vals = []
        for r in rounds:
            rep = runs.get((server, variant, r))
            s = level(rep, conc) if rep else None
            vals.append(fn(s) if s and s["completed"] > 0 else None)
        return vals

    def med(vals):
        v = [x for x in vals if x is not None]
        return statistics.median(v) if v else None

    def fmt(x, unit):
        if x is None:
            return "n/a"
        return f"{x:.1f}" if unit == "tok/s" or x < 100 else f"{x:.0f}"

    lines = []
    lines.append(f"Rounds: {len(rounds)} (A B A B: pagoda, llama-server, ...); medians over rounds, per-round values in brackets.")
    lines.append("")
    lines.append("| metric | Pagoda | llama-server | ratio P/L (median) | per-round ratios |")
    lines.append("|---|---|---|---|---|")
    ratio_of = {}
    for name, variant, c, fn, unit, _hib in metrics:
        pv, lv = values("pagoda", variant, c, fn), values("llama", variant, c, fn)
        pm, lm = med(pv), med(lv)
        ratio = pm / lm if pm is not None and lm else None
        ratio_of[name] = ratio
        per_round = [f"{p / l:.2f}" if p is not None and l else "n/a" for p, l in zip(pv, lv)]
        lines.append(
            f"| {name} ({unit}) | {fmt(pm, unit)} [{', '.join(fmt(x, unit) for x in pv)}] "
            f"| {fmt(lm, unit)} [{', '.join(fmt(x, unit) for x in lv)}] "
            f"| {'n/a' if ratio is None else f'{ratio:.2f}'} | {' '.join(per_round)} |"
        )
    failed = {s: sum(lv["summary"]["failed"] for (sv, _, _), rep in runs.items() if sv == s for lv in rep["levels"]) for s in SERVERS}
    hwm = {s: [rss_mib(out, s, r) for r in rounds] for s in SERVERS}
    lines.append(
        f"| peak RSS, VmHWM (MiB) | {fmt(max((x for x in hwm['pagoda'] if x), default=None), 'ms')} "
        f"[{', '.join(fmt(x, 'ms') for x in hwm['pagoda'])}] "
        f"| {fmt(max((x for x in hwm['llama'] if x), default=None), 'ms')} [{', '.join(fmt(x, 'ms') for x in hwm['llama'])}] | | |"
    )
    lines.append(f"| failed requests (all rounds) | {failed['pagoda']} | {failed['llama']} | | |")
    lines.append("")

    # Targets of issue 5.
    def verdict(r, target, higher):
        if r is None:
            return "n/a", "n/a"
        ok = r >= target if higher else r <= target
        return f"{r:.2f}", "met" if ok else "missed"

    top = max(concs) if concs else None
    ptop = max(pconcs) if pconcs else None
    lines.append("| target (Pagoda / llama-server) | required | measured | verdict |")
    lines.append("|---|---|---|---|")
    rows = []
    if 1 in concs:
        rows.append(("output tok/s at 1 stream", ">= 1.0", ratio_of.get("output tok/s @1"), 1.0, True))
    if top:
        rows.append((f"output tok/s at {top} streams", ">= 1.5", ratio_of.get(f"output tok/s @{top}"), 1.5, True))
        rows.append((f"TTFT p99 at {top} streams", "<= 0.33", ratio_of.get(f"TTFT p99 @{top}"), 1 / 3, False))
    if ptop:
        rows.append((f"shared-prefix output tok/s at {ptop} streams", ">= 2.0", ratio_of.get(f"shared-prefix output tok/s @{ptop}"), 2.0, True))
    for name, req, r, t, hib in rows:
        m, v = verdict(r, t, hib)
        lines.append(f"| {name} | {req} | {m} | {v} |")
    kv = kv_mib(out)
    peak = max((x for x in hwm["pagoda"] if x), default=None)
    weights = None
    try:
        with open(os.path.join(out, "machine.txt")) as f:
            m = re.search(r"\((\d+) bytes\)", f.read())
            weights = int(m.group(1)) / 2**20 if m else None
    except OSError:
        pass
    if peak is not None and kv is not None and weights is not None:
        bound = weights + kv + 200 * 1e6 / 2**20
        lines.append(
            f"| peak RSS of pagoda serve | <= weights {weights:.0f} + KV {kv:.0f} + 200 MB = {bound:.0f} MiB "
            f"| {peak:.0f} MiB | {'met' if peak <= bound else 'missed'} |"
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
