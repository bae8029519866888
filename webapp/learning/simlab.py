"""The simulation lab on the product's own session path (issue 8, ``manage.py simulate``).

Simulated clients talk to the counselor through the SAME turn API a real client's
messages go through (``counseling.turns.client_message``: stored, assessed, answered and
committed there), with the counselor rebuilt from PostgreSQL for every turn, and the
run's adapter verified and loaded there too (``turns.load_pinned_adapter``, the session's
pinned version). What differs from a real client:

- The clients are synthetic accounts (``ClientProfile.simulated``): inactive, without a
  password or a clinician, left out of every console list, and their evidence stays out
  of training rounds unless the run says ``allow_training``
  (``schedule.trainable_clients``; without it they also lack the training consent, so
  their groups are stored ``excluded``).
- A crisis in a simulated session is recorded in the lab report, never raised as an
  alert: no clinician is paged for a synthetic client.
- Each turn's engine seed comes from the run seed, the client's place in the run and the
  turn, not from database ids, so a run is reproducible from its parameters.
- After the session the external judge scores the transcript. Its report is written to
  ``SimulationReport`` only (paper App. G: reporting, never posteriors, evidence or
  losses). The curriculum (``--curriculum``) is driven by the session's INTERNAL reward,
  the same outcome the counselor learns from (dual-loop paper Sec. 3.4: both loops use
  the policy's reward), so the external judge cannot steer anything either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.db import connections, transaction
from django.utils import timezone

from counselor_engine.counselor import CounselorConfig
from counselor_engine.seeds import stable_seed
from counselor_engine.simulation import (
    ALL_STATES,
    Ablation,
    CurriculumController,
    ExternalJudge,
    ExternalReport,
    InteractionState,
    SimProfile,
    SimulatedClient,
    builtin_profiles,
)
from webapp.accounts.models import ClientProfile, ConsentPurpose, ConsentRecord, Role, User
from webapp.counseling import runtime, services
from webapp.counseling import turns as counseling_turns
from webapp.counseling.models import Session
from webapp.learning.models import (
    AdapterVersion,
    SimulationClient,
    SimulationReport,
    SimulationRun,
)
from webapp.learning.services import NotServable, active_version, servable_path

log = logging.getLogger(__name__)
SIM_CLIENT_CANDIDATES = 3

STRATEGIES = ("sample", "mctsr")
MAX_CLIENTS = 500
MAX_SESSIONS = 50
MAX_TURNS = 50
Progress = Callable[[int], None]
# CounselorConfig's values when a switch is off (what an engine without it does anyway).
NEUTRAL: dict[str, Any] = {"candidate_strategy": "sample", "use_hbsp": True, "use_soca": True}


class LabError(ValueError):
    """A lab request that cannot run; the message says why (the command shows it)."""


class SimulationFailed(RuntimeError):
    """The run started and then failed; it is recorded as failed with this reason."""


@dataclass(frozen=True)
class LabPlan:
    """A checked ``simulate`` request: everything needed, nothing written yet."""

    clients: int
    sessions: int
    strategy: str
    adapter: AdapterVersion | None  # None: the base model
    curriculum: bool
    ablation: Ablation
    max_turns: int
    seed: int
    allow_training: bool
    profiles: tuple[SimProfile, ...] = field(default_factory=tuple)

    def parameters(self) -> dict[str, Any]:
        return {
            "clients": self.clients,
            "sessions": self.sessions,
            "strategy": self.strategy,
            "adapter": self.adapter.name if self.adapter else None,
            "curriculum": self.curriculum,
            "ablation": ablation_names(self.ablation),
            "max_turns": self.max_turns,
            "seed": self.seed,
            "allow_training": self.allow_training,
        }


def ablation_names(ablation: Ablation) -> list[str]:
    return [f.name for f in fields(ablation) if getattr(ablation, f.name)]


def _bounded(name: str, value: int, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise LabError(f"--{name} must be a whole number from {low} to {high}, got {value!r}")
    return value


def resolve_adapter(name: str | None) -> AdapterVersion | None:
    """``None``: the active version (what a real session would pin); ``base``: no
    adapter; else a version a clinician approved, whose files still match."""
    if name is None:
        return active_version()
    if name.strip().lower() in ("base", "none"):
        return None
    version = AdapterVersion.objects.filter(name=name).first()
    if version is None:
        raise LabError(f"no adapter version named {name!r}")
    try:
        servable_path(version)
    except NotServable as exc:
        raise LabError(f"adapter {name!r} cannot serve: {exc}") from None
    return version


def plan(
    *,
    clients: int,
    sessions: int,
    strategy: str,
    adapter: str | None,
    curriculum: bool = False,
    ablation: str = "none",
    max_turns: int = 6,
    seed: int = 0,
    allow_training: bool = False,
    profiles: Sequence[SimProfile] | None = None,
) -> LabPlan:
    """Check every argument before anything is written (bad input: :class:`LabError`)."""
    _bounded("clients", clients, 1, MAX_CLIENTS)
    _bounded("sessions", sessions, 1, MAX_SESSIONS)
    _bounded("max-turns", max_turns, 1, MAX_TURNS)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise LabError(f"--seed must be a non-negative whole number, got {seed!r}")
    if strategy not in STRATEGIES:
        raise LabError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    try:
        switches = Ablation.parse(ablation)
    except ValueError as exc:
        raise LabError(f"--ablation: {exc}") from None
    if switches.no_lipo and allow_training:
        raise LabError("--ablation no_lipo keeps the adapter fixed: drop --allow-training")
    if switches.pairwise_dpo and not allow_training:
        raise LabError(
            "--ablation pairwise_dpo changes the training loss: it needs --allow-training"
        )
    if switches.no_lipo and switches.pairwise_dpo:
        raise LabError("--ablation no_lipo and pairwise_dpo exclude each other")
    _engine_overrides(strategy, switches)  # the engine must support what was asked
    chosen = tuple(profiles) if profiles is not None else tuple(builtin_profiles())
    if not chosen:
        raise LabError("no simulated client profiles to draw from")
    return LabPlan(
        clients=clients,
        sessions=sessions,
        strategy=strategy,
        adapter=resolve_adapter(adapter),
        curriculum=curriculum,
        ablation=switches,
        max_turns=max_turns,
        seed=seed,
        allow_training=allow_training,
        profiles=chosen,
    )


def _engine_overrides(strategy: str, ablation: Ablation) -> dict[str, Any]:
    """CounselorConfig fields the run changes: the candidate strategy (MCTSr-Zero) and
    the engine ablations (``no_hbsp`` -> shared table only, ``no_soca`` -> raw scores)."""
    wanted: dict[str, Any] = {
        "candidate_strategy": strategy,
        "use_hbsp": not ablation.no_hbsp,
        "use_soca": not ablation.no_soca,
        "report_progress": False,  # headless: the judge keeps its one batched call
    }
    known = {f.name for f in fields(CounselorConfig)}
    overrides: dict[str, Any] = {}
    for name, value in wanted.items():
        if name in known:
            overrides[name] = value
        elif value != NEUTRAL[name]:  # an engine without the switch can only run it off
            raise LabError(f"this engine has no {name!r} setting: cannot run {name}={value!r}")
    return overrides


# -- the run ----------------------------------------------------------------------------


def make_judge(backend: Any) -> ExternalJudge:
    """The external judge (tests replace this to prove its scores change nothing)."""
    return ExternalJudge(backend)


def client_backend() -> Any:
    """The simulated clients' model: the product's backend, without any adapter."""
    return runtime.get_backend()


def run_lab(lab: LabPlan, *, progress: Progress | None = None) -> SimulationRun:
    """Create the run and its clients, play every course, store reports, summarise.

    A failure after the run row exists marks it ``failed`` with the reason, abandons the
    sessions left open, and raises :class:`SimulationFailed`.
    """
    from webapp.learning import simreport  # matplotlib loads when a run is reported

    run = SimulationRun.objects.create(
        strategy=lab.strategy,
        adapter=lab.adapter,
        curriculum=lab.curriculum,
        ablation=ablation_names(lab.ablation),
        allow_training=lab.allow_training,
        seed=lab.seed,
        parameters=lab.parameters(),
    )
    try:
        members = create_clients(run, lab)
        controller = asyncio.run(_play(run, lab, members, progress or (lambda _n: None)))
        simreport.finish(run, controller)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        log.exception("simulation run %s failed", run.pk)
        fail_run(run, reason)
        raise SimulationFailed(reason) from exc
    run.refresh_from_db()
    return run


def fail_run(run: SimulationRun, reason: str) -> None:
    now = timezone.now()
    with transaction.atomic():
        Session.objects.filter(client__simulation__run=run, status=Session.Status.OPEN).update(
            status=Session.Status.ABANDONED, ended_at=now
        )
        SimulationRun.objects.filter(pk=run.pk).update(
            status=SimulationRun.Status.FAILED, error=reason[:4000], finished_at=now
        )


@dataclass
class Member:
    """One simulated client of the run."""

    index: int
    user: User
    link: SimulationClient
    profile: SimProfile


def create_clients(run: SimulationRun, lab: LabPlan) -> list[Member]:
    """Synthetic accounts: no password, inactive (nobody logs in as them), no clinician,
    counseling and memory consent, training consent only with ``allow_training``.
    Profiles are drawn without replacement in a seed-shuffled order, cycling."""
    rng = np.random.default_rng([lab.seed, 1])
    order = rng.permutation(len(lab.profiles))
    members: list[Member] = []
    with transaction.atomic():
        for i in range(lab.clients):
            profile = lab.profiles[int(order[i % len(order)])]
            user = User.objects.create(
                username=f"sim-{run.pk}-{i:03d}",
                role=Role.CLIENT,
                is_active=False,
                password=make_password(None),  # unusable
                first_name=profile.name[:150],
            )
            client_profile = ClientProfile.objects.create(
                user=user,
                modality=profile.modality,
                simulated=True,
                simulated_training=lab.allow_training,
            )
            for purpose, granted in (
                (ConsentPurpose.COUNSELING, True),
                (ConsentPurpose.MEMORY, True),
                (ConsentPurpose.TRAINING, lab.allow_training),
            ):
                ConsentRecord.objects.create(
                    profile=client_profile, purpose=purpose, granted=granted
                )
            link = SimulationClient.objects.create(
                run=run,
                user=user,
                profile_id=profile.id,
                intent=profile.intent,
                modality=profile.modality,
            )
            members.append(Member(i, user, link, profile))
    return members


async def _play(
    run: SimulationRun, lab: LabPlan, members: list[Member], progress: Progress
) -> CurriculumController | None:
    """All courses at once (clients in parallel, each client's sessions in order)."""
    controller = (
        CurriculumController(sorted({m.profile.intent for m in members}))
        if lab.curriculum
        else None
    )
    # The run's adapter is pinned on each session (``Course._start``): the turn API
    # verifies and loads it before every reply, as for a real session. Nothing here loads
    # it: one way to serve a version, not two.
    backend = runtime.get_backend()
    course = Course(run, lab, controller, backend, progress)
    try:
        async with asyncio.TaskGroup() as group:  # one failure cancels the other courses
            for member in members:
                group.create_task(course.play(member))
    except BaseExceptionGroup as errors:
        raise errors.exceptions[0] from None
    finally:
        await sync_to_async(connections.close_all)()  # the ORM thread's connections
    return controller


@dataclass
class Played:
    transcript: list[tuple[str, str]]
    turns: int
    closed: bool
    crisis: bool


class Course:
    """Plays the courses of one run (shared: the curriculum, the backends, the judge)."""

    def __init__(
        self,
        run: SimulationRun,
        lab: LabPlan,
        controller: CurriculumController | None,
        backend: Any,
        progress: Progress,
    ) -> None:
        self.run, self.lab, self.controller, self.progress = run, lab, controller, progress
        self.overrides = _engine_overrides(lab.strategy, lab.ablation)
        self.simulator_backend = client_backend()
        self.judge = make_judge(backend)

    async def play(self, member: Member) -> None:
        rng = np.random.default_rng([self.lab.seed, 2, member.index])
        for index in range(self.lab.sessions):
            state = self._state(member, rng)
            session = await sync_to_async(self._start)(member)
            simulator = SimulatedClient(
                self.simulator_backend,
                member.profile,
                state,
                seed=self._seed(member, index, "client"),
                # Three samples to choose an in-character one from (simulator.py).
                candidates=SIM_CLIENT_CANDIDATES,
                remind=True,  # 30% of messages on profile against 8% without (RESULTS.md)
            )
            played = await self._converse(member, session, simulator, index)
            outcome = await self._end(member, session, simulator, played)
            report = await self.judge.evaluate(member.profile, played.transcript)
            await sync_to_async(store_report)(
                member.link, session, index, state, played, report, outcome.session_reward
            )
            if self.controller is not None:
                self.controller.update(member.profile.intent, state, [outcome.session_reward])
            self.progress(1)

    def _state(self, member: Member, rng: np.random.Generator) -> InteractionState:
        """The curriculum's draw, or uniform over the 24 states without ``--curriculum``."""
        if self.controller is not None:
            return self.controller.select(member.profile.intent, rng)
        return ALL_STATES[int(rng.integers(len(ALL_STATES)))]

    def _start(self, member: Member) -> Session:
        session = services.start_session(member.user)
        changes: dict[str, Any] = {}
        if session.adapter_version_id != (self.lab.adapter.pk if self.lab.adapter else None):
            # The run's version, not the active one: the lab evaluates a chosen version.
            changes["adapter_version"] = self.lab.adapter
        if self.lab.strategy == "mctsr" and session.mode != Session.Mode.GRAPH:
            changes["mode"] = Session.Mode.GRAPH  # MCTSr-Zero judges before it delivers
        if changes:
            Session.objects.filter(pk=session.pk).update(**changes)
            session.refresh_from_db()
        return session

    def _seed(self, member: Member, session_index: int, key: object) -> int:
        return stable_seed(self.lab.seed, member.index, session_index, key)

    async def _converse(
        self, member: Member, session: Session, simulator: SimulatedClient, index: int
    ) -> Played:
        transcript: list[tuple[str, str]] = []
        text = await simulator.opening()
        crisis = closed = False
        turns = 0
        while True:
            reply, flagged = await self._respond(member, session, index, text)
            transcript += [("client", text), ("counselor", reply)]
            crisis = crisis or flagged
            turns += 1
            # The client's closing line gets its answer, then the session ends (as the
            # headless runner does).
            if closed or turns >= self.lab.max_turns:
                break
            answer = await simulator.reply(transcript)
            text, closed = answer.text, answer.closing
        return Played(transcript, turns, closed, crisis)

    async def _respond(
        self, member: Member, session: Session, index: int, text: str
    ) -> tuple[str, bool]:
        """One exchange through the product's turn API (``counseling.turns``), as a real
        client's message goes: stored, assessed, answered, committed. A crisis gets the
        safe reply; the turn API raises no flag for a simulated client."""

        def overrides(seq: int) -> dict[str, Any]:
            return {**self.overrides, "seed": self._seed(member, index, seq)}

        message = counseling_turns.ClientMessage(session.pk, member.user, text)
        async for event in counseling_turns.client_message(message, overrides=overrides):
            if isinstance(event, counseling_turns.Rejected | counseling_turns.Failed):
                raise SimulationFailed(
                    f"client {member.index} session {index}: {event.code}: {event.message}"
                )
            if isinstance(event, counseling_turns.Paused):
                raise SimulationFailed(f"client {member.index} session {index}: AI paused")
            if isinstance(event, counseling_turns.Replied):
                return event.turn.text, event.turn.safety_level == "crisis"
        raise SimulationFailed(f"client {member.index} session {index}: the engine gave no reply")

    async def _end(
        self, member: Member, session: Session, simulator: SimulatedClient, played: Played
    ) -> Any:
        """The session end a real client triggers with the rating form: the simulated
        client rates the session (SRS items), then credit, posteriors and memory."""
        seed = self._seed(member, session.index, "end")
        rating = await simulator.rate(played.transcript)
        return await counseling_turns.end_session(
            session.pk, rating, overrides={**self.overrides, "seed": seed}
        )


def store_report(
    link: SimulationClient,
    session: Session,
    index: int,
    state: InteractionState,
    played: Played,
    report: ExternalReport,
    session_reward: float,
) -> SimulationReport:
    """The external judge's verdict goes here and nowhere else."""
    return SimulationReport.objects.create(
        run_id=link.run_id,
        client=link,
        session=session,
        session_index=index,
        state_key=state.key,
        turns=played.turns,
        closed_by_client=played.closed,
        crisis=played.crisis,
        metrics={k: _finite(v) for k, v in report.metrics.items()},
        passed={s.perspective: bool(s.passed) for s in report.scores},
        external=report.to_dict(),
        session_reward=_finite(session_reward),
    )


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


def default_max_turns() -> int:
    return int(settings.PSYEVO_TURN_BUDGET)
