"""Train the bundled demo model: a tiny Qwen3-MoE on CPython's own standard-library sources.

Writes weights, config, tokenizer, chat template, metrics and a model card to ``--out``
(default ``src/xinfer/assets/demo``) and the loss curve to ``docs/demo_loss.png``. Needs only
torch, transformers and tokenizers; matplotlib is used for the plot when it is installed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from demo_report import plot_loss, write_model_card

REPO_ROOT = Path(__file__).resolve().parents[1]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SAMPLE_PROMPTS = ["def fibonacci(n):\n", "import os\n", "class Stack:\n    def __init__(self):\n"]
# Directory names skipped under the stdlib root: third-party packages and byte-compiled caches.
SKIPPED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
# Per-device defaults; the GPU run targets ~5 minutes on one H200, the CPU run ~13 minutes.
DEVICE_DEFAULTS = {
    "cuda": {
        "steps": 3000,
        "batch_size": 32,
        "seq_len": 512,
        "max_minutes": 5.0,
        "eval_tokens": 1_000_000,
        "eval_every": 200,
    },
    "cpu": {
        "steps": 900,
        "batch_size": 16,
        "seq_len": 256,
        "max_minutes": 15.0,
        "eval_tokens": 150_000,
        "eval_every": 0,
    },
}


@dataclass(frozen=True)
class Corpus:
    """Source files split by file into training and held-out text, plus provenance."""

    train_texts: list[str]
    heldout_texts: list[str]
    num_train_files: int
    num_heldout_files: int
    num_bytes: int
    sources: list[str]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--steps", type=int, default=None, help="max optimizer steps")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--max-minutes", type=float, default=None, help="training wall budget")
    parser.add_argument("--eval-tokens", type=int, default=None, help="held-out tokens scored")
    parser.add_argument(
        "--eval-every", type=int, default=None, help="steps between held-out checks"
    )
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--max-epochs", type=float, default=4.0, help="passes over the data")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--max-mb", type=float, default=40.0, help="cap on corpus size (MB)")
    parser.add_argument("--heldout-every", type=int, default=20, help="every Nth file held out")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "src/xinfer/assets/demo")
    parser.add_argument("--plot", type=Path, default=REPO_ROOT / "docs/demo_loss.png")
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was given but torch sees no CUDA GPU; use --device cpu.")
    for key, value in DEVICE_DEFAULTS[args.device].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def iter_source_files(stdlib: Path) -> Iterator[tuple[str, Path]]:
    """Yield (licence tag, path) for every stdlib .py file and Debian doc text, sorted."""
    for path in sorted(stdlib.rglob("*.py")):
        if not SKIPPED_DIRS.intersection(path.relative_to(stdlib).parts):
            yield "cpython", path
    # Debian's python3.X-doc ships the reST sources of docs.python.org as _sources/*.txt.
    for doc_root in sorted(Path("/usr/share/doc").glob("python3*/html/_sources")):
        for path in sorted(doc_root.rglob("*.txt")):
            yield "python-doc", path


def load_corpus(stdlib: Path, max_mb: float, heldout_every: int) -> Corpus:
    train, heldout, sources, num_bytes = [], [], set(), 0
    for index, (tag, path) in enumerate(iter_source_files(stdlib)):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few test fixtures are deliberately not UTF-8
        if not text.strip():
            continue
        num_bytes += len(text.encode("utf-8"))
        if num_bytes > max_mb * 1e6:
            break
        (heldout if index % heldout_every == 0 else train).append(text)
        sources.add(tag)
    if not heldout or not train:
        sys.exit("No Python sources found under sysconfig's stdlib path; is this a full Python?")
    return Corpus(train, heldout, len(train), len(heldout), num_bytes, sorted(sources))


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def encode_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """Concatenate all files into one token stream, each file followed by <|endoftext|>."""
    eot = tokenizer.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def build_model(vocab_size: int, tokenizer, device: str):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=768,  # unused: every layer is MoE (mlp_only_layers empty)
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        moe_intermediate_size=256,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        output_router_logits=True,
        router_aux_loss_coef=0.01,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.token_to_id("<|im_end|>"),
        pad_token_id=tokenizer.token_to_id("<|endoftext|>"),
    )
    # grouped_mm runs all experts in one kernel on Hopper; on CPU the eager loop is as fast.
    experts = "grouped_mm" if device == "cuda" else "eager"
    model = Qwen3MoeForCausalLM._from_config(config, experts_implementation=experts)
    return model.to(device)


def lr_at(progress: float, base_lr: float, warmup: float = 0.03) -> float:
    """Linear warmup then cosine decay to 10% of ``base_lr``; ``progress`` runs 0 -> 1."""
    if progress < warmup:
        return base_lr * progress / warmup
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup))))
    return base_lr * (0.1 + 0.9 * cosine)


def make_optimizer(model, lr: float) -> torch.optim.AdamW:
    # Weight decay on matrices only; norms (1-D) are left alone.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def train(
    model, train_ids: torch.Tensor, heldout_ids: torch.Tensor, args: argparse.Namespace
) -> tuple[list[dict], int]:
    """Train on random windows of the token stream until --steps or --max-minutes runs out."""
    generator = torch.Generator().manual_seed(args.seed)
    optimizer = make_optimizer(model, args.lr)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device == "cuda")
    budget_s = args.max_minutes * 60
    # The corpus (3-10M tokens) is the limit on a GPU: past a few epochs the model memorises it.
    epoch_steps = len(train_ids) / (args.batch_size * args.seq_len)
    max_steps = max(1, min(args.steps, math.ceil(args.max_epochs * epoch_steps)))
    if max_steps < args.steps:
        print(f"capping at {max_steps} steps = {args.max_epochs:g} epochs of the training split")
    log, start, window_tokens, window_start = [], time.time(), 0, time.time()
    steps_done = 0
    model.train()
    for step in range(1, max_steps + 1):
        # The schedule follows whichever budget (steps or wall time) is closer to running out.
        progress = max((step - 1) / max_steps, (time.time() - start) / budget_s)
        if progress >= 1.0:
            print(f"wall budget of {args.max_minutes:.1f} min used after {step - 1} steps")
            break
        lr = lr_at(progress, args.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(
            0, len(train_ids) - args.seq_len - 1, (args.batch_size,), generator=generator
        )
        batch = torch.stack([train_ids[s : s + args.seq_len] for s in starts.tolist()])
        batch = batch.to(args.device, non_blocking=True)  # (batch_size, seq_len)
        with autocast:
            out = model(input_ids=batch, labels=batch)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps_done = step
        window_tokens += batch.numel()
        if step % args.log_every == 0 or step == 1 or step == max_steps:
            lm_loss = out.loss.item() - model.config.router_aux_loss_coef * out.aux_loss.item()
            now = time.time()
            record = {
                "step": step,
                "loss": round(lm_loss, 4),
                "aux_loss": round(out.aux_loss.item(), 4),
                "lr": lr,
                "grad_norm": round(grad_norm.item(), 3),
                "tokens": step * batch.numel(),
                "elapsed_s": round(now - start, 1),
            }
            if args.eval_every and (step % args.eval_every == 0 or step == max_steps):
                # A quick check on the first 64 held-out windows shows when memorising starts.
                record["heldout_ppl"] = round(heldout_ppl(model, heldout_ids, args, 64)[0], 2)
                model.train()
            log.append(record)
            print(
                f"step {step:5d} | loss {lm_loss:.3f} | aux {record['aux_loss']:.3f} | "
                f"lr {lr:.2e} | {window_tokens / (now - window_start):,.0f} tok/s | "
                f"{record['elapsed_s']:.0f}s"
                + (
                    f" | held-out ppl {record['heldout_ppl']:.1f}"
                    if "heldout_ppl" in record
                    else ""
                ),
                flush=True,
            )
            window_tokens, window_start = 0, now
    return log, steps_done


@torch.no_grad()
def heldout_ppl(
    model, heldout_ids: torch.Tensor, args: argparse.Namespace, max_windows: int | None = None
) -> tuple[float, torch.Tensor]:
    """Perplexity on non-overlapping held-out windows; also returns the scored target ids."""
    model.eval()
    num_windows = max(1, min(len(heldout_ids) - 1, args.eval_tokens) // args.seq_len)
    num_windows = min(num_windows, max_windows or num_windows)
    windows = heldout_ids[: num_windows * args.seq_len + 1]
    inputs = windows[:-1].view(num_windows, args.seq_len)  # (num_windows, seq_len)
    targets = windows[1:].view(num_windows, args.seq_len)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.device == "cuda")
    total_nll = 0.0
    for i in range(0, num_windows, args.batch_size):
        x = inputs[i : i + args.batch_size].to(args.device)
        y = targets[i : i + args.batch_size].to(args.device)
        with autocast:
            logits = model(input_ids=x, output_router_logits=False).logits.float()
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
        total_nll += nll.item()
    return math.exp(total_nll / targets.numel()), targets.flatten()


def unigram_ppl(train_ids: torch.Tensor, targets: torch.Tensor, vocab_size: int) -> float:
    """Perplexity of add-one-smoothed training token frequencies on the same held-out targets."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1.0
    log_probs = counts.log() - counts.sum().log()
    return math.exp(-log_probs[targets].mean().item())


@torch.no_grad()
def greedy_samples(model, tokenizer, device: str, max_new_tokens: int = 64) -> list[dict]:
    eos = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    samples = []
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt).ids], device=device)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[1],
        )
        completion = tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True)
        samples.append({"prompt": prompt, "completion": completion})
    return samples


def write_tokenizer_files(tokenizer, out: Path) -> None:
    tokenizer.save(str(out / "tokenizer.json"))
    added = {
        str(tokenizer.token_to_id(tok)): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for tok in SPECIAL_TOKENS
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "add_bos_token": False,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE + "\n")


def save_model(model, tokenizer, out: Path) -> None:
    model.config.output_router_logits = False  # inference default; training turned it on
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    eos = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
    generation = {"eos_token_id": eos, "pad_token_id": eos[1], "bos_token_id": None}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    # transformers 5 writes `num_local_experts` and `rope_parameters`; published Qwen3-MoE
    # checkpoints use `num_experts` and `rope_theta`, so write both spellings for any loader.
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["num_experts"] = config["num_local_experts"]
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    corpus = load_corpus(args.stdlib, args.max_mb, args.heldout_every)
    print(
        f"corpus: {corpus.num_train_files} train / {corpus.num_heldout_files} held-out files, "
        f"{corpus.num_bytes / 1e6:.1f} MB ({', '.join(corpus.sources)})"
    )
    tokenizer = train_tokenizer(corpus.train_texts, args.vocab_size)
    vocab_size = tokenizer.get_vocab_size()
    train_ids = encode_stream(tokenizer, corpus.train_texts)
    heldout_ids = encode_stream(tokenizer, corpus.heldout_texts)
    print(
        f"tokenizer: vocab {vocab_size}; {len(train_ids):,} train / {len(heldout_ids):,} held-out "
        f"tokens ({corpus.num_bytes / (len(train_ids) + len(heldout_ids)):.2f} bytes/token); "
        f"{time.time() - t0:.0f}s"
    )

    model = build_model(vocab_size, tokenizer, args.device)
    num_params = sum(p.numel() for p in model.parameters())
    cfg = model.config
    expert_params = (
        cfg.num_hidden_layers * cfg.num_experts * 3 * cfg.hidden_size * cfg.moe_intermediate_size
    )
    active = num_params - expert_params * (1 - cfg.num_experts_per_tok / cfg.num_experts)
    print(
        f"model: {num_params / 1e6:.2f}M params ({active / 1e6:.2f}M active), device {args.device}"
    )

    train_start = time.time()
    log, steps_done = train(model, train_ids, heldout_ids, args)
    wall_s = time.time() - train_start
    ppl, targets = heldout_ppl(model, heldout_ids, args)
    uni = unigram_ppl(train_ids, targets, vocab_size)
    print(f"held-out ppl {ppl:.2f} vs unigram {uni:.1f} ({uni / ppl:.1f}x lower)")
    samples = greedy_samples(model, tokenizer, args.device)
    for s in samples:
        print(f"--- {s['prompt']!r}\n{s['prompt']}{s['completion']}")

    args.out.mkdir(parents=True, exist_ok=True)
    for stale in args.out.iterdir():  # the directory holds exactly what this run writes
        if stale.is_file():
            stale.unlink()
    save_model(model, tokenizer, args.out)
    write_tokenizer_files(tokenizer, args.out)
    plot_loss(log, args.plot)
    last = [r["loss"] for r in log[-5:]]
    metrics = {
        "command": " ".join(["python", "scripts/train_demo.py", *sys.argv[1:]]),
        "config": json.loads((args.out / "config.json").read_text()),
        "num_params": num_params,
        "num_active_params": int(active),
        "weights_bytes": (args.out / "model.safetensors").stat().st_size,
        "data": {
            "sources": corpus.sources,
            "stdlib": str(args.stdlib),
            "python_version": (
                platform.python_version()
                if args.stdlib == Path(sysconfig.get_paths()["stdlib"])
                else args.stdlib.name  # a copied stdlib is named after its version
            ),
            "licence": "PSF-2.0",
            "max_mb": args.max_mb,
            "heldout_every": args.heldout_every,
            "num_train_files": corpus.num_train_files,
            "num_heldout_files": corpus.num_heldout_files,
            "num_bytes": corpus.num_bytes,
            "train_tokens": len(train_ids),
            "heldout_tokens": len(heldout_ids),
        },
        "train": {
            "device": args.device,
            "dtype": "bf16 autocast" if args.device == "cuda" else "fp32",
            "threads": torch.get_num_threads(),
            "steps": steps_done,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "lr": args.lr,
            "tokens_seen": steps_done * args.batch_size * args.seq_len,
            "wall_s": round(wall_s, 1),
            "final_loss": sum(last) / max(1, len(last)),
            "seed": args.seed,
        },
        "eval_tokens": targets.numel(),
        "heldout_ppl": ppl,
        "unigram_ppl": uni,
        "samples": samples,
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (args.out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    write_model_card(args.out, metrics, samples, args.plot)
    print(f"wrote {sorted(p.name for p in args.out.iterdir())} and {args.plot}")
    print(f"total {(time.time() - t0) / 60:.1f} min")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    main()
