#!/usr/bin/env python3
"""Groups a `perf report --sort dso,symbol --stdio` listing into coarse categories
(GEMM, attention, elementwise, sampling, tokenizer, engine, HTTP, threading/idle,
memory, kernel, other) so a serving profile reads at a glance. Standard library only.
"""
import re
import sys
from collections import defaultdict

# First match wins: order matters (e.g. attention before generic softmax).
CATEGORIES = [
    ("attention", r"paged|flash|attention|attn|attend|merge_states|write_kv|online_softmax"),
    ("GEMM / GEMV (incl. LM head)", r"gemm|matmul|gemv|sgemm|microkernel|dot_f32|dot_product|tile_f32|tile_bf16|kernels::avx512|kernels::packed"),
    ("libm exp (softmax in attention or sampler)", r"expf"),
    ("elementwise (norm, RoPE, SiLU, residual)", r"rms_norm|rope|silu|swiglu|residual|add_assign|embed"),
    ("sampling / logits", r"sampl|argmax|top_k|top_p|logit|penalt|softmax"),
    ("tokenizer / detokenizer", r"tokeniz|detok|bpe|unicode|regex|onig"),
    ("scheduler / engine bookkeeping", r"schedul|kv_cache|block_pool|engine|runner|request|hash|xxh"),
    ("HTTP / JSON / async runtime", r"hyper|axum|tokio|serde|json|h2::|http|mio|tower|futures"),
    ("thread pool sync / idle", r"rayon|crossbeam|sched_yield|futex|park|spin|condvar|epoll|std::thread"),
    ("memory (copy, alloc)", r"memcpy|memmove|memset|malloc|free|realloc|alloc|page_fault|clear_page"),
]


def main(path):
    cats = defaultdict(float)
    top = defaultdict(list)
    total = 0.0
    for line in open(path, errors="replace"):
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)$", line)
        if not m:
            continue
        pct, dso, kind = float(m.group(1)), m.group(2), m.group(3)
        # perf pads the symbol column and may append '-' placeholder columns.
        sym = re.sub(r"(\s+-)+\s*$", "", m.group(4)).strip()
        total += pct
        name = None
        low = sym.lower()
        if kind == "k" and not re.search(r"page_fault|clear_page", low):
            name = "kernel (scheduling, syscalls, IRQs)"
        for cat, pat in CATEGORIES if name is None else []:
            if re.search(pat, low):
                name = cat
                break
        if name is None:
            name = "kernel (other)" if kind == "k" or "kernel" in dso else "other"
        cats[name] += pct
        top[name].append((pct, sym[:70]))
    for name, pct in sorted(cats.items(), key=lambda kv: -kv[1]):
        ex = "; ".join(f"{s} {p:.1f}%" for p, s in sorted(top[name], reverse=True)[:3])
        print(f"{pct:6.1f}%  {name}    e.g. {ex}")
    print(f"{total:6.1f}%  (sum of listed symbols)")


if __name__ == "__main__":
    main(sys.argv[1])
