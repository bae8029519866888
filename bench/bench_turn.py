"""A judged turn before and after shared-prefix sequence scoring (issue 23), in one run.

Run: ``.venv/bin/python -m bench.bench_turn [--model smollm2|tiny] [--tokens 160] [--reps 3]``.

Arms, interleaved and alternating which goes first, on one backend (so one model in
memory and the same machine load for both):

- **before**: the turn as main had it when issue 23 was filed: every contrastive
  sequence scored in full (``_logprobs_blocking(share_prefixes=False)``, which is the
  trainer's ``response_logprobs``), and generation on a dynamic KV cache
  (``_shared_prefix(static=False)``); the 5 pointwise choice prompts take today's shared
  path in both arms (one call of the judge's 4);
- **after**: the defaults now: sequence scoring on shared prefixes with leaves batched by
  length, generation on a preallocated (static) cache.

Each repetition runs the same graph-mode ``Counselor.respond`` turn in both arms (same
client, message, seed and judge, the evaluator measured best for the model), timing the
generation and judge calls inside it, and checks that both arms deliver the same candidate
with the same edges (the speed must come from not repeating work, never from judging
less). Then:

- a bare batched ``model.generate`` replaying the turn's own generate call (its prompt, N,
  parameters and seed, so the same tokens; ``generate`` on the backend: one prefill copied
  to N rows), against the turn's generation time;
- the judge pass's lower bound: one forward over the distinct tokens its calls read (the
  prompts' shared prefixes once, every prompt's own tail and response once), computed by
  running exactly those token segments through the decoder, with the vocabulary projection
  at response positions only, as independent rows; and what a whole turn would take with
  the judge at that bound (generation + bound), against the before arm: the best any judge
  that reads every one of those tokens in float32 can do;
- a **bfloat16 judge** arm: the same turn with the judge's calls on a bfloat16 copy of
  the model (generation stays float32), its time, its largest pair-probability difference
  from the float32 readings, how many criterion readings change side, and whether the
  delivered candidate and edges stay the same. Measured so the team can decide on it; the
  default stays float32 (issue 23 asks for the same probabilities within 1e-4).

Figures go to bench/RESULTS.md (section "judged turn (<model>)").
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from bench._results import write_section
from bench.bench_engine import MESSAGES, TimedBackend, model_path
from counselor_engine.backends.base import GenerationParams, Prompt
from counselor_engine.backends.transformers_backend import TransformersBackend
from counselor_engine.counselor import (
    ClientState,
    Counselor,
    CounselorConfig,
    DoneEvent,
    TurnRecord,
)
from counselor_engine.judge import Judge
from counselor_engine.memory import MemoryStore
from counselor_engine.torchkit import (
    PrefixNode,
    decoder_and_head,
    pair_ids,
    prefix_tree,
    render_prompt,
)

Readings = dict[tuple[int, int, str, str], tuple[float, float | None]]


class RecordingBackend(TimedBackend):
    """A :class:`TimedBackend` that also keeps the judge's calls (their token count and
    lower bound); ``judge`` serves them (default: ``inner``, which generates)."""

    def __init__(
        self, inner: TransformersBackend, judge: TransformersBackend | None = None
    ) -> None:
        super().__init__(inner)
        self.judge = judge or inner
        self.scored: list[tuple[list[Prompt], list[str] | None]] = []

    async def choice_probabilities(self, prompts: Any, choices: Any, **kw: Any) -> Any:
        self.scored.append((list(prompts), None))
        return await self._timed(self.judge.choice_probabilities(prompts, choices, **kw), "judge")

    async def sequence_logprobs(self, prompts: Any, responses: Any, **kw: Any) -> Any:
        self.scored.append((list(prompts), list(responses)))
        return await self._timed(self.judge.sequence_logprobs(prompts, responses, **kw), "judge")


async def one_turn(
    backend: TransformersBackend,
    args: argparse.Namespace,
    judge_backend: TransformersBackend | None = None,
) -> tuple[dict[str, float], tuple[Any, ...], RecordingBackend, Readings]:
    """One judged turn; its times, (reply, edges), the recorder and the judge's readings
    ((i, j, order, criterion) -> (z_i, vote))."""
    rec = RecordingBackend(backend, judge_backend)
    params = GenerationParams(max_new_tokens=args.tokens, temperature=0.9, top_p=0.95)
    # No time limit: the plain arm's judge alone can take minutes on a busy 2-core machine.
    config = CounselorConfig(n_candidates=args.n, generation=params, seed=7, backend_timeout_s=1e5)
    judge = Judge(rec, evaluator=args.evaluator)  # type: ignore[arg-type]
    client = ClientState("bench-turn", "cbt", 1, 4, memory=MemoryStore())
    counselor = Counselor(rec, config=config, judge=judge)  # type: ignore[arg-type]
    counselor.start_session(client, None)
    counselor.restore_turns(EARLIER)
    start = time.perf_counter()
    done, events = None, []
    async for event in counselor.respond(MESSAGES[2]):
        events.append(event)
        if isinstance(event, DoneEvent):
            done = event
    wall = time.perf_counter() - start
    if done is None:
        raise RuntimeError(f"the turn ended without a reply: {events[-1]!r}")
    edges = tuple(sorted((e["winner"], e["loser"]) for e in done.group.edges)) if done.group else ()
    outcome = (done.reply, edges)
    readings = {
        (jd["i"], jd["j"], jd["order"], jd["criterion"]): (jd["z_i"], jd["vote"])
        for jd in (done.group.judgments if done.group else [])
    }
    return {"wall": wall, **rec.by_kind}, outcome, rec, readings


# Two earlier exchanges, so the judged turn has a mid-session context to share.
EARLIER = [
    TurnRecord(k, message, reply, None, None, None, "none", None)
    for k, (message, reply) in enumerate(
        zip(
            MESSAGES[:2],
            (
                "That sounds exhausting. What does the anxiety feel like when it shows up at "
                "work, and what do you usually do when it starts?",
                "It sounds as if every comment lands hard and stays with you. What goes "
                "through your mind in the moment your manager points something out?",
            ),
            strict=True,
        )
    )
]


def distinct_segments(
    backend: TransformersBackend, calls: Sequence[tuple[list[Prompt], list[str] | None]]
) -> tuple[list[list[int]], int, int]:
    """The token segments a judge pass must read at least once (each shared prefix's own
    tokens, each prompt's own tail and its response), how many positions need the
    vocabulary projection (every response token; one per choice prompt), and how many
    tokens the calls hold in full."""
    tok = backend.tokenizer
    max_length = int(backend.model.config.max_position_embeddings)
    segments: list[list[int]] = []
    heads = whole = 0
    for prompts, replies in calls:
        pairs = [
            pair_ids(tok, render_prompt(tok, p), r, max_length=max_length, append_eos=True)
            if replies is not None
            else (list(tok(render_prompt(tok, p), add_special_tokens=False)["input_ids"]), [])
            for p, r in zip(prompts, replies or [""] * len(prompts), strict=True)
        ]
        heads += sum(len(r) or 1 for _, r in pairs)
        whole += sum(len(p) + len(r) for p, r in pairs)
        segments += _walk(prefix_tree([p for p, _ in pairs]), pairs, 0)
    return segments, heads, whole


def _walk(
    items: list[int | PrefixNode], pairs: list[tuple[list[int], list[int]]], depth: int
) -> list[list[int]]:
    out: list[list[int]] = []
    for item in items:
        if isinstance(item, PrefixNode):
            out.append(item.tokens[depth:])
            out += _walk(item.children, pairs, len(item.tokens))
        else:
            out.append(pairs[item][0][depth:] + pairs[item][1])
    return out


def lower_bound_seconds(
    backend: TransformersBackend, segments: list[list[int]], heads: int
) -> float:
    """One forward over ``segments`` as independent rows (48 a batch, length-sorted),
    plus the vocabulary projection of ``heads`` positions."""
    parts = decoder_and_head(backend.model)
    assert parts is not None
    decoder, head = parts
    pad = int(backend.tokenizer.pad_token_id)
    ordered = sorted(segments, key=len)
    start = time.perf_counter()
    with torch.inference_mode():
        for k in range(0, len(ordered), 48):
            rows = ordered[k : k + 48]
            width = max(map(len, rows))
            ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
            mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
            hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
            projected = hidden[mask.bool()][:heads]
            heads -= projected.shape[0]
            torch.log_softmax(head(projected).float(), dim=-1)
    return time.perf_counter() - start


async def bare_generate(backend: TransformersBackend, rec: RecordingBackend) -> float:
    """The turn's own generate call (prompt, N, parameters, seed: the same tokens), with
    nothing around it."""
    (prompt, kwargs), *_ = rec.generations
    start = time.perf_counter()
    await backend.generate(prompt, **kwargs)
    return time.perf_counter() - start


async def main_async(args: argparse.Namespace) -> None:
    name, path = model_path(args.model)
    backend = TransformersBackend(path)
    half = TransformersBackend(path, dtype=torch.bfloat16)  # the bfloat16 judge arm's
    shared = backend._logprobs_blocking
    plain = functools.partial(TransformersBackend._logprobs_blocking, backend, share_prefixes=False)
    static = backend._shared_prefix
    dynamic = functools.partial(TransformersBackend._shared_prefix, backend, static=False)
    names = ("before", "after", "bf16")
    arms: dict[str, list[dict[str, float]]] = {arm: [] for arm in names}
    outcomes: dict[str, set[tuple[Any, ...]]] = {arm: set() for arm in names}
    readings: dict[str, list[Readings]] = {arm: [] for arm in names}
    recorded: RecordingBackend | None = None
    bench_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    await one_turn(backend, args)  # warm-up: the embedder and crisis readers load once
    await one_turn(backend, args, half)
    for rep in range(args.reps):
        for arm in names[rep % 3 :] + names[: rep % 3]:  # each arm goes first in turn
            backend._logprobs_blocking = plain if arm == "before" else shared  # type: ignore[method-assign]
            backend._shared_prefix = dynamic if arm == "before" else static  # type: ignore[method-assign]
            figures, outcome, rec, read = await one_turn(
                backend, args, half if arm == "bf16" else None
            )
            arms[arm].append(figures)
            outcomes[arm].add(outcome)
            readings[arm].append(read)
            recorded = rec if arm == "after" else recorded
    backend._logprobs_blocking = shared  # type: ignore[method-assign]
    backend._shared_prefix = static  # type: ignore[method-assign]
    assert recorded is not None
    bare = statistics.median([await bare_generate(backend, recorded) for _ in range(args.reps)])
    segments, heads, read = distinct_segments(backend, recorded.scored)
    bound = statistics.median(
        [lower_bound_seconds(backend, segments, heads) for _ in range(args.reps)]
    )
    med = {
        arm: {k: statistics.median(f[k] for f in runs) for k in ("wall", "generate", "judge")}
        for arm, runs in arms.items()
    }
    b, a, h = med["before"], med["after"], med["bf16"]
    same = outcomes["before"] == outcomes["after"] and len(outcomes["after"]) == 1
    half_same = outcomes["bf16"] == outcomes["after"]
    exact, low = readings["after"][0], readings["bf16"][0]
    drift = max((abs(exact[k][0] - low[k][0]) for k in exact), default=0.0)
    flipped = sum(1 for k in exact if exact[k][1] != low[k][1])
    outside = 100 * (a["wall"] - a["judge"] - a["generate"]) / a["wall"]
    distinct = sum(map(len, segments))
    floor = (a["generate"] + bound) / b["wall"]
    half_before = h["wall"] / b["wall"]
    body = f"""Model `{name}`, one graph-mode turn: N = {args.n} candidates, {args.tokens} new tokens,
the `{args.evaluator}` evaluator (12 criteria), {args.reps} repetitions of each arm after
warm-up turns, arms interleaved (each goes first in turn), medians; torch threads = default
({torch.get_num_threads()}). Bench wall time {time.perf_counter() - bench_start:.0f} s; load average
{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.
Both arms delivered the same candidate with the same edges in every repetition: **{same}**.

| measure | before (main when issue 23 was filed) | after (main now) | after / before |
| --- | --- | --- | --- |
| whole turn | {b["wall"]:.1f} s | {a["wall"]:.1f} s | **{a["wall"] / b["wall"]:.2f}x** (target <= 0.5x) |
| judge calls in the turn | {b["judge"]:.1f} s | {a["judge"]:.1f} s | **{a["judge"] / b["judge"]:.2f}x** |
| generation in the turn | {b["generate"]:.1f} s | {a["generate"]:.1f} s | {a["generate"] / b["generate"]:.2f}x |

| measure | value | target |
| --- | --- | --- |
| judge tokens read (full sequences) / distinct | {read} / {distinct} | |
| judge pass lower bound: one forward over the distinct tokens | {bound:.1f} s | |
| judge calls after / lower bound | **{a["judge"] / bound:.2f}x** | <= 1.5x |
| a turn with the judge at its lower bound (generation + bound) / before | **{floor:.2f}x** | |
| bare batched generate replaying the turn's call (same tokens) | {bare:.1f} s | |
| turn's generation / bare | **{a["generate"] / bare:.2f}x** | <= 1.2x |
| engine time outside model calls (after) | {outside:.1f}% of the turn | < 5% |

The lower bound is what any float32 judge that reads those tokens must spend: sharing
removes the {read - distinct} repeated tokens of {read}, but the {distinct} distinct ones
(mostly every reply under each of the 24 criterion framings, which differ from the first
token on) must each be read once. It is measured, not derived (the distinct segments run
as independent rows, 48 a batch), so a judge that batches its rows better can come in
under it; the floor row is the turn that bound allows.

A bfloat16 judge (the same turn, judge calls on a bfloat16 copy of the model, generation
float32) is measured for the decision it needs, not used:

| measure | float32 (after) | bfloat16 judge | bfloat16 / float32 |
| --- | --- | --- | --- |
| whole turn | {a["wall"]:.1f} s | {h["wall"]:.1f} s | **{h["wall"] / a["wall"]:.2f}x** ({half_before:.2f}x of before) |
| judge calls in the turn | {a["judge"]:.1f} s | {h["judge"]:.1f} s | {h["judge"] / a["judge"]:.2f}x |
| largest difference of a reading z_i | | {drift:.1e} | issue 23 allows 1e-4 |
| criterion votes that change side (both orders) | | {flipped} of {len(exact)} | |
| same delivered candidate and edges | | {half_same} | |
"""
    print(body)
    write_section(f"judged turn ({name})", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("auto", "smollm2", "tiny"), default="auto")
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--evaluator", default="contrastive", help="the judge's (SmolLM2's default: contrastive)"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
