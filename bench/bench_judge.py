"""Judge benchmark: one judge pass with the plain full-prompt forward vs shared prefixes.

Run: ``.venv/bin/python -m bench.bench_judge [--model auto|smollm2|tiny|PATH]``.

One judge pass of N = 5 candidates is what ``Judge.judge_group`` sends: 5 pointwise
prompts and 10 pairs x 2 orders x 12 criteria = 240 pairwise prompts, in two
``choice_probabilities`` calls. We record those exact calls once (a recording wrapper
around the real backend), then time them with ``TransformersBackend``'s plain path
(``share_prefixes=False``: every prompt in full, one left-padded forward) and with the
prefix-shared path (the default), repetitions interleaved and alternating which arm goes
first, so drift in machine load hits both; we report medians and their ratio, and the
largest difference between the two arms' probabilities.

The plain path is linear in the number of prompts and slow on a real model (minutes per
pass on a small CPU), so by default on a real model both arms are timed on a slice: the
pointwise call plus the first ``--plain-blocks`` (pair, order) blocks of 12 prompts (1 by
default); the plain full pass is then estimated as pointwise + pairwise slice x 240 /
slice (marked "est."). The shared path's slice ratio understates its gain: on the whole
pass it also shares the conversation and reply A across blocks. The shared full pass is
always measured. ``--plain-blocks 0`` times everything.

Last, a whole ``Counselor.respond`` turn (graph mode, N = 5, ``--tokens`` new tokens) with
the shared path, and the time its judge calls took inside it.
Figures go to bench/RESULTS.md (section "judge (<model>)").

Eq. 12 votes (``--vote-groups``, default 4; ``--votes-only`` skips the timing): the judge
reads ``--vote-groups`` groups once (the five candidates, rotated, under different client
messages); from those SAME readings the support shares are computed with binary votes
(the default) and with soft probabilities, and we count, per rule, the pairs whose
two-order edge strength c_ij (Eq. 7) clears the 0.1 floor, the edges the acyclic graph
admits, and their mean weight. Section "judge votes (<model>)".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from bench._results import write_section
from counselor_engine import soca
from counselor_engine.backends.base import GenerationParams, Prompt
from counselor_engine.backends.transformers_backend import TransformersBackend
from counselor_engine.judge import Judge, JudgeContext, pair_support

N = 5
HISTORY = (
    ("client", "I have been feeling anxious about work for weeks."),
    (
        "counselor",
        "That sounds exhausting. What does the anxiety feel like when it shows up at work?",
    ),
    ("client", "My chest gets tight and I keep rereading my emails before I send them."),
    (
        "counselor",
        "It sounds like part of you is trying hard to avoid mistakes. When did you notice "
        "that starting?",
    ),
)
CONTEXT = JudgeContext(
    HISTORY,
    "My manager criticises everything I do, and now I lie awake at night going over it.",
    "Reflection of feelings",
    "Name the feeling you hear and check it with the client.",
)
# About 64 SmolLM2 tokens each, like replies generated with max_new_tokens=64.
CANDIDATES = (
    "It sounds like the criticism at work has been following you home and into the night, "
    "and that you feel worn down and on edge because of it. I wonder whether it feels as if "
    "nothing you do is ever good enough for your manager. Is that close to what it is like "
    "for you right now?",
    "Lying awake replaying every comment must be exhausting. You seem hurt and anxious, and "
    "maybe a little angry too that your effort is not being seen. Which of those feelings is "
    "the strongest when you are lying awake at night going over it all again?",
    "You feel criticised constantly and it is costing you sleep. That is a lot to carry. "
    "Perhaps we could look together at what goes through your mind at night, and at one "
    "small thing that might help you rest a bit more this week. Would that be useful?",
    "I hear a lot of worry in what you are saying: worry about your work, about your "
    "manager, and about not sleeping. It makes sense that you feel anxious when every task "
    "seems to end in criticism. What would it mean to you if the criticism were unfair?",
    "That sounds really hard. Being judged all day and then losing your nights to it can "
    "leave anyone feeling hopeless and tired. Can you tell me about a moment this week when "
    "the criticism stung the most, and what you said to yourself right after it happened?",
)
MESSAGES = ("My manager criticises everything I do and I lie awake going over it.",)
VOTE_MESSAGES = (
    "My manager criticises everything I do, and now I lie awake at night going over it.",
    "I snapped at my partner again last night and I hate how I get when I am this tired.",
    "Everyone tells me to just relax, but the worry starts the moment I wake up.",
    "I keep thinking I will be fired, even though nobody has said anything like that.",
)
PER_BLOCK = 12  # prompts per (pair, order): one per criterion


def _model_path(choice: str, workdir: Path) -> tuple[str, Path]:
    from counselor_engine.models import default_model_dir, is_model_dir

    if choice in ("auto", "smollm2") and is_model_dir(default_model_dir()):
        return "smollm2", default_model_dir()
    if choice == "smollm2":
        sys.exit("SmolLM2 is not prepared: run `python -m counselor_engine prepare-model`")
    if choice in ("auto", "tiny"):
        from counselor_engine.backends.tiny import build_tiny_model

        return "tiny", build_tiny_model(workdir / "tiny", seed=0)
    return Path(choice).name, Path(choice)


class Recorder:
    """Forwards ``choice_probabilities`` to the real backend and keeps each call's
    arguments; an optional clock adds up the time spent in those calls."""

    def __init__(self, inner: TransformersBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls: list[tuple[list[Prompt], tuple[str, ...]]] = []
        self.seconds = 0.0

    async def choice_probabilities(
        self, prompts: Sequence[Prompt], choices: Sequence[str], **kw: Any
    ) -> list[list[float]]:
        self.calls.append((list(prompts), tuple(choices)))
        start = time.perf_counter()
        try:
            return await self.inner.choice_probabilities(prompts, choices, **kw)
        finally:
            self.seconds += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:  # everything else: the real backend
        return getattr(self.inner, name)


@contextlib.contextmanager
def plain_path(backend: TransformersBackend) -> Iterator[None]:
    """Within: ``choice_probabilities`` runs every prompt in full (the old path)."""
    backend._choice_blocking = functools.partial(  # type: ignore[method-assign]
        TransformersBackend._choice_blocking, backend, share_prefixes=False
    )
    try:
        yield
    finally:
        del backend._choice_blocking


async def _timed_calls(
    backend: TransformersBackend, calls: Sequence[tuple[list[Prompt], tuple[str, ...]]]
) -> tuple[list[float], list[list[float]]]:
    """Seconds per call, and every call's probability rows concatenated."""
    seconds, rows = [], []
    for prompts, choices in calls:
        start = time.perf_counter()
        rows += await backend.choice_probabilities(prompts, choices)
        seconds.append(time.perf_counter() - start)
    return seconds, rows


def _max_diff(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


async def judge_pass(backend: TransformersBackend, reps: int, blocks: int) -> dict[str, Any]:
    recorder = Recorder(backend)
    await Judge(recorder).judge_group(CONTEXT, CANDIDATES)  # type: ignore[arg-type]
    (point, point_choices), (pairs, pair_choices) = recorder.calls
    assert len(point) == N and len(pairs) == N * (N - 1) * PER_BLOCK, "unexpected judge batch"
    full = [(point, point_choices), (pairs, pair_choices)]
    sliced = full if blocks == 0 else [full[0], (pairs[: blocks * PER_BLOCK], pair_choices)]
    slice_pairs = len(sliced[1][0])

    shared_s: list[list[float]] = []
    plain_s: list[list[float]] = []
    diff = 0.0
    for rep in range(reps):
        for arm in ("shared", "plain") if rep % 2 == 0 else ("plain", "shared"):
            if arm == "plain":
                with plain_path(backend):
                    seconds, plain_rows = await _timed_calls(backend, sliced)
                plain_s.append(seconds)
            else:
                seconds, shared_rows = await _timed_calls(backend, sliced)
                shared_s.append(seconds)
        diff = max(diff, _max_diff(plain_rows, shared_rows))
    full_shared = [sum((await _timed_calls(backend, full))[0]) for _ in range(max(1, reps // 2))]

    def med(samples: list[list[float]], call: int) -> float:
        return statistics.median(s[call] for s in samples)

    scale = len(pairs) / slice_pairs
    plain_full = med(plain_s, 0) + med(plain_s, 1) * scale
    return {
        "prompts": (len(point), len(pairs)),
        "slice_pairs": slice_pairs,
        "shared_point": med(shared_s, 0),
        "plain_point": med(plain_s, 0),
        "shared_pairs": med(shared_s, 1),
        "plain_pairs": med(plain_s, 1),
        "ratio": statistics.median(sum(s) for s in shared_s)
        / statistics.median(sum(s) for s in plain_s),
        "diff": diff,
        "full_shared": statistics.median(full_shared),
        "plain_full": plain_full,
        "plain_full_estimated": slice_pairs < len(pairs),
    }


async def one_turn(backend: TransformersBackend, tokens: int, turns: int) -> dict[str, float]:
    from counselor_engine.counselor import ClientState, Counselor, CounselorConfig
    from counselor_engine.memory import MemoryStore

    warm = MemoryStore()  # the embedder's one-off load is not billed to a turn
    warm.add("fact", "warm up")
    warm.retrieve("warm up the embedder", k=1)
    recorder = Recorder(backend)
    params = GenerationParams(max_new_tokens=tokens, temperature=0.9, top_p=0.95)
    config = CounselorConfig(n_candidates=N, generation=params, mode="graph", seed=1)
    walls, judge = [], []
    for t in range(turns):
        client = ClientState(f"bench-judge-{t}", "cbt", 0, 4, memory=MemoryStore())
        counselor = Counselor(recorder, config=config)  # type: ignore[arg-type]
        counselor.start_session(client, None)
        recorder.seconds = 0.0
        start = time.perf_counter()
        async for _ in counselor.respond(MESSAGES[t % len(MESSAGES)]):
            pass
        walls.append(time.perf_counter() - start)
        judge.append(recorder.seconds)
    return {"wall": statistics.median(walls), "judge": statistics.median(judge)}


async def vote_rules(backend: TransformersBackend, groups: int) -> dict[str, Any]:
    """Judge ``groups`` groups once; count edges over the floor under both Eq. 12 rules."""
    judge = Judge(backend)  # type: ignore[arg-type]
    weights = [c.weight for c in judge.criteria]
    counts: dict[str, dict[str, float]] = {
        rule: {"pairs": 0, "clear": 0, "admitted": 0, "weight": 0.0, "agree": 0, "lean": 0.0}
        for rule in soca.VOTES
    }
    ties = readings = 0
    for g in range(groups):
        context = JudgeContext(HISTORY, VOTE_MESSAGES[g % len(VOTE_MESSAGES)], CONTEXT.skill_name,
                               CONTEXT.skill_instruction)  # fmt: skip
        shift = g % N
        candidates = CANDIDATES[shift:] + CANDIDATES[:shift]
        judged = await judge.judge_group(context, candidates)
        ties += sum(jd.vote is None for jd in judged.judgments)
        readings += len(judged.judgments)
        for rule in soca.VOTES:
            support = pair_support(judged.judgments, weights, votes=rule)
            tally = counts[rule]
            for p_f, p_b in support.values():
                tally["pairs"] += 1
                tally["lean"] += abs(2 * p_f - 1) + abs(2 * p_b - 1)
                verdict = soca.edge_strength(p_f, p_b)
                tally["agree"] += verdict is not None
                tally["clear"] += verdict is not None and verdict[1] >= soca.FLOOR
            edges = soca.build_preference_graph(N, support, group_id=f"bench-{g}")
            tally["admitted"] += len(edges)
            tally["weight"] += sum(e.weight for e in edges)
    return {"groups": groups, "counts": counts, "ties": ties, "readings": readings}


def votes_body(name: str, result: dict[str, Any]) -> str:
    rows = []
    for rule in soca.VOTES:
        t = result["counts"][rule]
        mean = t["weight"] / t["admitted"] if t["admitted"] else 0.0
        lean = t["lean"] / (2 * t["pairs"]) if t["pairs"] else 0.0
        label = "binary votes (default)" if rule == "binary" else "soft probabilities"
        rows.append(_row(label, f"{t['pairs']:.0f}", f"{lean:.3f}", f"{t['agree']:.0f}",
                         f"**{t['clear']:.0f}**", f"{t['admitted']:.0f}", f"{mean:.3f}"))  # fmt: skip
    table = "\n".join(rows)
    return f"""Model `{name}`: {result["groups"]} judged groups of N = {N} candidates (the same
readings under both rules; {result["ties"]} of {result["readings"]} criterion readings were
exact ties, i.e. no vote). Floor {soca.FLOOR}. "Lean": the mean single-order margin
|2 p - 1| of a support share; "orders agree": both orders strictly on the same side of 0.5,
which Eq. 7 needs before any strength (a judge that always prefers the reply shown first,
or second, agrees on no pair under either rule).

| Eq. 12 rule | pairs | lean | orders agree | c_ij >= floor | admitted edges | mean weight |
| --- | --- | --- | --- | --- | --- | --- |
{table}
"""


async def main_async(args: argparse.Namespace) -> None:
    load_start = _load()
    if args.votes_only:
        with tempfile.TemporaryDirectory() as tmp:
            name, path = _model_path(args.model, Path(tmp))
            backend = TransformersBackend(path, num_threads=args.threads)
            result = await vote_rules(backend, args.vote_groups)
        body = votes_body(name, result)
        print(body)
        write_section(f"judge votes ({name})", body)
        return
    with tempfile.TemporaryDirectory() as tmp:
        name, path = _model_path(args.model, Path(tmp))
        backend = TransformersBackend(path, num_threads=args.threads)
        blocks = (
            args.plain_blocks if args.plain_blocks is not None else (0 if name == "tiny" else 1)
        )
        threads = torch.get_num_threads()
        started = time.perf_counter()
        judged = await judge_pass(backend, args.reps, blocks)
        turn = await one_turn(backend, args.tokens, args.turns) if args.turns else None
        total = time.perf_counter() - started
        votes = await vote_rules(backend, args.vote_groups) if args.vote_groups else None
    j = judged
    est = " (est.)" if j["plain_full_estimated"] else ""
    what = (
        "the whole pass"
        if not j["plain_full_estimated"]
        else f"the pointwise call + the first {j['slice_pairs']} pairwise prompts "
        f"({j['slice_pairs'] // PER_BLOCK} (pair, order) blocks)"
    )
    n_point, n_pairs = j["prompts"]
    rows = [
        _row(
            f"pointwise call ({n_point} prompts)",
            f"{j['plain_point']:.2f} s",
            f"{j['shared_point']:.2f} s",
            f"{j['shared_point'] / j['plain_point']:.2f}x",
        ),
        _row(
            f"pairwise, {j['slice_pairs']} prompts",
            f"{j['plain_pairs']:.2f} s",
            f"{j['shared_pairs']:.2f} s",
            f"{j['shared_pairs'] / j['plain_pairs']:.2f}x",
        ),
        _row("timed arms together", "", "", f"**{j['ratio']:.2f}x**"),
        _row(
            f"full judge pass ({n_point + n_pairs} prompts)",
            f"{j['plain_full']:.1f} s{est}",
            f"{j['full_shared']:.1f} s",
            f"**{j['full_shared'] / j['plain_full']:.2f}x**{est}",
        ),
    ]
    if turn is not None:
        before = turn["wall"] - turn["judge"] + j["plain_full"]
        rows.append(
            _row(
                f"`Counselor.respond` turn (graph, N={N}, {args.tokens} new tokens)",
                f"{before:.1f} s (est.: turn - its judge calls + plain pass)",
                f"{turn['wall']:.1f} s (judge calls {turn['judge']:.1f} s)",
                f"**{turn['wall'] / before:.2f}x** (est.)",
            )
        )
    table = "\n".join(rows)
    body = f"""Model `{name}`, one judge pass of N = {N} candidates: {n_point} pointwise +
{n_pairs} pairwise prompts (10 pairs x 2 orders x 12 criteria). Arms timed on {what},
{args.reps} interleaved repetitions, medians; torch threads = {threads}; load average
{load_start} at the start, {_load()} at the end (2 shared cores: absolute times move,
ratios less). Bench wall time {total:.0f} s.

| measure | plain path | shared prefixes | ratio |
| --- | --- | --- | --- |
{table}

Largest |plain - shared| over all probabilities: {j["diff"]:.1e}.
"""
    print(body)
    write_section(f"judge ({name})", body)
    if votes is not None:
        print(votes_body(name, votes))
        write_section(f"judge votes ({name})", votes_body(name, votes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="auto", help="auto, smollm2, tiny or a model folder")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--plain-blocks",
        type=int,
        default=None,
        help="(pair, order) blocks of 12 prompts timed in both arms; 0: the whole pass "
        "(default: 1 on a real model, 0 on tiny)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=1, help="Counselor turns to time (0: none)")
    parser.add_argument("--vote-groups", type=int, default=4,
                        help="groups judged for the Eq. 12 vote comparison (0: none)")  # fmt: skip
    parser.add_argument("--votes-only", action="store_true", help="only the vote comparison")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
