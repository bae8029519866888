"""Headless courses: a simulated client and the Counselor over several sessions, no database.

One course is one profile over ``sessions`` sessions with the same client state (posterior,
memory and session rewards carry over, as for a real client). Per session:

1. Pick the interaction state: from the curriculum (p_t(z | intent)) when one is given,
   else uniformly from the 24 states.
2. The simulated client opens; client and counselor alternate for at most ``max_turns``
   counselor replies, or until the client's closing line has been answered.
3. The client rates the session (SRS-style) and the session ends through
   :meth:`Counselor.end_session`: turn outcomes, credit, posterior updates, memory recap.
4. The curriculum is updated with the session's *internal* reward (a group of one
   rollout, K = 1). The external judge then scores the frozen transcript for the report.

Reward separation (PsyEvo App. G): the external report is computed after everything the
learning path consumes and is read by nothing in it; its judge draws nothing from the
course's rng. ``test_simulation_separation`` runs the same seeded course under two
different external judges and finds identical posteriors, groups and curriculum counts.

Concurrency: courses are coroutines; run several with :func:`run_courses` (asyncio.gather)
and they interleave on the backends' calls. Each course gets its own child rng, so a
course is reproducible when run alone; with a shared curriculum, concurrent courses see
each other's updates in completion order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from counselor_engine.backends.base import Backend
from counselor_engine.counselor import (
    CandidateGroupRecord,
    ClientState,
    Counselor,
    CounselorConfig,
    DoneEvent,
    ErrorEvent,
    SessionOutcome,
    SessionRating,
)
from counselor_engine.embeddings import Embedder
from counselor_engine.memory import MemoryStore
from counselor_engine.seeds import stable_seed
from counselor_engine.simulation.ablation import Ablation
from counselor_engine.simulation.curriculum import CurriculumController
from counselor_engine.simulation.external_judge import ExternalJudge, ExternalReport
from counselor_engine.simulation.interaction import ALL_STATES, InteractionState
from counselor_engine.simulation.profiles import SimProfile
from counselor_engine.simulation.simulator import SimulatedClient


@dataclass
class SimSession:
    index: int
    state: InteractionState
    transcript: list[tuple[str, str]]
    rating: SessionRating | None
    outcome: SessionOutcome | None
    report: ExternalReport | None
    groups: list[CandidateGroupRecord] = field(default_factory=list)
    closed_by_client: bool = False
    error: str = ""  # a backend error that cut the session short ("" when none)

    def to_dict(self) -> dict[str, Any]:
        outcome = self.outcome
        return {
            "index": self.index,
            "state": self.state.key,
            "transcript": [list(t) for t in self.transcript],
            "rating": None if self.rating is None else vars(self.rating).copy(),
            "session_reward": None if outcome is None else outcome.session_reward,
            "internal_reward": None if outcome is None else outcome.internal_reward,
            "report": None if self.report is None else self.report.to_dict(),
            "closed_by_client": self.closed_by_client,
            "error": self.error,
        }


@dataclass
class CourseResult:
    profile: SimProfile
    sessions: list[SimSession]
    client: ClientState | None = None  # the final client state (posterior, memory)


ProgressFn = Callable[[SimProfile, SimSession], None]


async def run_course(
    counselor_backend: Backend,
    client_backend: Backend,
    profile: SimProfile,
    *,
    sessions: int,
    max_turns: int,
    curriculum: CurriculumController | None,
    rng: np.random.Generator,
    judge_backend: Backend | None = None,
    counselor_config: CounselorConfig | None = None,
    adapter: str | None = None,
    ablation: Ablation | None = None,
    memory_embedder: Embedder | None = None,
    client_kwargs: dict[str, Any] | None = None,
    on_session: ProgressFn | None = None,
) -> CourseResult:
    """Run one simulated client's course; see the module docstring."""
    if not isinstance(profile, SimProfile):
        raise ValueError("profile: expected a SimProfile")
    if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
        raise ValueError("sessions: expected an integer >= 1")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError("max_turns: expected an integer >= 1")
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng: expected a numpy.random.Generator")
    if curriculum is not None and profile.intent not in curriculum.intents:
        raise ValueError(f"curriculum: has no intent {profile.intent!r} (profile {profile.id})")
    config = counselor_config or CounselorConfig()
    if ablation is not None:
        config = ablation.apply(config)
    course_seed = int(rng.integers(2**62))
    if config.seed is None:
        config = replace(config, seed=stable_seed(course_seed, "counselor"))
    judge = ExternalJudge(judge_backend or counselor_backend)
    client = ClientState(
        f"sim-{profile.id}", profile.modality, 0, sessions,
        memory=MemoryStore(embedder=memory_embedder),
    )  # fmt: skip
    result = CourseResult(profile, [], client)
    for index in range(sessions):
        client.session_index = index
        if curriculum is not None:
            state = curriculum.select(profile.intent, rng)
        else:
            state = ALL_STATES[int(rng.integers(len(ALL_STATES)))]
        simulated = SimulatedClient(
            client_backend, profile, state, seed=stable_seed(course_seed, "client", index),
            **(client_kwargs or {}),
        )  # fmt: skip
        counselor = Counselor(
            counselor_backend, config=replace(config, seed=stable_seed(config.seed, index))
        )
        session = await _run_session(counselor, simulated, client, adapter, index, max_turns)
        if session.outcome is not None and curriculum is not None:
            curriculum.update(profile.intent, state, [session.outcome.session_reward])
        # Reporting only: computed after every learning write of this session.
        if any(role == "counselor" for role, _ in session.transcript):
            session.report = await judge.evaluate(profile, session.transcript)
        result.sessions.append(session)
        if on_session is not None:
            on_session(profile, session)
    return result


async def _run_session(
    counselor: Counselor,
    simulated: SimulatedClient,
    client: ClientState,
    adapter: str | None,
    index: int,
    max_turns: int,
) -> SimSession:
    counselor.start_session(client, adapter)
    session = SimSession(index, simulated.state, [], None, None, None)
    message = await simulated.opening()
    closing = False
    for turn in range(max_turns):
        reply, group, error = await _counselor_turn(counselor, message)
        if error:
            session.error = error
            break
        session.transcript += [("client", message), ("counselor", reply)]
        if group is not None:
            session.groups.append(group)
        if closing or turn == max_turns - 1:
            break
        nxt = await simulated.reply(session.transcript)
        message, closing = nxt.text, nxt.closing
        session.closed_by_client = closing
    if not session.transcript:
        # Nothing was said: end the session without a rating (no learning happens).
        session.outcome = await counselor.end_session(None)
        return session
    session.rating = await simulated.rate(session.transcript)
    session.outcome = await counselor.end_session(session.rating)
    return session


async def _counselor_turn(
    counselor: Counselor, message: str
) -> tuple[str, CandidateGroupRecord | None, str]:
    """One counselor reply; a retryable backend error is retried once."""
    for _attempt in range(2):
        error = ""
        async for event in counselor.respond(message):
            if isinstance(event, DoneEvent):
                return event.reply, event.group, ""
            if isinstance(event, ErrorEvent):
                error = f"{event.code}: {event.message}"
                if not event.retryable:
                    return "", None, error
        if not error:
            return "", None, "no reply"
    return "", None, error


async def run_courses(
    counselor_backend: Backend,
    client_backend: Backend,
    profiles: Sequence[SimProfile],
    *,
    sessions: int,
    max_turns: int,
    curriculum: CurriculumController | None,
    seed: int,
    **kwargs: Any,
) -> list[CourseResult]:
    """Several courses concurrently (one coroutine per profile), each with its own rng."""
    if not profiles:
        raise ValueError("profiles: at least one profile is needed")
    children = np.random.SeedSequence(seed).spawn(len(profiles))
    return list(
        await asyncio.gather(
            *(
                run_course(
                    counselor_backend,
                    client_backend,
                    profile,
                    sessions=sessions,
                    max_turns=max_turns,
                    curriculum=curriculum,
                    rng=np.random.default_rng(child),
                    **kwargs,
                )
                for profile, child in zip(profiles, children, strict=True)
            )
        )
    )


def summarize(results: Sequence[CourseResult]) -> dict[str, Any]:
    """Per-session metric families and pass rates over all courses (for reports and CLI)."""
    rows = []
    for course in results:
        for s in course.sessions:
            metrics = s.report.metrics if s.report is not None else {}
            rows.append({"profile": course.profile.id, "modality": course.profile.modality,
                         "session": s.index, "state": s.state.key, **metrics})  # fmt: skip
    passes = {
        key: float(np.mean([r[key] for r in rows if key in r]))
        for key in ("pass_client", "pass_supervisor", "pass_counselor", "pass_all")
        if any(key in r for r in rows)
    }
    return {"sessions": rows, "pass_rates": passes}
