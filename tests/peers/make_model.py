#!/usr/bin/env python3
"""Makes a tiny random-weight llama-architecture GGUF model, locally.

No weights can be downloaded here, so the model is generated: a real
vocabulary (a vocab-only GGUF shipped in the llama.cpp source tree) plus
random tensors of a small llama. Its output is gibberish; the engine, the
tokenisation, the streaming and the timing are real.

    make_model.py --vocab ggml-vocab-llama-spm.gguf --out DIR
        -> DIR/tiny-llama.gguf
"""
import argparse
import pathlib

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", required=True, type=pathlib.Path, help="vocab-only GGUF (SentencePiece llama vocabulary)")
    ap.add_argument("--out", required=True, type=pathlib.Path, help="output directory")
    ap.add_argument("--embd", type=int, default=256, help="embedding width (default 256)")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    ap.add_argument("--ctx", type=int, default=2048, help="context length (default 2048)")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()

    vocab = GGUFReader(a.vocab)
    fields = {k: f for k, f in vocab.fields.items() if k.startswith("tokenizer.")}
    if "tokenizer.ggml.tokens" not in fields:
        raise SystemExit(f"{a.vocab}: no tokenizer.ggml.tokens (not a vocab GGUF)")
    tokens = fields["tokenizer.ggml.tokens"].contents()
    n_vocab = len(tokens)

    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "tiny-llama.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_name("tokentap-tiny-llama")
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.embd)
    w.add_block_count(a.layers)
    n_ff = a.embd * 2
    w.add_feed_forward_length(n_ff)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.heads)
    w.add_rope_dimension_count(a.embd // a.heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)  # all F32
    for key, f in fields.items():
        main = f.types[0]
        if main == GGUFValueType.ARRAY:
            w.add_key_value(key, f.contents(), main, sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), main)

    rng = np.random.default_rng(a.seed)

    def t(name: str, *shape: int, scale: float = 0.02) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    t("token_embd.weight", n_vocab, a.embd)
    for i in range(a.layers):
        ones(f"blk.{i}.attn_norm.weight", a.embd)
        for m in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t(f"blk.{i}.{m}.weight", a.embd, a.embd)
        ones(f"blk.{i}.ffn_norm.weight", a.embd)
        t(f"blk.{i}.ffn_gate.weight", n_ff, a.embd)
        t(f"blk.{i}.ffn_up.weight", n_ff, a.embd)
        t(f"blk.{i}.ffn_down.weight", a.embd, n_ff)
    ones("output_norm.weight", a.embd)
    # A flat-ish output layer keeps sampling away from end-of-text for long
    # generations (max_tokens decides the length).
    t("output.weight", n_vocab, a.embd, scale=0.05)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    print(f"model: {path} ({path.stat().st_size // 1024} KiB, vocab {n_vocab}, {a.layers}x{a.embd})")


if __name__ == "__main__":
    main()
