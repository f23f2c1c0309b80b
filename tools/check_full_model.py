#!/usr/bin/env python3
"""check_full_model.py — an independent look at a `moe-gen --full-model` Qwen3-MoE model.

    tools/check_full_model.py DIR           # safetensors: config.json + *.safetensors
    tools/check_full_model.py FILE.gguf     # GGUF (first split)

Standard library only. It derives from config.json (or the GGUF keys) the parameters that
transformers' Qwen3MoeForCausalLM (checkpoint layout: one tensor per expert projection) or
llama.cpp's qwen3moe loader create, and compares them with what the file holds: every
missing, unexpected or misshapen tensor is printed, and the exit status is 1 if there is
one. With transformers and torch importable (a GPU machine), a safetensors model is also
loaded with Qwen3MoeForCausalLM.from_pretrained and run on a few tokens.
"""
import json
import os
import struct
import sys


def safetensors_header(d):
    """name -> (dtype, shape) over every *.safetensors file in d."""
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(d, f), "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            for k, v in json.loads(fh.read(n)).items():
                if k != "__metadata__":
                    out[k] = (v["dtype"], v["shape"])
    return out


def qwen3_hf_expected(c):
    """The checkpoint keys of Qwen3MoeForCausalLM for config c, with their shapes."""
    h, hd = c["hidden_size"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    q, kv, e = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, c["num_experts"]
    want = {"model.embed_tokens.weight": [c["vocab_size"], h], "model.norm.weight": [h]}
    if not c.get("tie_word_embeddings", False):
        want["lm_head.weight"] = [c["vocab_size"], h]
    sparse = c.get("decoder_sparse_step", 1)
    for L in range(c["num_hidden_layers"]):
        p = f"model.layers.{L}."
        want.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                     p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
                     p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
                     p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd]})
        if L in c.get("mlp_only_layers", []) or (L + 1) % sparse:
            ffn = {"gate_proj": [c["intermediate_size"], h], "up_proj": [c["intermediate_size"], h],
                   "down_proj": [h, c["intermediate_size"]]}
            want.update({f"{p}mlp.{k}.weight": s for k, s in ffn.items()})
            continue
        f = c["moe_intermediate_size"]
        want[p + "mlp.gate.weight"] = [e, h]
        for x in range(e):
            want.update({f"{p}mlp.experts.{x}.gate_proj.weight": [f, h],
                         f"{p}mlp.experts.{x}.up_proj.weight": [f, h],
                         f"{p}mlp.experts.{x}.down_proj.weight": [h, f]})
    return want


def gguf_read(path):
    """(metadata dict, {name: (ggml type, ne)}) of a GGUF file; arrays as lists."""
    with open(path, "rb") as fh:
        data = fh.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n:pos].decode("utf-8")

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    if data[:4] != b"GGUF":
        sys.exit(f"{path}: not GGUF")
    pos = 4
    take("I")
    n_tensors, n_kv = take("Q"), take("Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("I"))
    tensors = {}
    for _ in range(n_tensors):
        name = string()
        ne = [take("Q") for _ in range(take("I"))]
        tensors[name] = (take("I"), ne)
        take("Q")
    return kv, tensors


def qwen3_gguf_expected(kv):
    a = "qwen3moe."
    h, nh, nkv = kv[a + "embedding_length"], kv[a + "attention.head_count"], kv[a + "attention.head_count_kv"]
    hd, e, f = kv[a + "attention.key_length"], kv[a + "expert_count"], kv[a + "expert_feed_forward_length"]
    vocab = len(kv["tokenizer.ggml.tokens"])
    want = {"token_embd.weight": [h, vocab], "output_norm.weight": [h], "output.weight": [h, vocab]}
    for L in range(kv[a + "block_count"]):
        p = f"blk.{L}."
        want.update({p + "attn_norm.weight": [h], p + "attn_q.weight": [h, nh * hd],
                     p + "attn_k.weight": [h, nkv * hd], p + "attn_v.weight": [h, nkv * hd],
                     p + "attn_output.weight": [nh * hd, h], p + "attn_q_norm.weight": [hd],
                     p + "attn_k_norm.weight": [hd], p + "ffn_norm.weight": [h],
                     p + "ffn_gate_inp.weight": [h, e], p + "ffn_gate_exps.weight": [h, f, e],
                     p + "ffn_up_exps.weight": [h, f, e], p + "ffn_down_exps.weight": [f, h, e]})
    for k in ("context_length", "attention.layer_norm_rms_epsilon", "rope.dimension_count",
              "expert_used_count"):
        if a + k not in kv:
            print(f"missing metadata {a + k}")
            want["<metadata>"] = None
    if kv.get(a + "rope.dimension_count") != hd:
        print(f"rope.dimension_count {kv.get(a + 'rope.dimension_count')} != head dim {hd}")
        want["<metadata>"] = None
    return want


def compare(want, have):
    bad = 0
    for k, shape in want.items():
        if k not in have:
            print(f"missing {k} {shape}")
            bad += 1
        elif list(have[k]) != shape:
            print(f"shape {k}: {list(have[k])}, expected {shape}")
            bad += 1
    for k in sorted(set(have) - set(want)):
        print(f"unexpected {k} {list(have[k])}")
        bad += 1
    return bad


def try_transformers(d):
    try:
        import torch
        from transformers import Qwen3MoeForCausalLM
    except ImportError as e:
        print(f"transformers not importable ({e}): loading not tried")
        return 0
    model, info = Qwen3MoeForCausalLM.from_pretrained(d, dtype=torch.bfloat16, output_loading_info=True)
    bad = sum(len(v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    print(f"from_pretrained: {info}")
    ids = torch.tensor([[256, 72, 105, 33]])
    logits = model(ids).logits
    print(f"forward: logits {tuple(logits.shape)}, finite {bool(torch.isfinite(logits).all())}")
    return bad + (0 if torch.isfinite(logits).all() else 1)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    if path.endswith(".gguf"):
        kv, tensors = gguf_read(path)
        if kv.get("general.architecture") != "qwen3moe":
            sys.exit(f"{path}: architecture {kv.get('general.architecture')}, this checks qwen3moe")
        want = qwen3_gguf_expected(kv)
        bad = compare({k: v for k, v in want.items() if v is not None},
                      {k: ne for k, (_, ne) in tensors.items()}) + ("<metadata>" in want)
    else:
        with open(os.path.join(path, "config.json")) as fh:
            c = json.load(fh)
        if c.get("model_type") != "qwen3_moe":
            sys.exit(f"{path}: model_type {c.get('model_type')}, this checks qwen3_moe")
        if "num_attention_heads" not in c:
            sys.exit(f"{path}: an experts-only model (no attention in config.json): "
                     "generate it with --full-model")
        bad = compare(qwen3_hf_expected(c), {k: s for k, (_, s) in safetensors_header(path).items()})
        if not bad:
            bad = try_transformers(path)
    print("ok" if not bad else f"{bad} problem(s)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
