"""Simulated-client profiles, the PsychAgent importer and the 24 interaction states."""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import FrozenInstanceError

import pytest

from counselor_engine.simulation.interaction import (
    ACTIVATION_LEVELS,
    ALL_STATES,
    DISCLOSURE_LEVELS,
    InteractionState,
    state_from_key,
)
from counselor_engine.simulation.profiles import SimProfile, builtin_profiles, import_psychagent
from counselor_engine.simulation.simulator import render_system
from counselor_engine.skills import MODALITIES

MODALITY_KEYS = {
    "cbt": {"core_belief", "automatic_thoughts"},
    "bt": {"target_behaviour", "antecedents", "consequences"},
    "het": {"incongruence", "conditions_of_worth"},
    "pdt": {"core_conflict", "defenses"},
    "pmt": {"dominant_story", "exceptions", "preferred_future"},
}


def test_it_ships_four_profiles_per_modality_with_a_modality_formulation() -> None:
    profiles = builtin_profiles()
    assert len(profiles) >= 20
    assert Counter(p.modality for p in profiles) == {m: 4 for m in MODALITIES}
    assert len({p.id for p in profiles}) == len(profiles)
    for p in profiles:
        assert MODALITY_KEYS[p.modality] <= set(p.formulation), p.id
        for text in (p.persona, p.presenting_problem, p.history, p.hidden_need, p.intent):
            assert text.strip()
    # Intents recur across modalities, so leave-one-intent-out pooling has evidence to share.
    modalities_per_intent = {
        i: {p.modality for p in profiles if p.intent == i} for i in {p.intent for p in profiles}
    }
    assert all(len(m) >= 2 for m in modalities_per_intent.values())


def test_it_keeps_profiles_immutable() -> None:
    profile = builtin_profiles()[0]
    with pytest.raises(FrozenInstanceError):
        profile.persona = "someone else"  # type: ignore[misc]
    source = dict(profile.formulation)
    copy = SimProfile.from_dict({**profile.to_dict(), "formulation": source})
    source["core_belief"] = "changed"
    assert copy.formulation["core_belief"] == profile.formulation["core_belief"]


def without(*keys: str) -> dict:  # type: ignore[type-arg]
    return {k: v for k, v in PSYCHAGENT["clients"][0].items() if k not in keys}


PSYCHAGENT = {
    "clients": [
        {
            "client_id": "pa-1",
            "therapy": "Cognitive Behavioral Therapy",
            "basic_info": {"age": 30, "occupation": "nurse"},
            "chief_complaint": "Cannot sleep before night shifts.",
            "growth_experience": ["Moved often as a child", "Parents divorced at 10"],
            "core_demand": "To feel competent at work.",
            "core_beliefs": "I am not good enough.",
            "automatic_thoughts": "I will make a fatal mistake.",
            "topic": "work_stress",
        },
        {
            "id": "pa-2",
            "school": "solution-focused brief therapy (SFBT)",
            "persona": "A retired teacher.",
            "presenting_problem": "Feels useless since retiring.",
            "background": "Taught for 35 years.",
            "hidden_need": "To matter to someone again.",
            "case_conceptualization": {"dominant_story": "I am done.", "exceptions": "Tutoring"},
        },
    ]
}


def test_it_imports_psychagent_style_records_from_objects_text_and_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    first, second = import_psychagent(PSYCHAGENT)
    assert (first.id, first.modality, first.intent) == ("pa-1", "cbt", "work_stress")
    assert first.persona == "age: 30; occupation: nurse"
    assert first.history == "Moved often as a child; Parents divorced at 10"
    assert first.formulation == {
        "core_beliefs": "I am not good enough.",
        "automatic_thoughts": "I will make a fatal mistake.",
    }
    assert (second.modality, second.intent, second.name) == ("pmt", "general", "pa-2")
    assert second.formulation["dominant_story"] == "I am done."
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(PSYCHAGENT))
    assert import_psychagent(path) == [first, second]
    assert import_psychagent(str(path)) == [first, second]
    assert import_psychagent(json.dumps(PSYCHAGENT["clients"][0])) == [first]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{not json", "not valid JSON"),
        ("/no/such/file.json", "no such file"),
        ([], "no profiles"),
        (42, "expected JSON objects"),
        ([1], "record 0: expected a JSON object"),
        ({**PSYCHAGENT["clients"][0], "therapy": "astrology"}, "unknown therapy modality"),
        (without("therapy"), "missing therapy"),
        (without("chief_complaint"), "missing presenting_problem"),
        (without("core_beliefs", "automatic_thoughts"), "missing formulation"),
        ({**PSYCHAGENT["clients"][0], "core_demand": 3.5j}, "expected text"),
        ({**PSYCHAGENT["clients"][0], "client_id": "bad id!"}, "id: expected"),
        ([PSYCHAGENT["clients"][0]] * 2, "duplicate profile id"),
    ],
)  # fmt: skip
def test_it_refuses_bad_psychagent_input_with_a_clear_error(data, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        import_psychagent(data)


# --- interaction states -----------------------------------------------------------------------
LABEL_WORDS = (
    "delayed", "conditional", "proactive", "moderate", "high", "trust", "disclosure",
    "activation", "level", "state", "axis", "difficulty", "label", "t0", "t1", "t2", "t3",
)  # fmt: skip


def test_it_has_24_distinct_states_in_a_stable_index_order() -> None:
    assert len(ALL_STATES) == 24
    assert [s.index for s in ALL_STATES] == list(range(24))
    assert len({s.key for s in ALL_STATES}) == 24
    assert len({s.clauses() for s in ALL_STATES}) == 24
    assert ALL_STATES[8 * 1 + 4 * 1 + 2] == InteractionState("conditional", "high", 2)
    for state in ALL_STATES:
        assert state_from_key(state.key) is state
    assert {s.disclosure for s in ALL_STATES} == set(DISCLOSURE_LEVELS)
    assert {s.activation for s in ALL_STATES} == set(ACTIVATION_LEVELS)


def test_it_renders_states_without_revealing_any_label() -> None:
    for state in ALL_STATES:
        words = set(re.findall(r"[a-z0-9]+", state.clauses().lower()))
        assert not words & set(LABEL_WORDS), (state.key, words & set(LABEL_WORDS))
        assert state.key not in state.clauses()


def test_it_never_alters_the_profile_when_rendering_a_state() -> None:
    for profile in builtin_profiles()[:5]:
        before = profile.to_dict()
        prompts = {render_system(profile, state) for state in ALL_STATES}
        assert profile.to_dict() == before
        assert len(prompts) == 24
        for prompt in prompts:
            # Persona, event and hidden need are carried verbatim in every state.
            for text in (profile.persona, profile.presenting_problem, profile.hidden_need):
                assert text in prompt


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"disclosure": "sudden", "activation": "high", "trust": 0}, "disclosure"),
        ({"disclosure": "delayed", "activation": "low", "trust": 0}, "activation"),
        ({"disclosure": "delayed", "activation": "high", "trust": 4}, "trust"),
        ({"disclosure": "delayed", "activation": "high", "trust": True}, "trust"),
    ],
)
def test_it_refuses_unknown_levels(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        InteractionState(**kwargs)


@pytest.mark.parametrize("key", ["", "delayed/high", "delayed/high/t9", 3])
def test_it_refuses_unknown_state_keys(key) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="unknown interaction state"):
        state_from_key(key)
