"""One counseling session end to end, headless: the paper's Algorithm 1 for one client."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from counselor_engine import soca
from counselor_engine.backends.base import BackendError, GenerationParams
from counselor_engine.counselor import (
    ClientState,
    Counselor,
    CounselorConfig,
    DoneEvent,
    ErrorEvent,
    ProgressEvent,
    SafetyEvent,
    SessionRating,
    SkillEvent,
    TokenEvent,
)
from counselor_engine.embeddings import HashingEmbedder
from counselor_engine.memory import MemoryStore
from counselor_engine.tests.fakes import FakeBackend

FAST = GenerationParams(max_new_tokens=10, temperature=0.9, top_p=0.95)


def client(modality: str = "cbt", **kwargs) -> ClientState:  # type: ignore[no-untyped-def]
    return ClientState(
        "client-1", modality, 0, 4, memory=MemoryStore(embedder=HashingEmbedder()), **kwargs
    )


def config(**kwargs) -> CounselorConfig:  # type: ignore[no-untyped-def]
    return CounselorConfig(**{"n_candidates": 3, "generation": FAST, "seed": 7, **kwargs})


async def collect(counselor: Counselor, message: object) -> list:  # type: ignore[type-arg]
    return [event async for event in counselor.respond(message)]


@pytest.fixture
async def tiny_transformers(tiny_backend, tiny_adapter_paths):  # type: ignore[no-untyped-def]
    await tiny_backend.load_adapter("v3", str(tiny_adapter_paths["v1"]))
    return tiny_backend


async def test_a_two_session_course_learns_only_where_it_acted(tiny_transformers) -> None:  # type: ignore[no-untyped-def]
    state = client()
    counselor = Counselor(tiny_transformers, config=config())
    counselor.start_session(state, "v3")
    messages = [
        "I feel anxious about my exams",
        "I can't sleep before tests",
        "my parents expect a lot",
    ]
    chosen = []
    groups = []
    for message in messages:
        events = await collect(counselor, message)
        assert isinstance(events[0], SkillEvent)
        done = events[-1]
        assert isinstance(done, DoneEvent)
        assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == done.reply
        chosen.append((done.decision.state, done.decision.chosen))
        groups.append(done.group)
    for group in groups:
        assert (group.client_id, group.modality, group.adapter_version) == ("client-1", "cbt", "v3")
        assert len(group.candidates) == 3
        assert group.candidates[group.delivered] in [t.reply for t in counselor.turns]
    before = state.posterior.cells()
    assert before == {}
    outcome = await counselor.end_session(SessionRating(8, 7, 9, 8))
    after = state.posterior.cells()
    # The last turn has no client reaction: not judged, so it updates nothing.
    assert outcome.turn_outcomes[2] is None and outcome.credit[2] is None
    assert set(after) == set(chosen[:2]), "only cells whose skill was chosen and judged change"
    assert outcome.evidence.sound and outcome.evidence.judged == 2
    # Credit is Eq. 9 over the judged outcomes with the projected session reward.
    judged = outcome.turn_outcomes[:2]
    expected = soca.trajectory_returns(judged, outcome.projected_session_reward)
    assert outcome.credit[:2] == pytest.approx(expected)
    assert outcome.projected_session_reward == pytest.approx(
        outcome.session_reward
    )  # first session
    assert [u.G for u in outcome.posterior_updates] == pytest.approx(outcome.credit[:2])
    assert outcome.recap, "a session always leaves a recap"

    # Session 2: the session-1 recap reaches the prompt through retrieval.
    state.session_index = 1
    second = Counselor(tiny_transformers, config=config(seed=8))
    second.start_session(state, "v3")
    await collect(second, "exams are coming again and I'm anxious")
    system = second.turns[0].group.prompt[0]["content"]
    assert "<client_memory>" in system
    assert outcome.recap[0].text.split()[0] in system


async def test_a_crisis_never_touches_the_model() -> None:
    backend = FakeBackend().fail_always("*")
    counselor = Counselor(backend, config=config())
    counselor.start_session(client(), None)
    events = await collect(counselor, "I am going to kill myself tonight")
    assert isinstance(events[0], SafetyEvent) and events[0].assessment.level == "crisis"
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.group is None and "988" in done.reply
    assert sum(backend.calls.values()) == 0


async def test_an_assessment_made_by_the_caller_is_not_made_again(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The web app assesses each message once, before anything else, and hands the verdict
    in: the engine acts on it (here a crisis the words alone would not show) and never
    runs the assessment a second time."""
    from counselor_engine import safety

    verdict = safety.assess("I am going to kill myself tonight")
    calls = []
    monkeypatch.setattr(safety, "assess", lambda text: calls.append(text))
    backend = FakeBackend().fail_always("*")
    counselor = Counselor(backend, config=config())
    counselor.start_session(client(), None)
    events = [e async for e in counselor.respond("see you", assessment=verdict)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.safety_level == "crisis" and "988" in done.reply
    assert calls == [] and sum(backend.calls.values()) == 0


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("", "empty_message"),
        ("  \n ", "empty_message"),
        (b"bytes", "not_text"),
        (None, "not_text"),
        ("x" * 5001, "too_long"),
    ],
)
async def test_bad_messages_are_refused_and_nothing_is_recorded(message, code) -> None:  # type: ignore[no-untyped-def]
    backend = FakeBackend()
    counselor = Counselor(backend, config=config(max_message_chars=5000))
    counselor.start_session(client(), None)
    events = await collect(counselor, message)
    assert len(events) == 1 and isinstance(events[0], ErrorEvent) and events[0].code == code
    assert counselor.turns == [] and sum(backend.calls.values()) == 0


async def test_a_slow_backend_times_out_and_a_retry_is_clean() -> None:
    backend = FakeBackend(delay=1.0)
    counselor = Counselor(backend, config=config(backend_timeout_s=0.05))
    counselor.start_session(client(), None)
    events = await collect(counselor, "hello")
    assert isinstance(events[-1], ErrorEvent) and events[-1].code == "backend_timeout"
    assert events[-1].retryable and counselor.turns == []
    backend.delay = 0.0
    events = await collect(counselor, "hello")
    assert isinstance(events[-1], DoneEvent) and len(counselor.turns) == 1


async def test_a_down_backend_is_an_error_event_not_an_exception() -> None:
    backend = FakeBackend().fail_always("generate")
    counselor = Counselor(backend, config=config())
    counselor.start_session(client(), None)
    events = await collect(counselor, "hello")
    assert isinstance(events[-1], ErrorEvent) and events[-1].code == "backend_error"


async def test_a_nan_judgment_delivers_by_pointwise_and_is_not_evidence() -> None:
    backend = FakeBackend()
    backend.script_probabilities([float("nan")] * 5, [0, 0, 0, 0, 1], [1, 0, 0, 0, 0])
    counselor = Counselor(backend, config=config())
    counselor.start_session(client(), None)
    done = (await collect(counselor, "hello"))[-1]
    assert isinstance(done, DoneEvent)
    assert not done.group.admissible
    assert done.group.delivered == 1  # the best finite pointwise score


async def test_stream_first_streams_candidate_zero_and_records_it() -> None:
    backend = FakeBackend(["first candidate text", "second", "third"])
    counselor = Counselor(backend, config=config(mode="stream_first"))
    counselor.start_session(client(), None)
    events = await collect(counselor, "hello")
    tokens = [e.text for e in events if isinstance(e, TokenEvent)]
    assert "".join(tokens) == "first candidate text"
    done = events[-1]
    assert done.group.delivered == 0 and done.group.mode == "stream_first"
    assert len(done.group.candidates) == 3


async def test_pinned_and_excluded_skills_are_honoured() -> None:
    counselor = Counselor(FakeBackend(), config=config())
    counselor.start_session(client(pinned_skill="CBT2"), None)
    skill = (await collect(counselor, "hello"))[0]
    assert skill.decision.chosen == "CBT2" and skill.decision.records["CBT2"].probability == 1.0
    counselor = Counselor(FakeBackend(), config=config())
    counselor.start_session(client(excluded_skills=frozenset({"CBT1", "CBT2"})), None)
    for message in ["a", "b", "c", "d"]:
        decision = next(
            e for e in await collect(counselor, message) if isinstance(e, SkillEvent)
        ).decision
        assert "CBT1" not in decision.records and "CBT2" not in decision.records
        assert decision.chosen not in {"CBT1", "CBT2"}


def test_bad_client_state_is_refused() -> None:
    with pytest.raises(ValueError, match="modality"):
        ClientState("c", "astrology", 0, 1)
    with pytest.raises(ValueError, match="skills"):
        ClientState("c", "cbt", 0, 1, pinned_skill="PDT1")
    with pytest.raises(ValueError, match="every skill"):
        ClientState("c", "cbt", 0, 1, excluded_skills=frozenset(f"CBT{i}" for i in range(1, 7)))


def test_client_state_round_trips_through_json() -> None:
    state = client()
    state.posterior.update("core/early/anxiety", "CBT1", 0.7, 0.2)
    state.memory.add("goal", "sleep better before exams", source_session="s1", source_turn=2)
    again = ClientState.from_dict(state.to_dict())
    assert again.to_dict() == state.to_dict()


async def test_the_session_ends_even_when_the_model_is_down() -> None:
    backend = FakeBackend()
    counselor = Counselor(backend, config=config())
    counselor.start_session(client(), None)
    await collect(counselor, "I worry about work")
    await collect(counselor, "and about money")
    backend.fail_always("*")
    state = counselor.client
    assert state is not None
    outcome = await counselor.end_session(None)
    # H.7: a failed judge is recorded and skipped, never imputed as 0.5.
    assert outcome.turn_outcomes == [None, None] and outcome.credit == [None, None]
    assert outcome.posterior_updates == [] and state.posterior.cells() == {}
    assert outcome.evidence.skip == "judge_failed"
    assert not outcome.reward_observed and state.session_rewards == []
    assert outcome.recap  # the extractive fallback


def test_the_cli_replays_a_saved_session_identically(tiny_model_path: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    save = tmp_path / "session.json"
    common = ["--model", str(tiny_model_path)]
    chat = subprocess.run(
        [
            sys.executable,
            "-m",
            "counselor_engine",
            "chat",
            "--modality",
            "het",
            "--n",
            "2",
            "--max-new-tokens",
            "8",
            "--seed",
            "3",
            "--save",
            str(save),
            "--client-file",
            str(tmp_path / "client.json"),
            *common,
        ],
        input="I feel stuck\nnothing changes\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.count("counselor>") == 2
    replay = subprocess.run(
        [sys.executable, "-m", "counselor_engine", "replay", str(save), *common],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert replay.returncode == 0, replay.stderr
    assert "replay identical" in replay.stderr


async def test_a_judged_reply_reports_real_progress_before_its_first_token() -> None:
    """Graph mode with progress on: drafts 0/N then N/N around the one generate call, then
    the judge's ordered comparisons after each backend call, all before any token."""
    backend = FakeBackend()
    counselor = Counselor(backend, config=config(report_progress=True))
    counselor.start_session(client(), None)
    events = await collect(counselor, "I have been sleeping badly")
    first_token = next(i for i, e in enumerate(events) if isinstance(e, TokenEvent))
    steps = [(e.stage, e.done, e.total) for e in events if isinstance(e, ProgressEvent)]
    assert all(i < first_token for i, e in enumerate(events) if isinstance(e, ProgressEvent))
    assert steps == [
        ("drafting", 0, 3), ("drafting", 3, 3),
        ("comparing", 0, 6), ("comparing", 2, 6), ("comparing", 4, 6), ("comparing", 6, 6),
    ]  # fmt: skip
    # One pointwise call and one pairwise call per candidate shown as A.
    assert backend.calls["generate"] == 1 and backend.calls["choice_probabilities"] == 1 + 3


class PromptReadingBackend(FakeBackend):
    """Probabilities that depend on each prompt's text only, as a real model's do (the
    scripted rows of FakeBackend follow call order, which chunking changes)."""

    def __init__(self, fail_on_call: int | None = None) -> None:
        super().__init__(
            responder=lambda _prompt, i: ["a short reply", "a kinder reply", "more"][i]
        )
        self.fail_on_call = fail_on_call

    async def choice_probabilities(self, prompts, choices, *, adapter=None):  # type: ignore[no-untyped-def]
        self.calls["choice_probabilities"] += 1
        if self.calls["choice_probabilities"] == self.fail_on_call:
            raise BackendError("the model process died")
        rows = []
        for prompt in prompts:
            digest = hashlib.sha256(repr(prompt).encode()).digest()
            raw = [1.0 + digest[k] for k in range(len(choices))]
            rows.append([p / sum(raw) for p in raw])
        return rows


async def test_progress_reporting_does_not_change_the_judgment() -> None:
    """The chunked judge reads the same probabilities as the one-call judge."""
    groups = []
    for report in (False, True):
        counselor = Counselor(PromptReadingBackend(), config=config(report_progress=report))
        counselor.start_session(client(), None)
        done = (await collect(counselor, "work is too much"))[-1]
        assert isinstance(done, DoneEvent)
        groups.append(done.group)
    quiet, chatty = groups
    assert len({round(p, 9) for p in quiet.pointwise}) > 1  # not a uniform toy judgment
    assert quiet.support == chatty.support and quiet.edges == chatty.edges
    assert quiet.delivered == chatty.delivered


async def test_without_progress_or_in_stream_first_no_progress_is_sent() -> None:
    for cfg in (config(), config(report_progress=True, mode="stream_first")):
        counselor = Counselor(FakeBackend(), config=cfg)
        counselor.start_session(client(), None)
        events = await collect(counselor, "hello there")
        assert not [e for e in events if isinstance(e, ProgressEvent)]
        assert isinstance(events[-1], DoneEvent)


async def test_a_judge_failure_after_progress_is_a_retryable_error() -> None:
    backend = PromptReadingBackend(fail_on_call=3)  # pointwise, A = 0, then A = 1 fails
    counselor = Counselor(backend, config=config(report_progress=True))
    counselor.start_session(client(), None)
    events = await collect(counselor, "hello")
    steps = [(e.stage, e.done) for e in events if isinstance(e, ProgressEvent)]
    assert steps[-1] == ("comparing", 2)  # the comparisons done before the failure
    assert isinstance(events[-1], ErrorEvent) and events[-1].code == "backend_error"
    assert events[-1].retryable and counselor.turns == []
