"""LiPO round benchmark: one optimisation step, ours vs TRL's DPOTrainer, and a full round.

    .venv/bin/python bench/bench_lipo.py            # SmolLM2-135M (var/models), CPU
    .venv/bin/python bench/bench_lipo.py --quick    # the tiny test model: a smoke run

Same 320 preference pairs, model, LoRA (rank 8 on q/k/v/o, alpha 16) and sequence lengths
for both: 35 candidate groups of 5 candidates (per modality six complete graphs of 10
edges and one of 4, so each of the 5 modalities has exactly 64 edges, as App. C needs).
TRL gets the same pairs as (prompt, chosen, rejected) rows and, with a peft model and no
``precompute_ref_log_probs``, computes the reference under ``disable_adapter()`` every
step; ours computes it once per round and scores each candidate once per step however
many edges it is in, in length-sorted micro-batches. One optimiser step covers all 320
pairs on both sides (TRL: batch 16 x 20 accumulation steps).

Each measurement runs in its own subprocess (peak memory = the kernel's VmHWM, reset just
before the measured step), one after the other in this one run. The full round runs the
real ``run_round`` against a throwaway PostgreSQL database (``test_<db>_lipobench``),
dropped afterwards. Figures go to bench/RESULTS.md (section "LiPO round").

The three objectives of Table 3 on the same batch (``--objectives-only`` runs just this;
section "LiPO objectives (<model>)"): each group gets two-order supports whose SOCA graph
(Eq. 7, floor 0.1) is exactly its 320-edge batch graph (the pairs the batch leaves out
disagree between orders). From the same groups and model: LiPO (Eq. 5-6: SOCA weights,
per-group normalisation), pairwise DPO (every SOCA edge a unit-weight pair, mean over
all pairs) and no-SOCA (Eq. 5-6 over the raw single-order edges). For each: pairs used,
their weight sum, loss and gradient norm at step 0, loss after one step, and after one
step how many of the 320 SOCA pairs the policy ranks right (h_w > h_l).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import write_section  # noqa: E402  (after the path fix above)

MODALITIES = ("cbt", "bt", "het", "pdt", "pmt")
N_CANDIDATES = 5
RANK = 8
BETA = 0.1
LR = 1e-5
TRL_BATCH, TRL_ACCUMULATION = 16, 20  # 320 pairs per optimiser step


def _words(text: str) -> list[str]:
    return text.split()


WORDS = _words(
    "I feel anxious about work and my partner says I should rest but the deadlines keep "
    "coming and at night I cannot sleep because I keep thinking about what my boss said "
    "in the meeting and whether my family would understand if I told them how tired I am"
)
REPLIES = _words(
    "That sounds really hard. It makes sense that you feel this way, and we can take it "
    "one small step at a time. What helps you, even a little, when the worry rises at "
    "night? Breathing slowly can calm the body, and naming the thought can loosen it."
)
CURT = _words("Whatever. Just stop it. Not my problem, figure it out yourself. Fine. Move on.")


# -- data -------------------------------------------------------------------------------


def build_groups(prompt_words: int, reply_words: int, seed: int = 0) -> list[dict[str, Any]]:
    """35 groups, 320 edges, 64 per modality; deterministic text of the given sizes.

    Candidate k mixes warm and curt words with a warm share of 1 - k/4, and edges point
    from lower to higher k: a preference a model can learn and carry to held-out groups,
    so the round's validation measures something.
    """
    rng = random.Random(seed)
    groups = []
    for modality in MODALITIES:
        for index in range(7):
            user = " ".join(rng.choice(WORDS) for _ in range(prompt_words))
            candidates = [
                " ".join(
                    rng.choice(REPLIES if rng.random() < 1 - k / 4 else CURT)
                    for _ in range(rng.randint(reply_words // 2, reply_words))
                )
                for k in range(N_CANDIDATES)
            ]
            pairs = [(i, j) for i in range(N_CANDIDATES) for j in range(i + 1, N_CANDIDATES)]
            if index == 6:
                pairs = pairs[:4]  # an incomplete graph: 6 x 10 + 4 = 64 edges
            groups.append({
                "key": f"{modality}-{index}",
                "modality": modality,
                "prompt": [
                    {"role": "system", "content": "You are a warm, careful counselor."},
                    {"role": "user", "content": user},
                ],
                "candidates": candidates,
                "edges": [
                    {"winner": i, "loser": j, "weight": round(rng.uniform(0.1, 1.0), 3)}
                    for i, j in pairs
                ],
            })  # fmt: skip
    assert sum(len(g["edges"]) for g in groups) == 320
    return groups


def batch_supports(
    groups: list[dict[str, Any]], seed: int = 0
) -> list[dict[tuple[int, int], tuple[float, float]]]:
    """Per group, (p_forward, p_backward) for every pair whose SOCA graph is the group's
    edges: an edge w > l of weight c gets the two orders (1 + c) / 2 and a little more
    (in random order); a pair with no edge gets orders that disagree."""
    from counselor_engine.soca import build_preference_graph

    rng = random.Random(seed)
    out = []
    for g in groups:
        support: dict[tuple[int, int], tuple[float, float]] = {}
        strengths = {(e["winner"], e["loser"]): e["weight"] for e in g["edges"]}
        for i in range(N_CANDIDATES):
            for j in range(i + 1, N_CANDIDATES):
                if (i, j) in strengths or (j, i) in strengths:
                    c = float(strengths[(i, j)] if (i, j) in strengths else strengths[(j, i)])
                    low, high = (1 + c) / 2, (1 + c) / 2 + rng.uniform(0, (1 - c) / 2)
                    pair = (low, high) if rng.random() < 0.5 else (high, low)
                    if (j, i) in strengths:
                        pair = (1 - pair[0], 1 - pair[1])
                else:
                    lean = rng.uniform(0.05, 0.45)
                    pair = (0.5 + lean, 0.5 - rng.uniform(0.05, 0.45))
                    if rng.random() < 0.5:
                        pair = (pair[1], pair[0])
                support[(i, j)] = pair
        graph = build_preference_graph(N_CANDIDATES, support, floor=0.1, group_id=g["key"])
        assert {(e.winner, e.loser) for e in graph} == set(strengths), g["key"]
        out.append(support)
    return out


# -- memory -----------------------------------------------------------------------------


def reset_peak() -> None:
    # Not Linux, or not allowed: the peak then includes model loading.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_mib() -> float:
    status = Path("/proc/self/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else float("nan")


def rss_mib() -> float:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


# -- workers (each in its own process) --------------------------------------------------


def worker_ours(args: argparse.Namespace) -> dict[str, Any]:
    from counselor_engine.lipo.config import LipoConfig
    from training_worker.trainer import LipoTrainer, TrainGroup, to_edges

    groups = [
        TrainGroup(
            g["key"],
            g["modality"],
            g["prompt"],
            g["candidates"],
            to_edges(g["edges"], len(g["candidates"])),
        )
        for g in build_groups(args.prompt_words, args.reply_words)
    ]
    config = LipoConfig(
        lora_rank=RANK, learning_rate=LR, steps=1, beta=BETA, max_length=args.max_length,
        micro_batch_tokens=args.micro_batch_tokens,
    )  # fmt: skip
    trainer = LipoTrainer(args.model, parent=None, config=config, device="cpu")
    prepared = trainer.prepare(groups)
    started = time.perf_counter()
    reference = trainer.reference(prepared)
    reference_s = time.perf_counter() - started
    loaded = rss_mib()
    reset_peak()
    started = time.perf_counter()
    stats = trainer.step(prepared, reference)
    step_s = time.perf_counter() - started
    rows = sum(len(p.rows) for p in prepared)
    return {
        "step_s": step_s,
        "reference_s": reference_s,
        "peak_mib": peak_mib(),
        "rss_before_mib": loaded,
        "sequences_per_step": rows,
        "forward_passes": stats.forwards,
        "padded_tokens": stats.padded_tokens,
        "real_tokens": stats.real_tokens,
        "loss": stats.loss,
        "prompt_tokens_mean": sum(p.rows[0] for p in prepared) / len(prepared),
    }


def worker_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from counselor_engine.backends.base import ChatMessage
    from counselor_engine.torchkit import render_prompt

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = []
    for g in build_groups(args.prompt_words, args.reply_words):
        prompt = render_prompt(
            tokenizer, [ChatMessage(m["role"], m["content"]) for m in g["prompt"]]
        )
        for e in g["edges"]:
            rows.append({
                "prompt": prompt,
                "chosen": g["candidates"][e["winner"]],
                "rejected": g["candidates"][e["loser"]],
            })  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    lora = LoraConfig(
        r=RANK, lora_alpha=2 * RANK, lora_dropout=0.0, task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )  # fmt: skip
    config = DPOConfig(
        output_dir=str(Path(args.scratch) / "trl"),
        per_device_train_batch_size=TRL_BATCH,
        gradient_accumulation_steps=TRL_ACCUMULATION,
        max_steps=1,
        learning_rate=LR,
        beta=BETA,
        max_length=args.max_length,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        dataloader_num_workers=0,
        gradient_checkpointing=False,  # like ours; TRL's default recomputes activations
        seed=0,
    )
    timing: dict[str, float] = {}

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            timing["rss_before_mib"] = rss_mib()
            reset_peak()
            timing["start"] = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            timing["step_s"] = time.perf_counter() - timing["start"]
            timing["peak_mib"] = peak_mib()

    trainer = DPOTrainer(
        model=model, args=config, train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer, peft_config=lora, callbacks=[Clock()],
    )  # fmt: skip
    trainer.train()
    lengths = [len(r["prompt_ids"]) + max(len(r["chosen_ids"]), len(r["rejected_ids"]))
               for r in trainer.train_dataset]  # type: ignore[union-attr]  # fmt: skip
    return {
        "step_s": timing["step_s"],
        "peak_mib": timing["peak_mib"],
        "rss_before_mib": timing["rss_before_mib"],
        "sequences_per_step": 2 * len(rows) * 2,  # chosen + rejected, policy + reference
        "pairs": len(rows),
        "mean_pair_tokens": sum(lengths) / len(lengths),
    }


def worker_round(args: argparse.Namespace) -> dict[str, Any]:
    """The real ``run_round`` (claim -> ... -> validate) on a throwaway database."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection

    from webapp.learning.models import TrainingRun

    connection.settings_dict["TEST"]["NAME"] = f"test_{connection.settings_dict['NAME']}_lipobench"
    settings.PSYEVO_MODEL_PATH = args.model
    settings.ADAPTER_DIR = Path(args.scratch) / "adapters"
    settings.LIPO = replace(
        settings.LIPO, batch_edges=320, min_groups=32, modalities=MODALITIES,
        min_share=0.2, lora_rank=RANK, learning_rate=LR, steps=3, beta=BETA,
        max_length=args.max_length, micro_batch_tokens=args.micro_batch_tokens,
        heldout_groups=10, side_by_side=3, side_by_side_tokens=48,
    )  # fmt: skip
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        _bench_evidence(args)
        run = TrainingRun.objects.create(trigger="bench")
        from training_worker.round import run_round

        started = time.perf_counter()
        outcome = run_round(run.pk)
        total = time.perf_counter() - started
        run.refresh_from_db()
        return {
            "outcome": outcome,
            "total_s": total,
            "phases": run.timings,
            "error": run.error,
            "groups": run.group_count,
            "edges": run.edge_count,
            "checks": {
                c["name"]: c.get("detail", "")
                for c in (run.output_version.validation_report or {}).get("checks", [])
            }
            if run.output_version
            else {},
        }
    finally:
        connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)


def _bench_evidence(args: argparse.Namespace) -> None:
    """The 35 batch groups plus 2 held-out groups per modality, as buffer rows."""
    import uuid

    from django.utils import timezone

    from webapp.accounts.models import ClientProfile, User
    from webapp.counseling.models import Course, Session, Turn
    from webapp.learning.models import CandidateGroup

    batch = build_groups(args.prompt_words, args.reply_words, seed=0)
    extra = [
        g
        for g in build_groups(args.prompt_words, args.reply_words, seed=1)
        if g["key"].endswith(("-0", "-1"))
    ]
    for n, group in enumerate(batch + extra):
        user = User.objects.create(username=f"bench{n}", role="client")
        ClientProfile.objects.create(user=user, modality=group["modality"])
        course = Course.objects.create(client=user, modality=group["modality"])
        session = Session.objects.create(course=course, client=user, index=0, status="ended",
                                         ended_at=timezone.now())  # fmt: skip
        turn = Turn.objects.create(session=session, seq=0, role="counselor", text="-")
        CandidateGroup.objects.create(
            turn=turn, session=session, client=user, modality=group["modality"],
            group_key=uuid.uuid4().hex, mode="graph", state_slot="s", skill="k",
            prompt=group["prompt"], candidates=group["candidates"], judgments={}, support={},
            edges=group["edges"], pointwise=[], depths=[], delivered=0, admissible=True,
            edge_count=len(group["edges"]),
        )  # fmt: skip


def worker_objectives(args: argparse.Namespace) -> dict[str, Any]:
    """LiPO, pairwise DPO and no-SOCA on one batch, each from the same fresh adapter."""
    from counselor_engine.lipo.config import LipoConfig
    from counselor_engine.soca import raw_preference_edges
    from training_worker.trainer import LipoTrainer, TrainGroup, to_edges

    raw_groups = build_groups(args.prompt_words, args.reply_words)
    supports = batch_supports(raw_groups)

    def train_groups(no_soca: bool) -> list[TrainGroup]:
        return [
            TrainGroup(
                g["key"], g["modality"], g["prompt"], g["candidates"],
                raw_preference_edges(N_CANDIDATES, support) if no_soca
                else to_edges(g["edges"], N_CANDIDATES),
            )
            for g, support in zip(raw_groups, supports, strict=True)
        ]  # fmt: skip

    soca_groups = train_groups(no_soca=False)
    results: dict[str, Any] = {}
    for name, loss, groups in (
        ("lipo", "lipo", soca_groups),
        ("pairwise_dpo", "pairwise_dpo", soca_groups),
        ("no_soca", "lipo", train_groups(no_soca=True)),
    ):
        config = LipoConfig(
            lora_rank=RANK, learning_rate=args.objective_lr, steps=1, beta=BETA,
            max_length=args.max_length, micro_batch_tokens=args.micro_batch_tokens, loss=loss,
        )  # fmt: skip
        trainer = LipoTrainer(args.model, parent=None, config=config, device="cpu")
        prepared = trainer.prepare(groups)
        reference = trainer.reference(prepared)
        first = trainer.step(prepared, reference)
        second = trainer.step(prepared, reference)  # the loss after the first update
        h = trainer.utilities(prepared, reference)
        right = sum(
            float(u[e.winner] - u[e.loser]) > 0
            for u, g in zip(h, soca_groups, strict=True)
            for e in g.edges
        )
        results[name] = {
            "pairs": sum(len(g.edges) for g in groups),
            "weight": (
                float(sum(len(g.edges) for g in groups))
                if loss == "pairwise_dpo"
                else sum(e.weight for g in groups for e in g.edges)
            ),
            "loss0": first.loss,
            "grad0": first.grad_norm,
            "loss1": second.loss,
            "right": right,
            "log2": math.log(2),
        }
    return results


def objectives_body(args: argparse.Namespace, res: dict[str, Any]) -> str:
    labels = {
        "lipo": "LiPO (Eq. 5-6: SOCA weights, per-group mean)",
        "pairwise_dpo": "pairwise DPO (every SOCA edge, weight 1, mean over pairs)",
        "no_soca": "no-SOCA (Eq. 5-6 on raw single-order edges)",
    }
    rows = "\n".join(
        f"| {labels[k]} | {r['pairs']} | {r['weight']:.1f} | {r['loss0']:.4f} | "
        f"{r['grad0']:.3e} | {r['loss1']:.4f} | {r['right']}/320 |"
        for k, r in res.items()
    )
    header = (
        "| objective | pairs | weight sum | loss, step 0 | grad norm, step 0 "
        "| loss after 1 step | SOCA pairs ranked right after 1 step |"
    )
    return f"""Model `{Path(args.model).name}`, CPU, LoRA rank {RANK}, beta {BETA}, lr {args.objective_lr},
one AdamW step from the same fresh adapter. Batch: 35 groups x {N_CANDIDATES} candidates (320 SOCA
edges, 64 per modality; weights as trained); the no-SOCA variant reads the same groups' forward order only, so it
trains every pair (10 per group) with weight |2 p_forward - 1|.

{header}
|---|---|---|---|---|---|---|
{rows}

At step 0 the policy equals the reference (h = 0), so pairwise DPO's loss is log 2 =
{math.log(2):.4f} per pair, while LiPO's is log 2 times the mean per-group weight.
"""


WORKERS = {"ours": worker_ours, "trl": worker_trl, "round": worker_round,
           "objectives": worker_objectives}  # fmt: skip


# -- orchestration ----------------------------------------------------------------------


def spawn(name: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", name, "--model", args.model,
           "--prompt-words", str(args.prompt_words), "--reply-words", str(args.reply_words),
           "--max-length", str(args.max_length), "--micro-batch-tokens", str(args.micro_batch_tokens),
           "--scratch", args.scratch, "--objective-lr", str(args.objective_lr)]  # fmt: skip
    print(f"[bench] {name} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-4000:])
        raise SystemExit(f"[bench] worker {name} failed ({out.returncode})")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"[bench] {name}: {time.perf_counter() - started:.0f} s wall", file=sys.stderr, flush=True
    )
    return result


def resolve_model(choice: str, scratch: Path) -> str:
    if choice == "tiny":
        from counselor_engine.backends.tiny import build_tiny_model

        return str(build_tiny_model(scratch / "tiny-model"))
    if choice == "smollm2":
        from counselor_engine.models import resolve_model_path

        return str(resolve_model_path(progress=None))
    return choice


def report(
    args: argparse.Namespace, ours: dict[str, Any], trl: dict[str, Any], rnd: dict[str, Any]
) -> str:
    ratio = ours["step_s"] / trl["step_s"]
    amortised = (ours["step_s"] * 3 + ours["reference_s"]) / 3 / trl["step_s"]
    waste = 1 - ours["real_tokens"] / ours["padded_tokens"]
    phases = rnd.get("phases", {})
    order = ("claim", "load", "reference", "optimise", "save", "validate")
    phase_rows = "\n".join(f"| {p} | {phases[p]:.1f} |" for p in order if p in phases)
    import torch

    table = "\n".join([
        f"| | ours (LiPO, `training_worker.trainer`) | TRL {_trl_version()} `DPOTrainer` |",
        "|---|---|---|",
        f"| time per step | **{ours['step_s']:.1f} s** | {trl['step_s']:.1f} s |",
        f"| sequences scored per step | {ours['sequences_per_step']} (each candidate once) "
        f"| {trl['sequences_per_step']} (chosen + rejected, policy + reference) |",
        f"| reference log-probs | once per round: {ours['reference_s']:.1f} s "
        "| every step (inside the step time) |",
        f"| padding waste | {waste:.1%} ({ours['forward_passes']} length-sorted micro-batches "
        f"of <= {args.micro_batch_tokens} tokens) "
        f"| batches of {TRL_BATCH} pairs x {TRL_ACCUMULATION} accumulation steps |",
        f"| peak RSS during the step | {ours['peak_mib']:.0f} MiB "
        f"(before: {ours['rss_before_mib']:.0f}) "
        f"| {trl['peak_mib']:.0f} MiB (before: {trl['rss_before_mib']:.0f}) |",
    ])  # fmt: skip
    outcome = (
        f"Outcome: {rnd.get('outcome')} ({rnd.get('groups')} groups, {rnd.get('edges')} edges), "
        f"total {rnd.get('total_s', 0):.1f} s."
    )
    return f"""
Model `{Path(args.model).name}`, CPU ({torch.get_num_threads()} threads), float32, LoRA rank {RANK}
(q/k/v/o, alpha {2 * RANK}), beta {BETA}, lr {LR}. Batch: 35 groups x {N_CANDIDATES} candidates,
320 preference pairs (64 per modality), prompts ~{ours["prompt_tokens_mean"]:.0f} tokens, mean
pair length {trl["mean_pair_tokens"]:.0f} tokens (prompt + longer reply), max_length {args.max_length}.

### One optimisation step on the same 320 pairs

{table}

Ours / TRL time per step: **{ratio:.2f}x** (target <= 0.7x); with our once-per-round reference
pass spread over a round's 3 steps: {amortised:.2f}x.

### A full round (`run_round`, 3 steps, real database), wall time by phase

{outcome}

| phase | seconds |
|---|---|
{phase_rows}

Validation: {"; ".join(f"{k}: {v}" for k, v in rnd.get("checks", {}).items())}.
The validate phase includes held-out accuracy (parent and candidate) and greedy
side-by-side replies (3 prompts x 2 versions x up to 48 tokens).
"""


def _trl_version() -> str:
    try:
        import trl

        return str(trl.__version__)
    except ImportError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=sorted(WORKERS))
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny, or a model folder")
    parser.add_argument("--quick", action="store_true", help="tiny model, short texts")
    parser.add_argument("--prompt-words", type=int, default=40)
    parser.add_argument("--reply-words", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--scratch", default="")
    parser.add_argument("--objectives-only", action="store_true",
                        help="only the three Table 3 objectives on the same batch")  # fmt: skip
    parser.add_argument("--objective-lr", type=float, default=1e-3,
                        help="learning rate of the objectives comparison's one step")  # fmt: skip
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](args)))
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lipo-bench-") as scratch:
        args.scratch = scratch
        if args.quick:
            args.model, args.prompt_words, args.reply_words = "tiny", 12, 8
        args.model = resolve_model(args.model, Path(scratch))
        objectives = spawn("objectives", args)
        name = "tiny" if args.quick or args.model.endswith("tiny-model") else Path(args.model).name
        section = objectives_body(args, objectives)
        print(section)
        write_section(f"LiPO objectives ({name})", section)
        if args.objectives_only:
            return
        ours = spawn("ours", args)
        trl = spawn("trl", args)
        rnd = spawn("round", args)
    body = report(args, ours, trl, rnd)
    print(body)
    if not args.quick:
        write_section("LiPO round", body)


if __name__ == "__main__":
    main()
