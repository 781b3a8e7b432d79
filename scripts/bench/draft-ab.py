#!/usr/bin/env python3
"""Draft-model speculative decoding against llama-server's, interleaved in one run: the
same input-grounded prompts as spec-ab.py (one request at a time, greedy, streamed),
output tok/s end to end and while decoding, for any number of servers given as
`LABEL=COMMAND` (each must serve /health and /v1/chat/completions on the port that
replaces `{port}` in its command). All servers stay loaded for the whole run; rounds
go through them in order (A B C D, A B C D, ...). Prints a table of the mean rates
and, per server, its spec-decode counters when it exports vLLM's.

usage: draft-ab.py --rounds 3 --max-tokens 160 \\
         --server 'pagoda=target/release/pagoda serve --port {port} --model T.gguf' \\
         --server 'llama=llama-server --port {port} -m T.gguf -md D.gguf \\
                   --spec-type draft-simple --spec-draft-n-max 4 --no-repack' ...
(llama.cpp build 1652066 crashes at start with a quantized draft unless --no-repack;
BENCHMARKS.md, "Draft model against llama-server".) The last lines say, per server,
whether its answers equal the first server's (greedy: with and without a draft, the same).
Standard library only.
"""
import argparse
import importlib.util
import os
import random
import shlex
import subprocess

_spec = importlib.util.spec_from_file_location(
    "spec_ab", os.path.join(os.path.dirname(os.path.abspath(__file__)), "spec-ab.py"))
spec_ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spec_ab)


def start(label, command, port):
    cmd = shlex.split(command.replace("{port}", str(port)))
    print(f"[{label}] $", " ".join(shlex.quote(c) for c in cmd), flush=True)
    log = f"/tmp/draft-ab-{label}.log"
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    return spec_ab.wait_healthy(p, port, log)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", action="append", required=True, help="LABEL=COMMAND")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    a = ap.parse_args()
    servers = [s.split("=", 1) for s in a.server]
    ports = random.sample(range(18100, 18999), len(servers))
    procs, bases = [], {}
    try:
        for (label, cmd), port in zip(servers, ports):
            p, base = start(label, cmd, port)
            procs.append(p)
            bases[label] = base
        for label, _ in servers:
            spec_ab.run_round(bases[label], 8)  # warm-up, untimed
        e2e = {l: [] for l, _ in servers}
        dec = {l: [] for l, _ in servers}
        n = len(spec_ab.PROMPTS)
        answers = {}
        for r in range(a.rounds):
            for label, _ in servers:
                tok, secs, d, texts = spec_ab.run_round(bases[label], a.max_tokens)
                answers.setdefault(label, texts)
                e2e[label].append(tok / secs)
                dec[label].append((tok - n) / d)
                print(f"round {r + 1} {label}: {tok} tokens in {secs:.2f} s = {tok / secs:.2f} "
                      f"tok/s end to end, {dec[label][-1]:.2f} tok/s decoding", flush=True)
        mean = lambda x: sum(x) / len(x)
        print("| server | end to end tok/s | decoding tok/s |\n|---|---|---|")
        for label, _ in servers:
            print(f"| {label} | {mean(e2e[label]):.2f} | {mean(dec[label]):.2f} |")
        first = servers[0][0]
        for label, _ in servers[1:]:
            same = answers[label] == answers[first]
            print(f"[{label}] answers equal to {first}'s: {'yes' if same else 'no'}")
        for label, _ in servers:
            try:
                for l in spec_ab.spec_metrics(bases[label]):
                    print(f"[{label}] {l}")
            except Exception:
                pass
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
