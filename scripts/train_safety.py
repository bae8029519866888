"""Train the crisis model (the learned second layer of ``counselor_engine.safety``).

Run: ``.venv/bin/python -m scripts.train_safety [--encoder hash|minilm|all] [--check]``

1. Training data: ``counselor_engine/data/safety/train_crisis*.jsonl`` plus the tuned
   splits (``dev``, ``round1``..``round4``) of ``tests/data/crisis_eval.jsonl``. Never the
   held-out split of that file, and never ``tests/data/crisis_eval_v2.jsonl`` (except the
   rounds listed in ``TRAINED_V2_ROUNDS``, each added only after its first-run figures were
   written down): those measure the model.
2. Features of the normalised texts (``safety_model.features``), two labels per text:
   level >= concern, and level == crisis.
3. Five-fold cross-validation (folds by row index, deterministic) gives out-of-fold
   probabilities. The crisis threshold is the lowest one whose out-of-fold false-positive
   rate on the training negatives (combined with the rules, as deployed) stays within a
   crisis share of the budget; the concern threshold the lowest one keeping all flags
   (concern or crisis) within ``FP_TOTAL``. Thresholds are chosen on training data only.
4. The L2 strength (``L2_GRID``) and the crisis share (``CRISIS_BUDGETS``) are the pair
   with the best out-of-fold recall (positives at their labelled level, rules and model
   combined) at those thresholds; ties go to stronger regularisation, then the smaller
   crisis share. Recall is favoured over precision only inside the fixed total budget: a
   missed crisis costs more than a needless hotline card, but every card costs trust.
5. Both heads are refit on all training rows and written with the thresholds and the
   sha256 of the training files to ``data/safety/crisis_model_<encoder>.npz``.

``--check`` retrains in memory and fails if the stored artifact differs (a test runs it for
the hash encoder, so an edited training file with a stale artifact fails CI).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from counselor_engine import safety, safety_model

ROOT = Path(__file__).resolve().parents[1]
TRAIN_GLOB = "train_crisis*.jsonl"
EVAL_FILE = ROOT / "counselor_engine" / "tests" / "data" / "crisis_eval.jsonl"
EVAL_V2_FILE = ROOT / "counselor_engine" / "tests" / "data" / "crisis_eval_v2.jsonl"
TUNED_SPLITS = frozenset({"dev", "round1", "round2", "round3", "round4"})
TRAINED_V2_ROUNDS: frozenset[str] = frozenset({"v2-r1", "v2-r2", "v2-r3", "v2-r4"})
# Share of hard negatives (idioms, negations, media, distress) that may be flagged at all
# (concern or crisis, rules and model together), and the candidate shares of it that may be
# flagged at crisis; the split is chosen by out-of-fold recall (see ``train``).
FP_TOTAL = 0.10
CRISIS_BUDGETS = (0.04, 0.06, 0.08)
L2_GRID = (3e-5, 1e-4, 3e-4)
RANK = {"none": 0, "concern": 1, "crisis": 2}


def training_files() -> list[Path]:
    files = [*sorted(safety_model.DATA_DIR.glob(TRAIN_GLOB)), EVAL_FILE]
    return files + ([EVAL_V2_FILE] if TRAINED_V2_ROUNDS else [])


def training_rows() -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in sorted(safety_model.DATA_DIR.glob(TRAIN_GLOB)):
        rows += [json.loads(line) for line in path.read_text("utf-8").splitlines() if line]
    for line in EVAL_FILE.read_text("utf-8").splitlines():
        row = json.loads(line) if line else None
        if row and row["split"] in TUNED_SPLITS:
            rows.append(row)
    for line in EVAL_V2_FILE.read_text("utf-8").splitlines():
        row = json.loads(line) if line else None
        if row and row["split"] in TRAINED_V2_ROUNDS:
            rows.append(row)
    return rows


def _threshold(scores: np.ndarray, floor: np.ndarray, budget: float) -> float:
    """Lowest threshold t whose flagged share (score >= t, or already flagged) <= budget."""
    for t in np.round(np.arange(0.05, 0.96, 0.01), 2):
        if float(np.mean(floor | (scores >= t))) <= budget:
            return float(t)
    return 0.96


def _data(encoder: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Features, labels, rule levels, where the model may act, and the row count."""
    rows = training_rows()
    x = safety_model.features([safety.normalise(r["text"]) for r in rows], encoder)
    labels = np.array([RANK[r["level"]] for r in rows])
    ruled = [safety.rules_assess(r["text"]) for r in rows]
    rules = np.array([RANK[a.level] for a in ruled])
    # Where the model may not act (see safety.model_may_raise) it cannot add a false positive.
    may = np.array([safety.model_may_raise(a) for a in ruled])
    return x, labels, rules, may, len(rows)


def _heads(labels: np.ndarray) -> dict[str, np.ndarray]:
    return {"concern": (labels >= 1).astype(float), "crisis": (labels == 2).astype(float)}


def _oof(x: np.ndarray, labels: np.ndarray, may: np.ndarray, l2: float) -> dict[str, np.ndarray]:
    """Out-of-fold probabilities of both heads (five folds by row index); 0 where the model
    may not act."""
    folds = np.arange(len(labels)) % 5
    oof = {name: np.zeros(len(labels)) for name in ("concern", "crisis")}
    for k in range(5):
        fit = folds != k
        for name, y in _heads(labels).items():
            w, b = safety_model.fit_logistic(x[fit], y[fit], l2=l2)
            oof[name][~fit] = safety_model._sigmoid(x[~fit] @ w + b)
    for name in oof:
        oof[name][~may] = 0.0
    return oof


def _operating_point(
    oof: dict[str, np.ndarray], labels: np.ndarray, rules: np.ndarray, budget: dict[str, float]
) -> tuple[dict[str, float], float]:
    """Thresholds from out-of-fold scores, and the out-of-fold recall they give (positives
    at their labelled level, rules and model combined as deployed)."""
    neg = labels == 0
    t_crisis = _threshold(oof["crisis"][neg], rules[neg] == 2, budget["crisis"])
    t_concern = _threshold(
        oof["concern"][neg],
        (rules[neg] >= 1) | (oof["crisis"][neg] >= t_crisis),
        budget["concern"],
    )
    model = np.where(oof["crisis"] >= t_crisis, 2, np.where(oof["concern"] >= t_concern, 1, 0))
    level = np.maximum(rules, model)
    recall = float(np.mean(level[~neg] >= labels[~neg]))
    return {"concern": t_concern, "crisis": t_crisis}, recall


def fit(
    encoder: str, x: np.ndarray, labels: np.ndarray, thresholds: dict[str, float], meta: dict
) -> safety_model.CrisisModel:
    """Both heads refit on every training row, at the chosen l2 and thresholds."""
    weights, bias = [], []
    for y in _heads(labels).values():
        w, b = safety_model.fit_logistic(x, y, l2=float(meta["l2"]))
        weights.append(w)
        bias.append(b)
    return safety_model.CrisisModel(
        encoder,
        np.stack(weights).astype(np.float32),
        np.array(bias, dtype=np.float32),
        thresholds,
        meta,
    )


def train(encoder: str) -> safety_model.CrisisModel:
    x, labels, rules, may, n = _data(encoder)
    # The regularisation and crisis share with the best out-of-fold recall within the
    # false-positive budget (ties: stronger regularisation, then the smaller crisis share).
    points = {}
    for l2 in L2_GRID:
        oof = _oof(x, labels, may, l2)
        for share in CRISIS_BUDGETS:
            budget = {"crisis": share, "concern": FP_TOTAL}
            points[(l2, share)] = (*_operating_point(oof, labels, rules, budget), budget)
    best = max(points, key=lambda k: (points[k][1], k[0], -k[1]))
    thresholds, recall, budget = points[best]
    meta = {
        "training_sha256": safety_model.training_digest(training_files()),
        "training_rows": n,
        "l2": best[0],
        "oof_recall": round(recall, 4),
        "fp_budget": budget,
    }
    return fit(encoder, x, labels, thresholds, meta)


def refit_matches(stored: safety_model.CrisisModel) -> bool:
    """Cheap check for tests: refitting at the stored l2 and thresholds gives the stored
    weights, and the training files are the ones it was trained on."""
    x, labels, _rules, _may, n = _data(stored.encoder)
    again = fit(stored.encoder, x, labels, stored.thresholds, dict(stored.meta))
    return n == stored.meta["training_rows"] and same(again, stored)


def same(a: safety_model.CrisisModel, b: safety_model.CrisisModel) -> bool:
    return (
        a.encoder == b.encoder
        and a.thresholds == b.thresholds
        and a.meta.get("training_sha256") == b.meta.get("training_sha256")
        and np.allclose(a.weights, b.weights, atol=1e-4)
        and np.allclose(a.bias, b.bias, atol=1e-4)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", choices=(*safety_model.ENCODERS, "all"), default="all")
    parser.add_argument("--check", action="store_true", help="fail if the artifact is stale")
    args = parser.parse_args(argv)
    encoders = safety_model.ENCODERS if args.encoder == "all" else (args.encoder,)
    status = 0
    for encoder in encoders:
        model = train(encoder)
        path = safety_model.artifact_path(encoder)
        if args.check:
            stored = safety_model.CrisisModel.load(path)
            ok = same(model, stored)
            print(f"{path.name}: {'up to date' if ok else 'STALE: rerun scripts/train_safety'}")
            status |= 0 if ok else 1
        else:
            model.save(path)
            print(f"{path.name}: thresholds {model.thresholds}, {model.meta['training_rows']} rows")
    return status


if __name__ == "__main__":
    sys.exit(main())
