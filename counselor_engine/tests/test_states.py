"""The 54-slot state encoder: stage, progress and keyword affect."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from counselor_engine.states import (
    AFFECTS,
    ALL_SLOTS,
    DEFAULT_AFFECT,
    DEFAULT_CLASSIFIER,
    PROGRESS,
    STAGES,
    State,
    classify_affect,
    encode_state,
    parse_slot,
    progress_for,
    stage_for,
)


def test_it_has_54_stable_slots_grouped_by_stage() -> None:
    assert len(ALL_SLOTS) == len(set(ALL_SLOTS)) == 54
    assert ALL_SLOTS[0] == "formulation/early/anxiety"
    assert ALL_SLOTS[23] == "core/early/positive"
    assert ALL_SLOTS[-1] == "consolidation/late/positive"
    stages = [slot.split("/")[0] for slot in ALL_SLOTS]
    assert stages == [s for s in STAGES for _ in range(18)]
    assert AFFECTS == ("anxiety", "sadness", "anger", "guilt", "calmness", "positive")


def test_parse_slot_round_trips_every_slot() -> None:
    for slot in ALL_SLOTS:
        assert parse_slot(slot).slot_id == slot


@pytest.mark.parametrize("slot", ["core/middle", "core/middle/joy", "Core/middle/anxiety", "", 3])
def test_parse_slot_refuses_unknown_slots(slot: object) -> None:
    with pytest.raises(ValueError, match="slot_id"):
        parse_slot(slot)  # type: ignore[arg-type]


def test_a_state_refuses_unknown_parts() -> None:
    with pytest.raises(ValueError, match="progress"):
        State("core", "end", "anxiety")


@pytest.mark.parametrize(
    ("planned", "expected"),
    [
        (1, "F"),
        (2, "FX"),
        (3, "FCX"),
        (5, "FCCCX"),
        (6, "FFCCCX"),
        (10, "FFCCCCCCXX"),
    ],
)
def test_the_stage_follows_the_planned_course(planned: int, expected: str) -> None:
    letters = {"formulation": "F", "core": "C", "consolidation": "X"}
    assert "".join(letters[stage_for(k, planned)] for k in range(planned)) == expected


def test_sessions_beyond_the_plan_are_consolidation() -> None:
    assert stage_for(5, 5) == stage_for(12, 5) == "consolidation"
    assert stage_for(1, 1) == "consolidation"


@pytest.mark.parametrize(("index", "planned"), [(-1, 5), (0, 0), (1.0, 5), (True, 5)])
def test_stage_refuses_bad_indices(index: object, planned: int) -> None:
    with pytest.raises(ValueError, match=r"session_index|planned_sessions"):
        stage_for(index, planned)  # type: ignore[arg-type]


def test_progress_bins_use_thresholds_033_and_066() -> None:
    assert [progress_for(t, 3) for t in range(3)] == list(PROGRESS)
    bins = [progress_for(t, 30) for t in range(30)]
    assert bins == ["early"] * 10 + ["middle"] * 10 + ["late"] * 10
    assert progress_for(33, 100) == "middle" and progress_for(32, 100) == "early"
    assert progress_for(66, 100) == "late" and progress_for(65, 100) == "middle"
    assert progress_for(0, 1) == "early"
    assert progress_for(40, 30) == "late"  # a session running over its budget


@pytest.mark.parametrize(("turn", "budget"), [(-1, 10), (0, 0), (0.5, 10)])
def test_progress_refuses_bad_arguments(turn: object, budget: int) -> None:
    with pytest.raises(ValueError, match=r"turn_index|turn_budget"):
        progress_for(turn, budget)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I'm so anxious about the interview", "anxiety"),
        ("I've been feeling down and lonely", "sadness"),
        ("He makes me furious", "anger"),
        ("It was my fault, I should have called her", "guilt"),
        ("I feel calm and settled today", "calmness"),
        ("I'm proud of myself, honestly happy", "positive"),
        ("I'm not anxious", "calmness"),  # negation: not evidence of anxiety
        ("I don’t feel so worried anymore", "calmness"),  # curly apostrophe, wider window
        ("I can't relax at all", "anxiety"),  # negated calm
        ("I'm not happy with how it went", "sadness"),  # negated positive affect
        ("I'm not anxious, but I am really angry", "anger"),  # negation stops at the clause
        ("I feel a bit sad but mostly okay", "calmness"),  # downtoner
        ("I'm okay but really sad", "sadness"),  # intensifier
        ("I was anxious, but now I feel calm", "calmness"),  # tie: latest words win
        ("I feel calm, but anxious about tomorrow", "anxiety"),
        ("We talked about the weather", DEFAULT_AFFECT),
        ("", DEFAULT_AFFECT),
    ],
)
def test_it_classifies_affect_by_keyword_rules(text: str, expected: str) -> None:
    assert classify_affect(text) == expected


def test_modifiers_change_the_weight_of_a_cue() -> None:
    assert DEFAULT_CLASSIFIER.scores("I am anxious")["anxiety"] == 1.0
    assert DEFAULT_CLASSIFIER.scores("I am really anxious")["anxiety"] == 1.5
    assert DEFAULT_CLASSIFIER.scores("I am a bit anxious")["anxiety"] == 0.5
    negated = DEFAULT_CLASSIFIER.scores("I am not very anxious")
    assert negated["anxiety"] == 0.0 and negated["calmness"] == 0.5


def test_the_default_affect_is_calmness() -> None:
    assert DEFAULT_AFFECT == "calmness"


def test_the_lexicon_is_easy_to_extend() -> None:
    assert classify_affect("I feel jumpy") == DEFAULT_AFFECT
    extended = DEFAULT_CLASSIFIER.extend("anxiety", "jumpy", "keyed up")
    assert extended.classify("I feel jumpy") == "anxiety"
    assert extended.classify("so keyed up tonight") == "anxiety"
    assert DEFAULT_CLASSIFIER.classify("I feel jumpy") == DEFAULT_AFFECT  # original untouched
    with pytest.raises(ValueError, match="category"):
        DEFAULT_CLASSIFIER.extend("boredom", "bored")


def test_classify_refuses_non_text() -> None:
    with pytest.raises(ValueError, match="text"):
        classify_affect(None)  # type: ignore[arg-type]


def test_encode_state_combines_the_three_parts() -> None:
    state = encode_state(3, 10, 12, 30, "I'm worried it will happen again")
    assert state == State("core", "middle", "anxiety")
    assert state.slot_id == "core/middle/anxiety"


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_any_text_maps_to_one_of_the_six_categories(text: str) -> None:
    assert classify_affect(text) in AFFECTS


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 40), st.integers(1, 40), st.integers(0, 60), st.integers(1, 60))
def test_every_valid_input_encodes_to_a_known_slot(s: int, p: int, t: int, b: int) -> None:
    assert encode_state(s, p, t, b, "fine").slot_id in ALL_SLOTS
