"""One counseling session: state -> skill -> N candidates -> judge -> graph -> deliver.

This is Algorithm 1 of the PsyEvo paper for one client and one session, with no Django:
the caller (the web consumer, the CLI, the simulation lab) hands in a :class:`ClientState`
and gets plain dataclasses back. Parameters never change inside a session: the adapter
version is pinned by :meth:`Counselor.start_session`; posterior updates and the memory
recap happen in :meth:`Counselor.end_session`.

A turn (:meth:`Counselor.respond`):
1. Validate the message (empty, whitespace-only, oversized or non-text: an ``error``
   event, nothing recorded).
2. ``safety.assess`` runs before anything else. Crisis: the fixed safe response is
   streamed and no model is called. Concern: the model replies with safety guidance.
3. Encode the state (54 slots) and sample the skill from the client's posterior (Eq. 2-3),
   honouring clinician pins and exclusions.
4. Generate N candidates in ONE batched backend call under the pinned adapter; with
   ``candidate_strategy="mctsr"`` they are the N best nodes of an MCTSr-Zero search
   (mctsr.py), streamed in chunks after selection as in ``graph`` mode.
5. ``graph`` mode: judge (two-order pairwise, Eq. 12; pointwise), build the acyclic SOCA
   graph (Eq. 7), deliver the deepest candidate and stream it. ``stream_first`` mode:
   stream candidate 0 as it is written, judge all N afterwards and record that 0 was
   delivered.
6. The output guard (:mod:`counselor_engine.output_guard`) checks every candidate before
   it can be delivered or preferred: ``graph``/``mctsr`` select among the admitted ones
   only; ``stream_first`` streams candidate 0 through a sentence gate. With nothing
   admitted (or candidate 0 failing mid-stream) the reply is the guard's fallback, an
   apology that offers a retry; ``done.fallback`` says so and ``group.delivered`` is None.
   Choice: a fallback turn keeps its skill decision and is judged at session end like
   any other (the client's reaction to it is real, and the skill led to no admissible
   candidate); its group holds no edge won by a rejected candidate.
7. Yield ``done`` with the full :class:`CandidateGroupRecord` for the evidence buffer.

Backend failures and timeouts become an ``error`` event with ``retryable=True``; the turn
is then not recorded, so calling :meth:`respond` again with the same message is a clean
retry.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np

from counselor_engine import output_guard, safety, soca
from counselor_engine.backends.base import (
    Backend,
    BackendError,
    ChatMessage,
    GenerationParams,
    StreamDelta,
    StreamDone,
)
from counselor_engine.hbsp import Decision, PosteriorUpdate, SkillPosterior, shared_only_decision
from counselor_engine.judge import GroupJudgment, Judge, JudgeContext
from counselor_engine.mctsr import MctsrConfig, MctsrSearch, SearchResult
from counselor_engine.memory import MemoryItem, MemoryStore, generate_recap, render_for_prompt
from counselor_engine.seeds import stable_seed
from counselor_engine.skills import MODALITIES, PriorTable, get_skill, skills_for
from counselor_engine.states import encode_state
from counselor_engine.text import strip_control

Mode = Literal["graph", "stream_first"]
CandidateStrategy = Literal["sample", "mctsr"]
MODALITY_NAMES = {
    "cbt": "cognitive behavioural therapy",
    "bt": "behavioural therapy",
    "het": "humanistic-existential therapy",
    "pdt": "psychodynamic therapy",
    "pmt": "postmodern (solution-focused and narrative) therapy",
}
RATING_ITEMS = ("relationship", "goals_and_topics", "approach", "overall")


def default_generation() -> GenerationParams:
    """How a candidate is sampled unless the caller says otherwise; callers that set one
    knob (the web app's settings, the CLI) ``replace`` it on this."""
    return GenerationParams(max_new_tokens=160, temperature=0.9, top_p=0.95)


@dataclass(frozen=True)
class CounselorConfig:
    """Every knob of a session in one place (paper defaults where the paper gives one)."""

    n_candidates: int = 5
    mode: Mode = "graph"
    generation: GenerationParams = field(default_factory=lambda: default_generation())
    turn_budget: int = 12
    tau: float = 1.0
    epsilon: float = 0.05
    edge_floor: float = 0.1
    gamma: float = 0.9
    ordinal_scale: float = 0.5
    beta: float = 0.1  # LiPO's beta, recorded with each group for the trainer
    max_message_chars: int = 4000
    history_turns: int = 8
    memory_k: int = 5
    backend_timeout_s: float = 120.0
    rating_weight: float = 0.5
    safety_locale: str = "en-US"
    seed: int | None = None
    # "mctsr": the N candidates are the best nodes of an MCTSr-Zero search (mctsr.py).
    candidate_strategy: CandidateStrategy = "sample"
    mctsr: MctsrConfig = field(default_factory=MctsrConfig)
    # The paper's Table 3 ablations (simulation lab); True keeps the component.
    use_hbsp: bool = True  # False: skill from the shared table Q only, posteriors never updated
    use_soca: bool = True  # False: raw-score preferences and unprojected credit
    # Progress events while a judged reply is prepared (graph mode), for a person waiting
    # at a chat page: the judge then runs one backend call per candidate shown as A
    # instead of one for the group (judge.py); headless runs keep the one call.
    report_progress: bool = False
    # Eq. 12 from binary criterion votes (the paper) or soft probabilities (judge.py).
    judge_votes: str = "binary"

    def __post_init__(self) -> None:
        if self.n_candidates < 1:
            raise ValueError("n_candidates: must be at least 1")
        if self.mode not in ("graph", "stream_first"):
            raise ValueError(f"mode: expected 'graph' or 'stream_first', got {self.mode!r}")
        if self.turn_budget < 1:
            raise ValueError("turn_budget: must be at least 1")
        if not 0.0 <= self.rating_weight <= 1.0:
            raise ValueError("rating_weight: must lie in [0, 1]")
        if self.max_message_chars < 1 or self.backend_timeout_s <= 0:
            raise ValueError("max_message_chars and backend_timeout_s must be positive")
        if self.judge_votes not in soca.VOTES:
            raise ValueError(f"judge_votes: expected one of {soca.VOTES}, got {self.judge_votes!r}")
        if self.candidate_strategy not in ("sample", "mctsr"):
            raise ValueError(
                f"candidate_strategy: expected 'sample' or 'mctsr', got {self.candidate_strategy!r}"
            )
        if not isinstance(self.mctsr, MctsrConfig):
            raise ValueError(f"mctsr: expected an MctsrConfig, got {type(self.mctsr).__name__}")
        if self.candidate_strategy == "mctsr" and self.mode == "stream_first":
            # The search must finish before any candidate is known to be worth sending.
            raise ValueError("candidate_strategy 'mctsr' needs mode 'graph', not 'stream_first'")


@dataclass
class ClientState:
    """What the engine needs to know about a client when a session starts."""

    client_id: str
    modality: str
    session_index: int  # zero-based index of this session in the course
    planned_sessions: int
    posterior: SkillPosterior = field(default_factory=SkillPosterior)
    memory: MemoryStore = field(default_factory=MemoryStore)
    session_rewards: list[float] = field(default_factory=list)  # earlier raw session rewards
    pinned_skill: str | None = None
    excluded_skills: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.modality not in MODALITIES:
            raise ValueError(f"modality: unknown modality {self.modality!r}")
        if self.session_index < 0 or self.planned_sessions < 1:
            raise ValueError("session_index must be >= 0 and planned_sessions >= 1")
        valid = {s.id for s in skills_for(self.modality)}
        unknown = (set(self.excluded_skills) | {self.pinned_skill or next(iter(valid))}) - valid
        if unknown:
            raise ValueError(f"skills: not skills of {self.modality}: {sorted(unknown)}")
        if self.pinned_skill in self.excluded_skills:
            raise ValueError("pinned_skill: a skill cannot be pinned and excluded at once")
        if not valid - set(self.excluded_skills):
            raise ValueError("excluded_skills: every skill is excluded")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the CLI and the simulation lab store clients this way)."""
        return {
            "format": 1,
            "client_id": self.client_id,
            "modality": self.modality,
            "session_index": self.session_index,
            "planned_sessions": self.planned_sessions,
            "posterior": self.posterior.to_dict(),
            "memory": self.memory.to_dict(),
            "session_rewards": list(self.session_rewards),
            "pinned_skill": self.pinned_skill,
            "excluded_skills": sorted(self.excluded_skills),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClientState:
        if data.get("format") != 1:
            raise ValueError("data: unknown client state format")
        return cls(
            client_id=str(data["client_id"]),
            modality=str(data["modality"]),
            session_index=int(data["session_index"]),
            planned_sessions=int(data["planned_sessions"]),
            posterior=SkillPosterior.from_dict(data["posterior"]),
            memory=MemoryStore.from_dict(data["memory"]),
            session_rewards=[float(r) for r in data.get("session_rewards", [])],
            pinned_skill=data.get("pinned_skill"),
            excluded_skills=frozenset(data.get("excluded_skills", [])),
        )


# --- Events --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SkillEvent:
    decision: Decision
    state_slot: str
    safety_level: str
    type: str = "skill"


@dataclass(frozen=True)
class SafetyEvent:
    assessment: safety.SafetyAssessment
    type: str = "safety"


@dataclass(frozen=True)
class TokenEvent:
    text: str
    type: str = "token"


@dataclass(frozen=True)
class ProgressEvent:
    """How far a judged reply is, from the engine's own steps (graph mode, with
    ``CounselorConfig.report_progress``): ``drafting`` (0 of N before the one batched
    generation, N of N after it), then ``comparing`` (ordered comparisons of the N(N-1)
    done). Never sent in stream_first, whose reply streams at once."""

    stage: Literal["drafting", "comparing"]
    done: int
    total: int
    type: str = "progress"


@dataclass(frozen=True)
class ErrorEvent:
    code: str  # empty_message | too_long | not_text | backend_error | backend_timeout | no_session
    message: str
    retryable: bool = False
    type: str = "error"


@dataclass
class CandidateGroupRecord:
    """Everything the evidence buffer keeps for one turn (paper App. C)."""

    group_id: str
    client_id: str
    modality: str
    adapter_version: str | None
    session_index: int
    turn_index: int
    state_slot: str
    skill: str
    mode: Mode
    prompt: list[dict[str, str]]
    candidates: list[str]
    judgments: list[dict[str, Any]]
    support: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    pointwise: list[float]
    depths: list[int]
    delivered: int | None  # None: no candidate was delivered whole (the guard's fallback)
    admissible: bool
    problem: str = ""
    beta: float = 0.1
    search: dict[str, Any] | None = None  # MCTSr-Zero tree summary (strategy "mctsr" only)
    # One output-guard verdict per candidate (output_guard.GuardVerdict.to_dict: rule ids
    # and reasons, no text).
    guard: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rejected(self) -> int:
        """How many candidates the output guard rejected."""
        return sum(1 for v in self.guard if not v.get("admitted", True))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DoneEvent:
    reply: str
    turn_index: int
    group: CandidateGroupRecord | None  # None for a safety reply (no candidates)
    decision: Decision | None
    safety_level: str
    # True when the reply is (or ends with) output_guard.FALLBACK: no candidate passed,
    # or the streamed one failed mid-way. The reply itself offers the retry.
    fallback: bool = False
    type: str = "done"


Event = SkillEvent | SafetyEvent | ProgressEvent | TokenEvent | ErrorEvent | DoneEvent


@dataclass
class TurnRecord:
    """One exchange of the session as the engine keeps it."""

    index: int
    client_text: str
    reply: str
    state_slot: str | None
    skill: str | None
    shared_value: float | None
    safety_level: str
    group: CandidateGroupRecord | None


@dataclass
class SessionRating:
    """SRS-style rating: four items on 0-10 (relationship, goals and topics, approach,
    overall)."""

    relationship: float
    goals_and_topics: float
    approach: float
    overall: float

    def __post_init__(self) -> None:
        for name in RATING_ITEMS:
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0.0 <= float(value) <= 10.0:
                raise ValueError(f"{name}: rating items lie in [0, 10], got {value!r}")

    def normalised(self) -> float:
        return sum(float(getattr(self, n)) for n in RATING_ITEMS) / (10.0 * len(RATING_ITEMS))


@dataclass
class SessionOutcome:
    """A session's end. ``turn_outcomes`` and ``credit`` are aligned with the turns; None
    where a turn has no judged outcome (or, for credit, when the session was skipped).
    ``evidence`` records whether the outcomes were sound enough to reach Eq. 4
    (:func:`counselor_engine.soca.check_session_evidence`); ``reward_observed`` is False
    when the session reward is only the neutral 0.5 (no rating, nothing judged): it then
    joins no reward history."""

    turn_outcomes: list[float | None]
    internal_reward: float
    rating: SessionRating | None
    session_reward: float
    projected_session_reward: float
    credit: list[float | None]
    posterior_updates: list[PosteriorUpdate]
    recap: list[MemoryItem]
    evidence: soca.EvidenceCheck = field(default_factory=lambda: soca.EvidenceCheck(0, None))
    reward_observed: bool = True


@cache
def _system_template() -> str:
    return (Path(__file__).with_name("prompts") / "counselor_system.txt").read_text().strip()


def system_prompt(modality: str, skill_id: str) -> str:
    """The counselor's system message for one reply (no memory, no concern guidance)."""
    skill = get_skill(skill_id)
    return _system_template().format(
        modality_name=MODALITY_NAMES[modality],
        skill_name=skill.name,
        skill_instruction=skill.instruction,
    )


def _chunks(text: str) -> list[str]:
    """Split a finished reply into word-sized pieces for streaming."""
    pieces: list[str] = []
    word = ""
    for char in text:
        word += char
        if char.isspace():
            pieces.append(word)
            word = ""
    if word:
        pieces.append(word)
    return pieces


class Counselor:
    """Runs one session at a time for one client (create one per live session)."""

    def __init__(
        self,
        backend: Backend,
        *,
        prior: PriorTable | None = None,
        judge: Judge | None = None,
        config: CounselorConfig | None = None,
    ) -> None:
        self.backend = backend
        self.prior = prior or PriorTable.load_default()
        self.config = config or CounselorConfig()
        self.judge = judge or Judge(backend, votes=self.config.judge_votes)
        self.client: ClientState | None = None
        self.adapter_version: str | None = None
        self.turns: list[TurnRecord] = []
        self._rng = np.random.default_rng(self.config.seed)
        self._ended = False

    # -- lifecycle -------------------------------------------------------------------------
    def start_session(self, client: ClientState, adapter_version: str | None) -> None:
        """Pin the adapter version for the whole session (paper Alg. 1 line 4)."""
        if self.client is not None and not self._ended:
            raise RuntimeError("a session is already running on this counselor")
        self.client = client
        self.adapter_version = adapter_version
        self.turns = []
        self._ended = False

    def restore_turns(self, turns: Sequence[TurnRecord]) -> None:
        """Rebuild a live session from storage (a socket reconnecting to another server)."""
        self.turns = list(turns)

    # -- one turn --------------------------------------------------------------------------
    async def respond(
        self, message: object, *, assessment: safety.SafetyAssessment | None = None
    ) -> AsyncIterator[Event]:
        """One turn. ``assessment``: the caller already validated the message and ran
        ``safety.assess`` on it (the web app's turn API does, before anything else), so
        neither runs a second time here."""
        client = self.client
        if client is None or self._ended:
            yield ErrorEvent("no_session", "no session is running")
            return
        if assessment is None:
            problem = self._check_message(message)
            if problem is not None:
                yield problem
                return
        if not isinstance(message, str):
            yield ErrorEvent("not_text", "Messages must be text.")
            return
        text = strip_control(message).strip()
        turn_index = len(self.turns)
        if assessment is None:
            assessment = safety.assess(text)
        if assessment.level == "crisis":
            async for event in self._safety_turn(text, turn_index, assessment):
                yield event
            return
        if assessment.level == "concern":
            yield SafetyEvent(assessment)

        state = encode_state(
            client.session_index, client.planned_sessions, turn_index, self.config.turn_budget, text
        )
        slot = state.slot_id
        valid = [s.id for s in skills_for(client.modality) if s.id not in client.excluded_skills]
        shared = self.prior.for_state(client.modality, slot)
        decide = client.posterior.decide if self.config.use_hbsp else shared_only_decision
        decision = decide(
            slot, valid, {s: shared[s] for s in valid}, self._rng,
            pinned=client.pinned_skill, tau=self.config.tau, epsilon=self.config.epsilon,
        )  # fmt: skip
        yield SkillEvent(decision, slot, assessment.level)
        # Retrieval may load the embedding model on first use: keep it off the event loop.
        prompt = await asyncio.to_thread(
            self._prompt, text, decision.chosen, concern=assessment.level == "concern"
        )
        params = self._params(turn_index)
        n = self.config.n_candidates
        context = self._guard_context(
            prompt, decision.chosen, concern=assessment.level == "concern"
        )
        gate = output_guard.SentenceGate(context)
        streamed = False
        search: SearchResult | None = None
        candidates: list[str] = []
        verdicts: list[output_guard.GuardVerdict] = []
        judged: GroupJudgment | None = None
        try:
            if self.config.candidate_strategy == "mctsr":
                search = await self._search(prompt, text, decision.chosen, n, params)
                candidates = search.candidates
            elif self.config.mode == "stream_first":
                async for piece in self._stream_candidates(prompt, n, params):
                    if isinstance(piece, str):
                        async for event in self._gated(gate, strip_control(piece)):
                            streamed = True
                            yield event
                    else:
                        candidates = piece
                async for event in self._gated(gate, None):
                    streamed = True
                    yield event
            else:
                if self.config.report_progress:
                    yield ProgressEvent("drafting", 0, n)
                candidates = await self._timed(
                    self.backend.generate(prompt, n=n, params=params, adapter=self.adapter_version)
                )
                if self.config.report_progress:
                    yield ProgressEvent("drafting", len(candidates), n)
            candidates = [strip_control(c) for c in candidates]
            if self.config.mode != "stream_first":
                # Delivered whole: never a sentence the token limit cut off, and the judge
                # and training see the text the client would. (stream_first has shown
                # candidate 0 as it was written; its record keeps what was shown.)
                candidates = [output_guard.without_unfinished_tail(c) for c in candidates]
            if len(candidates) != n:
                raise BackendError(f"backend returned {len(candidates)} candidates, expected {n}")
            verdicts = output_guard.check_all(candidates, context)
            if self.config.mode == "stream_first":
                # Candidate 0 was checked sentence by sentence as it streamed: that
                # verdict is what the client's screen obeyed, so it is the one recorded.
                verdicts[0] = gate.failed or output_guard.ADMITTED
            if any(v.admitted for v in verdicts):
                report = self.config.report_progress and self.config.mode != "stream_first"
                async for step in self._judge(text, decision.chosen, candidates, report=report):
                    if isinstance(step, ProgressEvent):
                        yield step
                    else:
                        judged = step
            else:  # nothing may be delivered or preferred: no judge, the fallback at once
                judged = GroupJudgment({}, [math.nan] * n, admissible=False,
                                       problem="output guard rejected every candidate")  # fmt: skip
            assert judged is not None
        except (BackendError, TimeoutError) as exc:
            timeout = isinstance(exc, TimeoutError)
            yield ErrorEvent(
                "backend_timeout" if timeout else "backend_error",
                "The counselor is not responding right now. Your message is kept; try again."
                if not streamed
                else "The reply was interrupted. Try again.",
                retryable=True,
            )
            return
        group = self._group_record(turn_index, slot, decision, prompt, candidates, judged, verdicts)
        if search is not None:
            group.search = search.to_dict()
        fallback = group.delivered is None
        if self.config.mode == "stream_first":
            reply = gate.passed + (_fallback_after(gate.passed) if fallback else "")
        else:
            reply = output_guard.FALLBACK if fallback else candidates[group.delivered]
            for piece in _chunks(reply):
                yield TokenEvent(piece)
        self.turns.append(
            TurnRecord(turn_index, text, reply, slot, decision.chosen, shared[decision.chosen],
                       assessment.level, group)
        )  # fmt: skip
        yield DoneEvent(reply, turn_index, group, decision, assessment.level, fallback=fallback)

    def _guard_context(
        self, prompt: Sequence[ChatMessage], skill_id: str, *, concern: bool
    ) -> output_guard.GuardContext:
        """The prompt is the client's own (their messages, their memory): anything the
        guard finds there is theirs. Instructions exclude the memory block, which holds
        the client's own words and may be echoed."""
        assert self.client is not None
        instructions = [system_prompt(self.client.modality, skill_id)]
        if concern:
            instructions.append(safety.concern_guidance(self.config.safety_locale))
        return output_guard.GuardContext(
            own_text="\n".join(m.content for m in prompt), instructions=tuple(instructions)
        )

    async def _gated(
        self, gate: output_guard.SentenceGate, piece: str | None
    ) -> AsyncIterator[TokenEvent]:
        """stream_first: candidate 0's text reaches the caller only as whole sentences the
        guard passed (``piece`` None: the stream ended, check the unfinished tail). The
        first failing sentence ends the stream with the fallback, sent at once; the
        backend's other candidates are still awaited (and judged) for the record."""
        if gate.failed is not None:
            return
        passed = gate.feed(piece) if piece is not None else gate.finish()
        if passed:
            yield TokenEvent(passed)
        if gate.failed is not None:
            yield TokenEvent(_fallback_after(gate.passed))

    def _check_message(self, message: object) -> ErrorEvent | None:
        if not isinstance(message, str):
            return ErrorEvent("not_text", "Messages must be text.")
        if not strip_control(message).strip():
            return ErrorEvent("empty_message", "Write something before sending.")
        if len(message) > self.config.max_message_chars:
            return ErrorEvent(
                "too_long", f"Messages are limited to {self.config.max_message_chars} characters."
            )
        return None

    async def _safety_turn(
        self, text: str, turn_index: int, assessment: safety.SafetyAssessment
    ) -> AsyncIterator[Event]:
        """Crisis: the fixed safe response, no model call of any kind."""
        yield SafetyEvent(assessment)
        reply = safety.safe_response(self.config.safety_locale)
        for piece in _chunks(reply):
            yield TokenEvent(piece)
        self.turns.append(TurnRecord(turn_index, text, reply, None, None, None, "crisis", None))
        yield DoneEvent(reply, turn_index, None, None, "crisis")

    def _params(self, turn_index: int) -> GenerationParams:
        base = self.config.generation
        if self.config.seed is None:
            return base
        return replace(base, seed=stable_seed(self.config.seed, "turn", turn_index))

    def _prompt(self, text: str, skill_id: str, *, concern: bool) -> list[ChatMessage]:
        assert self.client is not None
        system = system_prompt(self.client.modality, skill_id)
        if concern:
            system += "\n\n" + safety.concern_guidance(self.config.safety_locale)
        if self.config.memory_k > 0 and self.client.memory.active():
            found = self.client.memory.retrieve(text, k=self.config.memory_k)
            if found:
                system += "\n\n" + render_for_prompt([item for item, _ in found])
        messages = [ChatMessage("system", system)]
        for turn in self.turns[-self.config.history_turns :]:
            messages.append(ChatMessage("user", turn.client_text))
            messages.append(ChatMessage("assistant", turn.reply))
        messages.append(ChatMessage("user", text))
        return messages

    async def _timed(self, awaitable: Any) -> Any:
        return await asyncio.wait_for(awaitable, timeout=self.config.backend_timeout_s)

    async def _stream_candidates(
        self, prompt: list[ChatMessage], n: int, params: GenerationParams
    ) -> AsyncIterator[str | list[str]]:
        """Yield candidate-0 text pieces as written, then the list of all candidates."""
        stream = self.backend.generate_stream(
            prompt, n=n, params=params, adapter=self.adapter_version
        )
        iterator = stream.__aiter__()
        while True:
            try:
                event = await self._timed(iterator.__anext__())
            except StopAsyncIteration:
                raise BackendError("stream ended without a final result") from None
            if isinstance(event, StreamDelta):
                if event.index == 0 and event.text:
                    yield event.text
            elif isinstance(event, StreamDone):
                yield list(event.texts)
                return

    def _judge_context(self, text: str, skill_id: str) -> JudgeContext:
        skill = get_skill(skill_id)
        history = []
        for turn in self.turns[-2:]:
            history += [("client", turn.client_text), ("counselor", turn.reply)]
        return JudgeContext(tuple(history), text, skill.name, skill.instruction)

    async def _judge(
        self, text: str, skill_id: str, candidates: list[str], *, report: bool
    ) -> AsyncIterator[ProgressEvent | GroupJudgment]:
        """The group's judgment, last; before it, with ``report``, a ``comparing`` event
        each time the judge finishes a step (the judge runs as a task so its steps reach
        the page while it works). Backend errors and the time limit raise from here."""
        context = self._judge_context(text, skill_id)
        if not report:
            yield await self._timed(self.judge.judge_group(context, candidates))
            return
        steps: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        task = asyncio.ensure_future(
            self._timed(
                self.judge.judge_group(
                    context, candidates, on_progress=lambda d, t: steps.put_nowait((d, t))
                )
            )
        )
        step: asyncio.Future[tuple[int, int]] | None = None
        try:
            while True:
                step = asyncio.ensure_future(steps.get())
                await asyncio.wait({task, step}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()  # the judge is done; what it reported is in the queue
                    break
                yield ProgressEvent("comparing", *step.result())
            while not steps.empty():
                yield ProgressEvent("comparing", *steps.get_nowait())
            yield task.result()
        finally:
            for pending in (step, task):  # the turn was abandoned (socket gone, error)
                if pending is not None:
                    pending.cancel()

    async def _search(
        self, prompt: list[ChatMessage], text: str, skill_id: str, n: int, params: GenerationParams
    ) -> SearchResult:
        """MCTSr-Zero: the N best distinct nodes of the tree become the candidates; the
        recorded prompt stays the plain one (the adapter learns to answer it directly)."""
        search = MctsrSearch(
            self.backend, self.config.mctsr, adapter=self.adapter_version,
            timeout_s=self.config.backend_timeout_s,
        )  # fmt: skip
        return await search.run(prompt, self._judge_context(text, skill_id), n, params)

    def _group_record(
        self,
        turn_index: int,
        slot: str,
        decision: Decision,
        prompt: list[ChatMessage],
        candidates: list[str],
        judged: GroupJudgment,
        verdicts: Sequence[output_guard.GuardVerdict] = (),
    ) -> CandidateGroupRecord:
        """The turn's evidence. The output guard's verdicts shape it (issue 21):

        - Delivery: selection (SOCA depth, then pointwise score, then lower index) runs
          over the admitted candidates only, on the graph among them; none admitted
          (or, in stream_first, candidate 0 rejected mid-stream): ``delivered`` is None.
        - Evidence: a rejected candidate is never preferred: every edge it wins is
          dropped (cycle removal ran first on the judge's full graph, so what is left
          stays acyclic). It DOES stay in as dispreferred: an edge where an admitted
          candidate beat it is the judge's real, consistency-checked preference, and
          training on it moves the adapter away from impersonating, dosing or leaking
          text. No edges are invented for the guard (admitted > rejected without a
          judged margin): Eq. 7's weights are support margins a rule verdict does not
          have, and a false rejection would then train the adapter away from a benign
          reply with full weight.
        - A group with no admitted candidate keeps no edge and is not admissible.
        """
        assert self.client is not None
        n = len(candidates)
        admitted = [v.admitted for v in verdicts] if verdicts else [True] * n
        group_id = (
            uuid.uuid4().hex
            if self.config.seed is None
            else f"{stable_seed(self.client.client_id, self.client.session_index, turn_index, self.config.seed):016x}"
        )
        admissible = judged.admissible
        edges: list[soca.Edge] = []
        use_soca = self.config.use_soca
        if admissible and not use_soca:
            edges = soca.raw_preference_edges(n, judged.support)
        elif admissible:
            edges = soca.build_preference_graph(
                n, judged.support, floor=self.config.edge_floor, group_id=group_id
            )
        edges = [e for e in edges if admitted[e.winner]]  # a rejected one is never preferred
        pointwise = [p if math.isfinite(p) else 0.0 for p in judged.pointwise]
        # Raw-score edges may form cycles, which have no depth: no-SOCA records depth 0.
        depths = soca.graph_depths(n, edges) if use_soca else [0] * n
        # stream_first already delivered candidate 0 while it was being written.
        stream_first = self.config.mode == "stream_first"
        delivered: int | None
        if not any(admitted) or (stream_first and not admitted[0]):
            delivered = None
        elif stream_first:
            delivered = 0
        elif use_soca:
            delivered = soca.select_delivered(n, edges, pointwise, admitted=admitted)
        else:
            support = judged.support if admissible else {}
            delivered = soca.raw_delivered(n, support, pointwise, admitted=admitted)
        problem = judged.problem
        if not any(admitted):
            admissible, problem = False, "output guard rejected every candidate"
        if admissible and not edges:
            # App. C.1: an empty graph still selects by pointwise score but trains nothing.
            admissible, problem = False, "empty preference graph"
        return CandidateGroupRecord(
            group_id=group_id,
            client_id=self.client.client_id,
            modality=self.client.modality,
            adapter_version=self.adapter_version,
            session_index=self.client.session_index,
            turn_index=turn_index,
            state_slot=slot,
            skill=decision.chosen,
            mode=self.config.mode,
            prompt=[{"role": m.role, "content": m.content} for m in prompt],
            candidates=list(candidates),
            judgments=[j.to_dict() for j in judged.judgments],
            support=[{"i": i, "j": j, "forward": f, "backward": b}
                     for (i, j), (f, b) in sorted(judged.support.items())],
            edges=[{"winner": e.winner, "loser": e.loser, "weight": e.weight} for e in edges],
            pointwise=[float(p) for p in judged.pointwise],
            depths=depths,
            delivered=delivered,
            admissible=admissible,
            problem=problem,
            beta=self.config.beta,
            guard=[v.to_dict() for v in verdicts] if verdicts else [],
        )  # fmt: skip

    # -- session end -----------------------------------------------------------------------
    async def end_session(
        self, rating: SessionRating | None = None, *, recap: bool = True
    ) -> SessionOutcome:
        """Credit, posterior updates and memory recap (paper Alg. 1 lines 14-15, 21).
        ``recap=False`` (the client withheld memory consent) makes no recap at all: the
        transcript is not even shown to the model for it, since nothing could be kept.

        1. Judge R_t for every turn that has a skill decision and a client reaction.
        2. :func:`soca.check_session_evidence` (H.7): a failed judge, fewer than two
           judged turns or all-tied outcomes update NO posterior cell; the record (rule,
           variance) goes into the outcome either way.
        3. Sound sessions: Eq. 8-9 over the judged turns, in order, with the projected
           session reward; one Eq. 4 update per judged turn with a skill.

        Choices where the paper is silent:
        - Only judged outcomes enter Eq. 8-9. The last counselor turn (no client reaction
          to judge) and safety turns (no skill decision) are left out of the trajectory:
          no credit, no update, and no imputed value in anyone else's ranks or returns.
        - The session reward is rating_weight * normalised SRS + (1 - rating_weight) *
          mean judged outcome when the client rated the session; otherwise the mean
          judged outcome. With nothing judged the internal reward is a neutral 0.5, and
          an unrated session then has no observed reward: it joins no reward history
          (``reward_observed`` False), so it cannot shift a later r_session either.
        - A judge failure at session end still ends the session (and writes the recap).
        """
        client = self.client
        if client is None or self._ended:
            raise RuntimeError("no session is running")
        self._ended = True
        observed, judge_failed = await self._turn_outcomes()
        evidence = soca.check_session_evidence(observed, judge_failed=judge_failed)
        judged = [] if judge_failed else [(t, v) for t, v in enumerate(observed) if v is not None]
        values = [v for _, v in judged]
        internal = sum(values) / len(values) if values else 0.5
        reward = internal
        if rating is not None:
            w = self.config.rating_weight
            reward = w * rating.normalised() + (1.0 - w) * internal
        reward_observed = rating is not None or bool(values)
        history = [*client.session_rewards, reward]
        projected = soca.projected_session_reward(history, scale=self.config.ordinal_scale)
        credit: list[float | None] = [None] * len(self.turns)
        updates = []
        if evidence.sound:
            if self.config.use_soca:
                returns = soca.trajectory_returns(
                    values, projected, scale=self.config.ordinal_scale, gamma=self.config.gamma
                )
            else:  # ablation: the raw outcomes and reward, no Eq. 8
                projected = reward
                returns = soca.unprojected_returns(values, reward, gamma=self.config.gamma)
            for (t, _), G in zip(judged, returns, strict=True):
                credit[t] = G
                turn = self.turns[t]
                if not self.config.use_hbsp or turn.skill is None or turn.state_slot is None:
                    continue
                if turn.shared_value is None:
                    continue
                updates.append(
                    client.posterior.update(turn.state_slot, turn.skill, G, turn.shared_value)
                )
        elif not self.config.use_soca:
            projected = reward
        if reward_observed:
            client.session_rewards.append(reward)
        recap_items = await self._recap() if recap else []
        outcomes = [None if judge_failed else v for v in observed]
        return SessionOutcome(
            outcomes, internal, rating, reward, projected, credit, updates, recap_items,
            evidence=evidence, reward_observed=reward_observed,
        )  # fmt: skip

    async def _turn_outcomes(self) -> tuple[list[float | None], bool]:
        """R_t per turn (None: not judged) and whether the judge failed."""
        observed: list[float | None] = [None] * len(self.turns)
        pairs = [
            (t, self.turns[t].reply, self.turns[t + 1].client_text)
            for t in range(len(self.turns) - 1)
            if self.turns[t].skill is not None
        ]
        if not pairs:
            return observed, False
        try:
            values = await self._timed(
                self.judge.turn_outcomes([(reply, nxt) for _, reply, nxt in pairs])
            )
        except (BackendError, TimeoutError, ValueError):
            return observed, True
        for (t, _, _), value in zip(pairs, values, strict=True):
            observed[t] = value
        return observed, False

    async def _recap(self) -> list[MemoryItem]:
        assert self.client is not None
        transcript = []
        for turn in self.turns:
            transcript += [("client", turn.client_text), ("counselor", turn.reply)]
        if not transcript:
            return []
        session_id = f"{self.client.client_id}:{self.client.session_index}"
        drafts = await generate_recap(
            self.backend, transcript, params=self._params(len(self.turns)),
            existing=self.client.memory.active(),
        )  # fmt: skip
        added = []
        for draft in drafts:
            added.append(
                self.client.memory.add(
                    kind=draft.kind, text=draft.text, source_session=session_id,
                    source_turn=draft.source_turn, origin="counselor",
                )
            )  # fmt: skip
        return added


def _fallback_after(passed: str) -> str:
    """The fallback as it follows the sentences already sent (none, or some)."""
    if not passed:
        return output_guard.FALLBACK
    return ("" if passed[-1].isspace() else " ") + output_guard.FALLBACK
