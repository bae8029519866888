"""The output guard on the default model's own candidates (issue 21), unlabelled.

Run: ``.venv/bin/python -m bench.guard_live [--per-state 5] [--tokens 96]``

The labelled corpus (docs/reliability.md, section 8) measures recall and false rejection
on replies written by the project; this measures what the guard does to what the served
model actually writes: every project-written client state of the validation report
(``training_worker/data/side_by_side_prompts.json``) is answered ``--per-state`` times in
one batched call, with the counselor's own system prompt and sampling settings, and each
candidate is checked as ``Counselor.respond`` would. It prints the rejection share per
rule and every rejected candidate, for a person to read (which are right, which are false
rejections): no label exists for these texts, so no recall is claimed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from typing import Any

from counselor_engine import output_guard
from counselor_engine.backends import make_backend
from counselor_engine.backends.base import ChatMessage, GenerationParams
from counselor_engine.models import resolve_model_path


async def run(per_state: int, tokens: int, seed: int, states: int = 0) -> dict[str, Any]:
    from counselor_engine.counselor import system_prompt
    from training_worker.validation import side_by_side_states

    backend = make_backend("transformers", model_path=str(resolve_model_path()))
    rows: list[tuple[list[dict[str, Any]], int | None]] = []
    rejected: list[dict[str, Any]] = []
    total = 0
    chosen = side_by_side_states()[: states or None]
    for k, state in enumerate(chosen):
        system = system_prompt(state["modality"], state["skill"])
        prompt = [ChatMessage("system", system), ChatMessage("user", state["text"])]
        params = GenerationParams(max_new_tokens=tokens, temperature=0.9, top_p=0.95, seed=seed + k)
        texts = await backend.generate(prompt, n=per_state, params=params)
        context = output_guard.GuardContext(
            own_text=system + "\n" + state["text"], instructions=(system,)
        )
        verdicts = [output_guard.check(t, context) for t in texts]
        rows.append(([v.to_dict() for v in verdicts], 0))
        total += len(texts)
        for text, verdict in zip(texts, verdicts, strict=True):
            # Printed as it goes: on a busy machine a run may be stopped part way.
            print(json.dumps({"state": state["id"], "rules": list(verdict.rules), "text": text}),
                  flush=True)  # fmt: skip
            if not verdict.admitted:
                rejected.append({"state": state["id"], "rules": list(verdict.rules), "text": text})
    return {"counts": output_guard.rejection_counts(rows), "rejected": rejected, "total": total}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-state", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--states", type=int, default=0, help="first N states only (0: all)")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.per_state, args.tokens, args.seed, args.states))
    print(json.dumps(result["counts"], indent=1))
    for item in result["rejected"]:
        print(f"--- {item['state']} {item['rules']}\n{item['text']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
