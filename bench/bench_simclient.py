"""Simulated clients in character: on-profile share and crisis-flag share on 100 messages.

Run: ``.venv/bin/python -m bench.bench_simclient [--model PATH] [--per-profile 5]``.

Each of the 20 built-in profiles writes its opening and then answers a fixed script of
counselor replies (``SCRIPT``), ``--per-profile`` messages in all (5 x 20 = 100), with the
simulation lab's settings (``candidates`` = 3, the chosen message per
``simulator.choose_message``). For every message sent:

- on profile: cosine similarity (all-MiniLM-L6-v2) to the profile's own presenting problem
  at least ``THRESHOLD`` = 0.32. Why 0.32: it is the 95th percentile of the similarity
  between each profile's own first-person words (``voice``) and the OTHER 19 profiles'
  problems (computed here, printed with the figures), so a message counts as on profile
  only when it is closer to its own problem than 95% of other people's statements are
  to a problem that is not theirs. Also reported: the share whose nearest of the 20
  problems is its own.
- crisis-flag share: ``safety.assess`` says crisis (no built-in profile is a crisis profile,
  so the target is 0).
- role confusion among the raw samples (before choosing) and the fallback share.

Figures go to bench/RESULTS.md, section "simulated clients (<model>)".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

from bench._results import write_section
from counselor_engine import safety
from counselor_engine.embeddings import default_embedder
from counselor_engine.simulation.interaction import ALL_STATES
from counselor_engine.simulation.profiles import builtin_profiles
from counselor_engine.simulation.simulator import (
    SimulatedClient,
    clean_message,
    role_confusion,
)

SCRIPT = (
    "Thank you for telling me. What has that been like for you?",
    "When did you first notice this happening?",
    "What goes through your mind when it happens?",
    "What would you like to be different?",
)


class Recording:
    """Wraps the backend to keep every raw sample the simulator was offered."""

    def __init__(self, backend) -> None:  # type: ignore[no-untyped-def]
        self.backend = backend
        self.samples: list[str] = []
        self.name = backend.name

    async def generate(self, prompt, *, n, params, adapter=None):  # type: ignore[no-untyped-def]
        texts = await self.backend.generate(prompt, n=n, params=params, adapter=adapter)
        self.samples.extend(texts)
        return texts

    async def choice_probabilities(self, prompts, choices, *, adapter=None):  # type: ignore[no-untyped-def]
        return await self.backend.choice_probabilities(prompts, choices, adapter=adapter)


def write_json(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text(json.dumps(rows, indent=1))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="")
    parser.add_argument("--per-profile", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--remind", action="store_true", help="SimulatedClient(remind=True)")
    parser.add_argument("--dump", default="", help="write every message and its figures (JSON)")
    args = parser.parse_args()
    from counselor_engine.backends.transformers_backend import TransformersBackend
    from counselor_engine.models import resolve_model_path

    path = Path(args.model) if args.model else resolve_model_path()
    backend = Recording(TransformersBackend(model_path=str(path)))
    embedder = default_embedder()
    profiles = builtin_profiles()
    problems = embedder.embed([p.presenting_problem for p in profiles])
    voices = embedder.embed([p.voice for p in profiles])
    cross = (voices @ problems.T)[~np.eye(len(profiles), dtype=bool)]
    threshold = float(np.percentile(cross, 95))
    sent: list[tuple[int, str, bool]] = []  # (profile index, text, fallback)
    start = time.perf_counter()
    for k, profile in enumerate(profiles):
        client = SimulatedClient(
            backend,  # type: ignore[arg-type]
            profile,
            ALL_STATES[k % len(ALL_STATES)],
            seed=k,
            candidates=3,
            embedder=embedder,
            max_new_tokens=args.tokens,
            min_exchanges=args.per_profile,  # never close inside the script
            remind=args.remind,
        )
        opening = await client.opening()
        sent.append((k, opening, opening == profile.voice))
        transcript = [("client", opening)]
        for line in SCRIPT[: args.per_profile - 1]:
            transcript.append(("counselor", line))
            turn = await client.reply(transcript)
            sent.append((k, turn.text, turn.fallback))
            transcript.append(("client", turn.text))
        print(profile.id, f"{time.perf_counter() - start:.0f} s", flush=True)
    vectors = embedder.embed([t for _, t, _ in sent])
    sims = vectors @ problems.T
    own = np.array([sims[n, k] for n, (k, _, _) in enumerate(sent)])
    nearest = np.array([int(sims[n].argmax()) == k for n, (k, _, _) in enumerate(sent)])
    crisis = [safety.assess(t).is_crisis for _, t, _ in sent]
    fallbacks = sum(f for _, _, f in sent)
    raw = [clean_message(s, "") for s in backend.samples]
    confused = sum(1 for s in raw if role_confusion(s)) + sum(1 for s in raw if not s)
    n = len(sent)
    made = np.array([not f for _, _, f in sent])  # the model's own words, not the fallback
    if args.dump:
        rows = [
            {"profile": profiles[k].id, "text": t, "fallback": f, "cosine": float(c)}
            for (k, t, f), c in zip(sent, own, strict=True)
        ]
        write_json(Path(args.dump), rows)
    body = (
        f"Model `{path.name}`, {n} messages ({len(profiles)} profiles x {args.per_profile}: "
        f"opening + scripted counselor replies), 3 candidates each, {args.tokens} new tokens, "
        f"reminder {'on' if args.remind else 'off'}.\n\n"
        f"| figure | value |\n|---|---:|\n"
        f"| on profile (cosine to own problem >= {threshold:.2f}) | {np.mean(own >= threshold):.0%} |\n"
        f"| on profile, generated messages only (fallbacks left out) | "
        f"{np.mean(own[made] >= threshold) if made.any() else 0:.0%} of {int(made.sum())} |\n"
        f"| own problem is the nearest of the 20 | {nearest.mean():.0%} |\n"
        f"| mean cosine to own problem | {own.mean():.2f} |\n"
        f"| crisis-flag share (target 0: no crisis profiles) | {np.mean(crisis):.0%} |\n"
        f"| fallback to the profile's own words | {fallbacks / n:.0%} |\n"
        f"| raw samples refused as counselor talk or empty | "
        f"{confused}/{len(raw)} |\n\n"
        f"Threshold: the 95th percentile of cosine(profile's own words, another profile's "
        f"problem) over the 380 cross pairs = {threshold:.3f} (own words vs own problem: "
        f"mean {np.mean(np.diag(voices @ problems.T)):.2f}). Wall time "
        f"{time.perf_counter() - start:.0f} s on a shared 2-core CPU.\n\nSamples: "
        + "; ".join(
            f"{profiles[k].id}: \u201c{t[:90]}\u201d" for k, t, _ in sent[:: max(1, n // 6)]
        )
    )
    write_section(f"simulated clients ({path.name})", body)
    print(body)


if __name__ == "__main__":
    asyncio.run(main())
