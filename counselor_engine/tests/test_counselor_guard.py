"""Delivery obeys the output guard (issue 21), through ``Counselor.respond``.

The judge is the real one on a fake backend where only ordering matters, or a stub that
hands back a fixed two-order support table, so a rejected candidate would win on
merit: the tests then show the guard, not the judge, deciding what is delivered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from counselor_engine import output_guard, soca
from counselor_engine.counselor import (
    Counselor,
    DoneEvent,
    ErrorEvent,
    TokenEvent,
    TurnRecord,
)
from counselor_engine.judge import GroupJudgment
from counselor_engine.tests.fakes import FakeBackend
from counselor_engine.tests.test_counselor import client, collect, config

CREDENTIAL = "As a licensed therapist, I can tell you this is common."
DOSING = "Try 50 mg of sertraline tonight."
GOOD = "That sounds really hard. What happened this week?"
FINE = "I hear you. Tell me more."


class StubJudge:
    """Candidate i beats j with the share in ``wins`` (both orders agree), else ties."""

    def __init__(self, wins: dict[tuple[int, int], float]) -> None:
        self.wins = wins
        self.calls = 0

    async def judge_group(self, context: Any, candidates: Sequence[str], **_: Any) -> GroupJudgment:
        self.calls += 1
        n = len(candidates)
        support = {
            (i, j): (self.wins.get((i, j), 0.5),) * 2 for i in range(n) for j in range(i + 1, n)
        }
        return GroupJudgment(support, [3.0 - 0.1 * k for k in range(n)])

    async def turn_outcomes(self, pairs: Sequence[Any]) -> list[float]:
        return [0.5] * len(pairs)


async def _turn(backend: FakeBackend, judge: Any = None, **cfg: Any) -> tuple[list[Any], DoneEvent]:
    counselor = Counselor(backend, judge=judge, config=config(**cfg))
    counselor.start_session(client(), None)
    events = await collect(counselor, "I had an awful week at work.")
    done = events[-1]
    assert isinstance(done, DoneEvent), events
    return events, done


def _shown(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenEvent))


async def test_a_rejected_candidate_that_would_win_is_never_delivered() -> None:
    # Ties everywhere: without the guard the lowest index (the credential claim) wins.
    backend = FakeBackend().script_texts(CREDENTIAL, GOOD, FINE)
    events, done = await _turn(backend)
    assert done.reply == GOOD and _shown(events) == GOOD and not done.fallback
    assert done.group is not None and done.group.delivered == 1
    assert done.group.guard[0] == {
        "admitted": False,
        "rules": ["identity.credential"],
        "reason": output_guard.RULES["identity.credential"],
    }
    assert [v["admitted"] for v in done.group.guard] == [False, True, True]
    assert done.group.rejected == 1


async def test_selection_runs_by_depth_among_the_admitted_only() -> None:
    # 0 (rejected) beats all; 1 > 2 > 3 (3 rejected). Depth among the admitted: 1 over 2.
    wins = {(0, 1): 0.95, (0, 2): 0.95, (0, 3): 0.95, (1, 2): 0.9, (1, 3): 0.9, (2, 3): 0.9}
    backend = FakeBackend().script_texts(CREDENTIAL, GOOD, FINE, DOSING)
    _, done = await _turn(backend, StubJudge(wins), n_candidates=4)
    group = done.group
    assert group is not None and group.delivered == 1 and done.reply == GOOD
    pairs = {(e["winner"], e["loser"]) for e in group.edges}
    # Never preferred: no edge won by 0 or 3; dispreferred: the admitted 1 and 2 beat 3.
    assert pairs == {(1, 2), (1, 3), (2, 3)}
    assert group.admissible


async def test_no_admitted_candidate_gives_the_fallback_and_no_evidence() -> None:
    backend = FakeBackend().script_texts(CREDENTIAL, DOSING, "I'm a real person, not a bot.")
    judge = StubJudge({(0, 1): 0.9})
    events, done = await _turn(backend, judge)
    assert done.reply == output_guard.FALLBACK == _shown(events)
    assert done.fallback and "send your message again" in done.reply
    group = done.group
    assert group is not None and group.delivered is None and group.edges == []
    assert not group.admissible and group.problem == "output guard rejected every candidate"
    assert group.rejected == 3 and judge.calls == 0, "nothing to prefer: the judge is not asked"
    assert not math.isfinite(group.pointwise[0])


async def test_the_next_turn_after_a_fallback_is_answered_normally() -> None:
    backend = FakeBackend().script_texts(CREDENTIAL, DOSING, CREDENTIAL, GOOD, FINE, FINE)
    counselor = Counselor(backend, config=config())
    counselor.start_session(client(), None)
    first = (await collect(counselor, "Hello"))[-1]
    second = (await collect(counselor, "Let me say it another way."))[-1]
    assert first.fallback and second.reply == GOOD and not second.fallback
    assert [t.reply for t in counselor.turns] == [output_guard.FALLBACK, GOOD]


async def test_stream_first_streams_only_sentences_the_guard_passed() -> None:
    text = "That sounds hard. As a licensed therapist, I see this often. What helps?"
    backend = FakeBackend().script_texts(text, GOOD, FINE)
    events, done = await _turn(backend, mode="stream_first")
    shown = _shown(events)
    assert shown == "That sounds hard. " + output_guard.FALLBACK == done.reply
    assert "therapist" not in shown and done.fallback
    tokens = [e.text for e in events if isinstance(e, TokenEvent)]
    assert tokens == ["That sounds hard. ", output_guard.FALLBACK], "sentence by sentence"
    group = done.group
    assert group is not None and group.delivered is None
    assert group.guard[0]["rules"] == ["identity.credential"] and group.guard[1]["admitted"]
    # The others were still judged: their evidence stands, candidate 0 never preferred.
    assert all(e["winner"] != 0 for e in group.edges)


async def test_stream_first_streams_a_clean_reply_in_full() -> None:
    text = "That sounds hard. What helps you on days like this?"
    backend = FakeBackend().script_texts(text, CREDENTIAL, FINE)
    events, done = await _turn(backend, mode="stream_first")
    tokens = [e.text for e in events if isinstance(e, TokenEvent)]
    assert tokens == ["That sounds hard. ", "What helps you on days like this?"]
    assert done.reply == text and not done.fallback and done.group is not None
    assert done.group.delivered == 0 and done.group.guard[1]["rules"] == ["identity.credential"]


async def test_a_foreign_canary_is_rejected_but_the_clients_own_is_not() -> None:
    backend = FakeBackend().script_texts("Noted CANARY-MEM-0a1b2c3d.", GOOD, FINE)
    _, done = await _turn(backend)
    assert done.group is not None and done.group.guard[0]["rules"] == ["data.other_client"]
    backend = FakeBackend().script_texts("Noted CANARY-MEM-0a1b2c3d.", GOOD, FINE)
    counselor = Counselor(backend, config=config())
    counselor.start_session(client(), None)
    # The client's own earlier turn holds it (so it is in this turn's prompt).
    earlier = TurnRecord(0, "note CANARY-MEM-0a1b2c3d", "Noted.", None, None, None, "none", None)
    counselor.restore_turns([earlier])
    own = (await collect(counselor, "Do you still have my note?"))[-1]
    assert own.group.guard[0]["admitted"] and own.reply == "Noted CANARY-MEM-0a1b2c3d."


async def test_the_guard_never_turns_a_backend_failure_into_a_reply() -> None:
    backend = FakeBackend()
    backend.fail_next("generate")
    counselor = Counselor(backend, config=config())
    counselor.start_session(client(), None)
    events = await collect(counselor, "hello")
    assert isinstance(events[-1], ErrorEvent) and events[-1].retryable
    assert counselor.turns == []


def test_no_soca_delivery_also_skips_rejected_candidates() -> None:
    support = {(0, 1): (0.9, 0.9), (0, 2): (0.9, 0.9), (1, 2): (0.2, 0.2)}
    assert soca.raw_delivered(3, support, [0.0, 0.0, 0.0]) == 0
    assert soca.raw_delivered(3, support, [0.0, 0.0, 0.0], admitted=[False, True, True]) == 2


def test_an_edge_over_a_rejected_candidate_lends_no_depth() -> None:
    edges = [soca.Edge(1, 0, 0.8), soca.Edge(2, 3, 0.8)]
    pointwise = [0.0, 1.0, 0.0, 0.0]
    assert soca.select_delivered(4, edges, pointwise) == 1  # depth tie, pointwise decides
    assert soca.select_delivered(4, edges, pointwise, admitted=[False, True, True, True]) == 2


def test_selection_needs_an_admitted_candidate() -> None:
    with pytest.raises(ValueError, match="admitted"):
        soca.select_delivered(2, [], [0.0, 0.0], admitted=[False, False])


async def test_a_candidate_cut_off_by_the_token_limit_is_delivered_to_its_last_sentence() -> None:
    cut = "That sounds really hard. What happened this week? I am here to help you find"
    backend = FakeBackend().script_texts(cut, cut, cut)
    events, done = await _turn(backend)
    assert done.reply == GOOD == _shown(events)
    assert done.group is not None and done.group.candidates == [GOOD] * 3


async def test_stream_first_keeps_the_tail_it_already_showed() -> None:
    cut = "That sounds really hard. What happened this week? I am here to help you find"
    backend = FakeBackend().script_texts(cut, cut, cut)
    events, done = await _turn(backend, mode="stream_first")
    assert done.reply == cut == _shown(events)
