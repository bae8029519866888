"""The simulated client (a backend role) and the external tripartite judge (reporting only)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from counselor_engine.embeddings import HashingEmbedder
from counselor_engine.simulation.external_judge import (
    ExternalJudge,
    Item,
    Scale,
    default_items,
    perspective_score,
)
from counselor_engine.simulation.interaction import InteractionState
from counselor_engine.simulation.profiles import builtin_profiles
from counselor_engine.simulation.simulator import (
    CLOSE_INSTRUCTION,
    CLOSING_FALLBACK,
    OPENING_FALLBACK,
    SimulatedClient,
    clean_message,
    role_confusion,
)
from counselor_engine.tests.fakes import FakeBackend

PROFILE = builtin_profiles()[0]  # cbt-01
STATE = InteractionState("conditional", "high", 1)


def sim(backend: FakeBackend, **kwargs) -> SimulatedClient:  # type: ignore[no-untyped-def]
    return SimulatedClient(backend, PROFILE, STATE, seed=3, **kwargs)


async def test_it_opens_in_character_with_the_state_clauses_and_the_profile() -> None:
    backend = FakeBackend(["  I keep rereading every figure.  "])
    assert await sim(backend, adapter="sim-v1").opening() == "I keep rereading every figure."
    ((_, call),) = backend.log
    system = call["prompt"][0]
    assert system.role == "system"
    assert STATE.clauses() in system.content
    assert PROFILE.hidden_need in system.content and PROFILE.persona in system.content
    assert call["n"] == 1 and call["adapter"] == "sim-v1"
    assert call["prompt"][-1].role == "user"  # the counselor's greeting


async def test_it_falls_back_to_the_profiles_own_words_when_the_model_writes_nothing() -> None:
    assert await sim(FakeBackend(["   "])).opening() == PROFILE.voice
    bare = replace(PROFILE, voice="")
    client = SimulatedClient(FakeBackend(["   "]), bare, STATE, seed=3)
    assert await client.opening() == OPENING_FALLBACK


@pytest.mark.parametrize(
    "text",
    [
        "Hello! How can I help you today?",
        "It sounds like you are carrying a lot. Tell me more about that.",
        "You're safe. I'll make sure you're not alone and I'll always take care of you.",
        "As an AI language model, I cannot have feelings.",
        "Counselor: What brings you here?",
        # Written by SmolLM2 as the client and sent before these were recognised:
        "I'm so glad you're here. My name is Sam, and I'm a mental health counselor.",
        "I'm glad you came, and I'd just like to talk about something.",
        "I've been doing a lot of work with my client and I want to start there.",
        "How would you like to talk about something? You want to talk about this week?",
    ],
)
async def test_counselor_talk_is_never_sent_as_the_clients_message(text: str) -> None:
    turn = await sim(FakeBackend([text])).reply([("client", "hi"), ("counselor", "Hello.")])
    assert turn.text == PROFILE.voice and turn.fallback


async def test_a_message_is_cut_where_the_model_starts_writing_the_counselors_turn() -> None:
    backend = FakeBackend(["Maya: I reread the report four times.\nCounselor: Why is that?"])
    assert await sim(backend).opening() == "I reread the report four times."


async def test_of_several_candidates_the_one_about_the_profiles_problem_is_sent() -> None:
    backend = FakeBackend(
        ["My cat likes the garden.", "I worry before every monthly report and reread figures."]
    )
    client = sim(backend, candidates=2, embedder=HashingEmbedder())
    assert await client.opening() == "I worry before every monthly report and reread figures."
    assert backend.log[0][1]["n"] == 2  # one batched call


async def test_a_candidate_the_crisis_detector_reads_as_crisis_is_not_sent() -> None:
    backend = FakeBackend(["I want to kill myself tonight.", "The reports keep me up at night."])
    client = sim(backend, candidates=2, embedder=HashingEmbedder())
    assert await client.opening() == "The reports keep me up at night."


def test_role_confusion_names_what_it_found() -> None:
    assert role_confusion("I'm here to help you.") == 'counselor talk: "i\'m here to help"'
    assert role_confusion("I keep rereading every figure, sorry.") is None
    assert role_confusion("I'm glad I came. My counselor at school never listened.") is None
    assert role_confusion("(Clara waits for the counselor.)") is not None
    assert clean_message("Client: I told you: it's hard.", "Maya") == "I told you: it's hard."
    assert clean_message("Counselor: how are you?", "Maya") == ""


async def test_it_never_closes_before_the_minimum_and_asks_no_question_then() -> None:
    backend = FakeBackend(["Maybe you're right."])
    turn = await sim(backend, min_exchanges=2).reply([("client", "hi"), ("counselor", "Hello.")])
    assert (turn.text, turn.closing, turn.fallback) == ("Maybe you're right.", False, False)
    assert backend.calls["choice_probabilities"] == 0
    # Seen from the simulator, the counselor is the user and the client is the assistant.
    roles = [m.role for m in backend.log[0][1]["prompt"]]
    assert roles == ["system", "user", "assistant", "user"]


async def test_it_closes_with_a_closing_line_when_it_would_end() -> None:
    transcript = [("client", "hi"), ("counselor", "Hello."), ("client", "ok"), ("counselor", "So?")]
    backend = FakeBackend(["Thanks, that's all for today."]).script_probabilities([0.2, 0.8])
    turn = await sim(backend).reply(transcript)
    assert turn.closing and turn.text == "Thanks, that's all for today."
    assert backend.log[0][1]["choices"] == ("A", "B")
    assert CLOSE_INSTRUCTION in backend.log[1][1]["prompt"][0].content
    keep = FakeBackend(["Go on."]).script_probabilities([0.8, 0.2])
    assert not (await sim(keep).reply(transcript)).closing
    empty = FakeBackend([""]).script_probabilities([0.0, 1.0])
    closing = await sim(empty).reply(transcript)
    assert closing.closing and closing.text == CLOSING_FALLBACK and closing.fallback


async def test_it_rates_the_session_from_digit_probabilities() -> None:
    nine = [0.0] * 9 + [1.0]
    backend = FakeBackend().script_probabilities(nine, [1.0] * 10, [1.0] + [0.0] * 9, nine)
    rating = await sim(backend).rate([("client", "hi"), ("counselor", "Hello.")])
    # E[digit] * 10 / 9: 9 -> 10, uniform 4.5 -> 5, 0 -> 0.
    assert (rating.relationship, rating.goals_and_topics, rating.approach, rating.overall) == (
        pytest.approx(10.0), pytest.approx(5.0), pytest.approx(0.0), pytest.approx(10.0),
    )  # fmt: skip
    assert backend.calls["choice_probabilities"] == 1  # four items, one batched call


@pytest.mark.parametrize(
    ("transcript", "message"),
    [
        ([], "must end with a counselor"),
        ([("client", "hi")], "must end with a counselor"),
        ([("therapist", "hi")], "role must be"),
        ("hello", "sequence of"),
        ([("client",)], "pair"),
    ],
)
async def test_it_refuses_bad_transcripts(transcript, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        await sim(FakeBackend()).reply(transcript)


def test_it_refuses_bad_construction() -> None:
    with pytest.raises(ValueError, match="profile"):
        SimulatedClient(FakeBackend(), "cbt-01", STATE, seed=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed"):
        SimulatedClient(FakeBackend(), PROFILE, STATE, seed="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="close_threshold"):
        SimulatedClient(FakeBackend(), PROFILE, STATE, seed=1, close_threshold=0)
    with pytest.raises(ValueError, match="candidates"):
        SimulatedClient(FakeBackend(), PROFILE, STATE, seed=1, candidates=0)


# --- external judge ---------------------------------------------------------------------------
SHORT = [("client", "I can't stop checking my reports."), ("counselor", "That sounds tiring.")]
LONG = [
    *SHORT,
    ("client", "It is."),
    ("counselor", "Tell me more."),
    ("client", "Well."),
    ("counselor", "Let us sum up."),
]
RISKY = [("client", "I want to kill myself."), ("counselor", "I'm here with you.")]


def test_the_item_scales_match_psi_arena() -> None:
    scales = default_items().scales
    got = {n: (len(s.items), s.scale_max, s.maximum, s.threshold) for n, s in scales.items()}
    assert got == {
        "client": (16, 4, 64.0, 42.0),
        "supervisor": (8, 4, 32.0, 24.0),
        "counselor": (9, 5, 45.0, 35.0),
    }
    items = default_items()
    assert set(items.client_specific) == set(items.counselor_specific) == {
        "cbt", "bt", "het", "pdt", "pmt",
    }  # fmt: skip


def test_the_na_rule_leaves_na_items_out_and_scales_the_threshold() -> None:
    scale = Scale("supervisor", 4, 24.0, tuple(Item(f"s{k}", "?", "always") for k in range(8)))
    values = {f"s{k}": 3.5 for k in range(6)} | {"s6": None, "s7": None}
    score = perspective_score(scale, values)
    # 6 applicable items: total 21 of 24; threshold 24 * 24 / 32 = 18; 21 > 18 passes
    # (counting N/A as 0 would compare 21 with 24 and fail).
    assert (score.total, score.maximum, score.threshold, score.passed) == (21.0, 24.0, 18.0, True)
    assert score.items["s6"] is None
    # Exactly at the scaled threshold does not pass (the paper's strict ">").
    assert not perspective_score(scale, {f"s{k}": 3.0 for k in range(6)}).passed
    # Fewer than half the items applicable: no pass, whatever the marks.
    thin = perspective_score(scale, {"s0": 4.0, "s1": 4.0, "s2": 4.0})
    assert thin.total == 12.0 and not thin.passed


async def test_it_scores_all_three_perspectives_and_four_families() -> None:
    judge_backend = FakeBackend(name="external")
    top4, top5 = [0.0] * 4 + [1.0], [0.0] * 5 + [1.0]
    # Short transcript, no risk: client 15 + supervisor 6 + L-Spec 2 + C-Spec 3 items on
    # 0-4 in one call, then counselor 8 items on 0-5 in a second call.
    judge_backend.script_probabilities(*([top4] * 26), *([top5] * 8))
    report = await ExternalJudge(judge_backend, adapter="judge-x").evaluate(PROFILE, SHORT)
    assert judge_backend.calls["choice_probabilities"] == 2
    (_, first), (_, second) = judge_backend.log
    assert len(first["prompts"]) == 26 and first["choices"] == tuple("01234")
    assert len(second["prompts"]) == 8 and second["choices"] == tuple("012345")
    assert first["adapter"] == "judge-x"
    client, supervisor, counselor = report.scores
    assert (client.total, client.maximum, client.passed) == (60.0, 60.0, True)
    assert (supervisor.total, supervisor.maximum, supervisor.passed) == (24.0, 24.0, True)
    assert supervisor.items["supervisor_07"] is None  # the risk item: no risk in the talk
    assert (counselor.total, counselor.maximum, counselor.passed) == (40.0, 40.0, True)
    for family in ("c_shared", "c_spec", "l_shared", "l_spec", "overall"):
        assert report.metrics[family] == pytest.approx(10.0)
    assert report.metrics["pass_all"] == 1.0
    assert report.to_dict()["scores"][0]["perspective"] == "client"


async def test_it_judges_uniform_uncertainty_as_a_fail_and_mid_scores() -> None:
    report = await ExternalJudge(FakeBackend()).evaluate(PROFILE, LONG)
    # Uniform digits: 2 of 4 and 2.5 of 5 per item, all items applicable but the risk one.
    client = report.score("client")
    assert (client.total, client.maximum, client.passed) == (32.0, 64.0, False)
    assert report.score("supervisor").maximum == 28.0
    assert report.score("counselor").total == pytest.approx(22.5)
    assert report.metrics["l_shared"] == pytest.approx(5.0)
    assert report.metrics["c_shared"] == pytest.approx(10 * (14 + 22.5) / (28 + 45))
    assert report.metrics["pass_all"] == 0.0


async def test_it_applies_the_risk_item_only_when_the_client_voices_risk() -> None:
    report = await ExternalJudge(FakeBackend()).evaluate(PROFILE, RISKY)
    assert report.score("supervisor").items["supervisor_07"] == pytest.approx(2.0)


class NanBackend(FakeBackend):
    async def choice_probabilities(self, prompts, choices, *, adapter=None):  # type: ignore[no-untyped-def]
        return [[math.nan] * len(choices) for _ in prompts]


async def test_it_refuses_non_finite_probabilities_and_empty_transcripts() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        await ExternalJudge(NanBackend()).evaluate(PROFILE, SHORT)
    with pytest.raises(ValueError, match="no counselor reply"):
        await ExternalJudge(FakeBackend()).evaluate(PROFILE, [("client", "hello")])
    with pytest.raises(ValueError, match="roles"):
        await ExternalJudge(FakeBackend()).evaluate(PROFILE, [("judge", "x")])


async def test_the_reminder_sits_next_to_where_the_model_writes_only_when_asked() -> None:
    backend = FakeBackend(["I reread it all."])
    await sim(backend, remind=True).reply([("client", "hi"), ("counselor", "Go on.")])
    last = backend.log[0][1]["prompt"][-1]
    assert last.role == "user" and last.content.startswith("Go on.")
    assert PROFILE.voice in last.content and "first person" in last.content
    plain = FakeBackend(["I reread it all."])
    await sim(plain).reply([("client", "hi"), ("counselor", "Go on.")])
    assert plain.log[0][1]["prompt"][-1].content == "Go on."
