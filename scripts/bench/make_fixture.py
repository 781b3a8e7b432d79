#!/usr/bin/env python3
"""Writes a random-weight F16 GGUF at a named Llama shape with SmolLM2's tokenizer.

The benchmarks need real model sizes (1B-8B) where one-stream decode is a memory-bandwidth
problem; the weights' values do not matter for speed, so they are random (N(0, 0.02), norms
1). The tokenizer and chat template are copied from SmolLM2-135M's GGUF so both servers
tokenize real text. `make-fixture.sh` quantizes the result with llama.cpp's `llama-quantize`.

Usage: make_fixture.py SHAPE OUT.gguf [--tokenizer-from SMOLLM2.gguf] [--seed N]
"""

import argparse
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - a clear message instead of a traceback
    sys.exit("make_fixture.py needs the `gguf` package: python3 -m pip install gguf")

# name -> (layers, hidden, heads, kv_heads, ffn). Llama-3.2-1B/3B and Llama-3.1-8B.
SHAPES = {
    "llama-1b": (16, 2048, 32, 8, 8192),
    "llama-3b": (28, 3072, 24, 8, 8192),
    "llama-8b": (32, 4096, 32, 8, 14336),
}


def copy_tokenizer(src_path, w):
    """Every `tokenizer.*` key of `src_path`, with its GGUF types; returns the vocab size."""
    r = gguf.GGUFReader(src_path)
    vocab = None
    for name, field in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = field.contents()
        if name == "tokenizer.ggml.tokens":
            vocab = len(val)
        w.add_key_value(name, val, vtype, sub_type=sub)
    if vocab is None:
        sys.exit(f"{src_path} has no tokenizer.ggml.tokens")
    return vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--tokenizer-from", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    layers, hidden, heads, kv_heads, ffn = SHAPES[args.shape]
    head_dim = hidden // heads
    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name(f"random {args.shape}")
    w.add_context_length(8192)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    vocab = copy_tokenizer(args.tokenizer_from, w)
    w.add_vocab_size(vocab)

    rng = np.random.default_rng(args.seed)

    def mat(rows, cols):
        # numpy shape [rows, cols] is GGUF dims [cols, rows]: nn.Linear's [out, in].
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(hidden, dtype=np.float32)
    # Tied embeddings (no output.weight), as Llama-3.2-1B/3B have.
    w.add_tensor("token_embd.weight", mat(vocab, hidden))
    w.add_tensor("output_norm.weight", ones)
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", mat(heads * head_dim, hidden))
        w.add_tensor(p + "attn_k.weight", mat(kv_heads * head_dim, hidden))
        w.add_tensor(p + "attn_v.weight", mat(kv_heads * head_dim, hidden))
        w.add_tensor(p + "attn_output.weight", mat(hidden, heads * head_dim))
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", mat(ffn, hidden))
        w.add_tensor(p + "ffn_up.weight", mat(ffn, hidden))
        w.add_tensor(p + "ffn_down.weight", mat(hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


if __name__ == "__main__":
    main()
