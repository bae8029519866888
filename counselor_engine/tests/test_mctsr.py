"""MCTSr-Zero (seed 002, section 4): the equations, the search on scripted scores, and a
counselor turn with candidate_strategy="mctsr"."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from counselor_engine.backends.base import ChatMessage, GenerationParams, Prompt
from counselor_engine.counselor import (
    ClientState,
    Counselor,
    CounselorConfig,
    DoneEvent,
    ErrorEvent,
    TokenEvent,
)
from counselor_engine.embeddings import HashingEmbedder
from counselor_engine.judge import JudgeContext
from counselor_engine.mctsr import (
    SCORE_DIGITS,
    MctsrConfig,
    MctsrSearch,
    SearchResult,
    adopt_candidate,
    backprop_value,
    default_standards,
    default_views,
    expected_score,
    q_value,
    root_value,
    uct,
)
from counselor_engine.memory import MemoryStore
from counselor_engine.tests.fakes import FakeBackend

K = 10.0 / 9.0  # digit d read from the 0-9 distribution is worth d * 10/9 on the 0-10 scale
PROMPT = [ChatMessage("system", "You are a counselor."), ChatMessage("user", "I feel stuck.")]
CONTEXT = JudgeContext((), "I feel stuck.", "Reflection", "Reflect feelings.")
PARAMS = GenerationParams(max_new_tokens=8)


# --- a backend whose self-evaluation scores are scripted by reply text ---------------------
class ScoringBackend(FakeBackend):
    """Rates each (reply, view, standard) prompt with a one-hot digit from ``digit``;
    ``digit(reply, view_index, standard_name)`` may also return a row (e.g. NaNs)."""

    def __init__(
        self,
        texts: Sequence[str] = (),
        *,
        digit: Callable[[str, int, str], int | list[float]],
        responder: Callable[[Prompt, int], str] | None = None,
    ) -> None:
        super().__init__(texts, responder=responder)
        self.digit = digit
        self.views = default_views()

    async def choice_probabilities(self, prompts, choices, *, adapter=None):  # type: ignore[no-untyped-def]
        await self._enter("choice_probabilities", prompts=prompts, choices=choices, adapter=adapter)
        assert tuple(choices) == SCORE_DIGITS
        rows = []
        for prompt in prompts:
            system, user = prompt[0].content, prompt[1].content
            reply = re.search(r"<reply>\n(.*)\n</reply>", user, re.S).group(1)  # type: ignore[union-attr]
            standard = re.search(r"Standard: (.*?)\. ", user).group(1)  # type: ignore[union-attr]
            view = next(i for i, v in enumerate(self.views) if system.startswith(v))
            d = self.digit(reply, view, standard)
            rows.append(d if isinstance(d, list) else [float(k == d) for k in range(10)])
        return rows


def by_text(table: dict[str, int], default: int = 5) -> Callable[[str, int, str], int]:
    return lambda reply, view, standard: table.get(reply, default)


def is_refine(prompt: Prompt) -> bool:
    return "<draft>" in prompt[0].content


def is_rewrite(prompt: Prompt) -> bool:
    return prompt[0].content.startswith("You write short guidance")


def run(backend: FakeBackend, n: int = 2, **config: object) -> SearchResult:
    search = MctsrSearch(backend, MctsrConfig(**config))  # type: ignore[arg-type]
    return asyncio.run(search.run(PROMPT, CONTEXT, n, PARAMS))


# --- the equations, against numbers computed by hand ----------------------------------------
def test_it_reads_a_score_as_the_expected_digit_on_the_papers_0_to_10_scale() -> None:
    assert expected_score([0.0] * 9 + [1.0]) == pytest.approx(10.0)
    assert expected_score([1.0] + [0.0] * 9) == 0.0
    assert expected_score([0.1] * 10) == pytest.approx(5.0)  # E = 4.5 -> 4.5 * 10/9
    # Unnormalised rows are renormalised: E = (0*1 + 1*1) / 2 = 0.5 -> 0.5 * 10/9.
    assert expected_score([1.0, 1.0] + [0.0] * 8) == pytest.approx(5.0 / 9.0)
    assert math.isnan(expected_score([0.0] * 10))
    assert math.isnan(expected_score([math.nan] + [0.1] * 9))
    with pytest.raises(ValueError, match="expected 10"):
        expected_score([0.5, 0.5])


def test_eq4_is_half_of_min_plus_mean() -> None:
    assert q_value([6.0, 8.0, 10.0]) == pytest.approx(7.0)  # (6 + 8) / 2
    assert q_value([4.0]) == 4.0
    assert q_value([10 / 3, 10.0]) == pytest.approx(5.0)  # (10/3 + 20/3) / 2
    for bad in ([], [math.nan], [1.0, math.inf]):
        with pytest.raises(ValueError, match="samples"):
            q_value(bad)


def test_eq5_moves_a_parent_halfway_to_its_best_child() -> None:
    assert backprop_value(4.0, [6.0, 9.0]) == pytest.approx(6.5)
    assert backprop_value(8.0, [2.0]) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="child_qs"):
        backprop_value(4.0, [])


def test_eq6_root_is_the_mean_of_its_children() -> None:
    assert root_value([3.0, 5.0, 10.0]) == pytest.approx(6.0)
    with pytest.raises(ValueError, match="initial_qs"):
        root_value([])


def test_eq7_uct_by_hand() -> None:
    # 5 + 2.8 * sqrt(ln(7 + 1) / (2 + 1e-6)) = 5 + 2.8 * sqrt(2.0794415 / 2) = 7.855075
    assert uct(5.0, 2, 7, c=2.8, epsilon=1e-6) == pytest.approx(7.855075, abs=1e-5)
    assert uct(5.0, 2, 7, c=0.0, epsilon=1e-6) == 5.0
    # ln(0 + 1) = 0: a parent never visited gives no bonus.
    assert uct(3.0, 1, 0, c=2.8, epsilon=1e-6) == 3.0
    with pytest.raises(ValueError, match="visits"):
        uct(1.0, -1, 3, c=1.0, epsilon=1e-6)
    with pytest.raises(ValueError, match="epsilon"):
        uct(1.0, 1, 3, c=1.0, epsilon=0.0)


def test_eq3_adopts_a_candidate_meta_prompt_at_equal_quality() -> None:
    assert adopt_candidate(5.0, 5.0) is True  # the equation's >=, not the prose's >
    assert adopt_candidate(6.0, 5.0) is True
    assert adopt_candidate(4.99, 5.0) is False


# --- properties ----------------------------------------------------------------------------
scores = st.floats(0.0, 10.0, allow_nan=False)


@given(st.lists(scores, min_size=1, max_size=12))
def test_q_lies_between_the_worst_sample_and_the_mean(samples: list[float]) -> None:
    q = q_value(samples)
    mean = sum(samples) / len(samples)
    assert min(samples) - 1e-9 <= q <= mean + 1e-9
    assert 0.0 <= q <= 10.0


@given(st.lists(st.floats(0.0, 1.0), min_size=10, max_size=10).filter(lambda r: sum(r) > 1e-6))
def test_a_read_score_stays_on_the_scale(row: list[float]) -> None:
    assert 0.0 <= expected_score(row) <= 10.0 + 1e-9


@given(scores, st.lists(scores, min_size=1, max_size=6))
def test_backpropagation_lands_between_parent_and_best_child(q: float, kids: list[float]) -> None:
    new = backprop_value(q, kids)
    assert min(q, max(kids)) - 1e-9 <= new <= max(q, max(kids)) + 1e-9


@given(scores, scores, st.integers(1, 200), st.integers(1, 500), st.floats(0.01, 10.0))
def test_uct_prefers_higher_value_and_fewer_visits(
    q1: float, q2: float, visits: int, parent: int, c: float
) -> None:
    lo, hi = sorted((q1, q2))
    assert uct(lo, visits, parent, c=c, epsilon=1e-6) <= uct(hi, visits, parent, c=c, epsilon=1e-6)
    assert uct(q1, visits + 1, parent, c=c, epsilon=1e-6) < uct(
        q1, visits, parent, c=c, epsilon=1e-6
    )
    # An unvisited node (N = 0) beats any visited one: the bonus is c * sqrt(ln(N+1)/eps).
    assert uct(0.0, 0, parent, c=max(c, 1.0), epsilon=1e-6) > uct(
        10.0, visits, parent, c=max(c, 1.0), epsilon=1e-6
    )


@settings(max_examples=40, deadline=None)
@given(
    max_calls=st.integers(2, 16),
    n=st.integers(1, 3),
    c=st.floats(0.0, 5.0),
    digits=st.lists(st.integers(0, 9), min_size=1, max_size=8),
)
def test_the_search_never_exceeds_its_call_budget_and_keeps_a_consistent_tree(
    max_calls: int, n: int, c: float, digits: list[int]
) -> None:
    def digit(reply: str, view: int, standard: str) -> int:
        return digits[(sum(map(ord, reply)) + view) % len(digits)]

    backend = ScoringBackend(digit=digit)
    result = run(backend, n=n, max_calls=max_calls, c=c)
    spent = sum(backend.calls.values())
    assert spent == result.calls_used <= max_calls
    assert max_calls - spent <= 1  # stopped only when not even a refinement fit
    assert result.stop_reason == "budget"
    nodes = result.nodes
    for node in nodes:  # N(a) is the size of a's subtree
        below = [m for m in nodes if _is_below(nodes, m.id, node.id)]
        assert node.visits == 1 + len(below)
        assert 0.0 <= node.q <= 10.0
    initial = [m for m in nodes if m.parent is None]
    assert result.root_visits == len(nodes)
    assert result.root_q == pytest.approx(sum(m.q for m in initial) / len(initial))
    assert len(result.chosen) == n == len(set(result.chosen))
    json.dumps(result.to_dict(), allow_nan=False)


def _is_below(nodes, node_id: int, ancestor: int) -> bool:  # type: ignore[no-untyped-def]
    parent = nodes[node_id].parent
    while parent is not None:
        if parent == ancestor:
            return True
        parent = nodes[parent].parent
    return False


# --- the search on scripted scores ---------------------------------------------------------
def test_eq4_samples_are_evaluator_views_and_q_takes_the_worst_one() -> None:
    backend = ScoringBackend(["A0"], digit=lambda reply, view, s: 9 if view == 0 else 3)
    result = run(backend, n=1, max_calls=2, eval_samples=2)
    (node,) = result.nodes
    assert node.samples == pytest.approx([10.0, 10.0 / 3.0])
    assert node.q == pytest.approx(5.0)  # (10/3 + 20/3) / 2
    assert result.root_q == pytest.approx(5.0)  # Eq. 6 with one child: Q(P) = Q(A_0)
    assert backend.calls == {"generate": 1, "choice_probabilities": 1}
    (scored,) = [e for m, e in backend.log if m == "choice_probabilities"]
    assert len(scored["prompts"]) == 2 * 16 and scored["adapter"] is None


def test_greedy_search_refines_the_best_node_and_backpropagates_by_hand() -> None:
    """c = 0 makes UCT = Q, so the tree is known in advance:
    init A0 = 3k, A1 = 6k, Q(P) = 4.5k; iteration 1 refines A1 into R1 = 9k, then
    Q(A1) = (6k + 9k)/2 = 7.5k and Q(P) = (3k + 7.5k)/2 = 5.25k; iteration 2 refines R1
    (9k, the highest) into R2 = 2k, then Q(R1) = (9k + 2k)/2 = 5.5k,
    Q(A1) = (7.5k + 5.5k)/2 = 6.5k, Q(P) = (3k + 6.5k)/2 = 4.75k; one call is left."""
    refined = iter(["R1", "R2"])
    backend = ScoringBackend(
        ["A0", "A1"],
        digit=by_text({"A0": 3, "A1": 6, "R1": 9, "R2": 2}),
        responder=lambda prompt, i: next(refined),
    )
    result = run(backend, n=2, max_calls=7, c=0.0, eval_samples=1)
    a0, a1, r1, r2 = result.nodes
    assert [n.text for n in result.nodes] == ["A0", "A1", "R1", "R2"]
    assert (r1.parent, r2.parent) == (1, 2)
    assert [it.selected for it in result.iterations] == ["1", "2"]
    assert [it.action for it in result.iterations] == ["refine", "refine"]
    assert result.iterations[0].uct == pytest.approx({"P": 4.5 * K, "0": 3 * K, "1": 6 * K})
    assert result.iterations[0].q_root_before == pytest.approx(4.5 * K)
    assert a0.q == pytest.approx(3 * K) and r2.q == pytest.approx(2 * K)
    assert r1.q == pytest.approx(5.5 * K) and r1.q_eval == pytest.approx(9 * K)
    assert a1.q == pytest.approx(6.5 * K)
    assert result.root_q == pytest.approx(4.75 * K)
    assert [n.visits for n in result.nodes] == [1, 3, 2, 1]
    assert result.root_visits == 4
    assert (result.calls_used, result.stop_reason) == (6, "budget")
    assert result.chosen == [1, 2]  # 6.5k and 5.5k
    assert result.to_dict()["q_values"] == pytest.approx([6.5 * K, 5.5 * K])


def test_refinement_sees_the_draft_its_weakest_standards_and_the_active_meta_prompt() -> None:
    def digit(reply: str, view: int, standard: str) -> int:
        if reply == "A0":
            return {"Warmth": 1, "Pacing": 2}.get(standard, 8)
        return 9

    backend = ScoringBackend(["A0"], digit=digit)
    run(backend, n=1, max_calls=4, c=0.0, eval_samples=1, feedback_standards=2)
    refine = [p for p in backend.prompts if is_refine(p)]
    assert len(refine) == 1
    system = refine[0][0].content
    assert "<draft>\nA0\n</draft>" in system
    warmth = next(s for s in default_standards() if s.id == "warmth")
    assert f"- Warmth (scored {K:.1f}/10): {warmth.suggestion}" in system
    assert "Pacing (scored" in system and "Concern (scored" not in system
    assert "Guidance for this reply:\nBefore replying" in system  # m_0 is active
    assert refine[0][1:] == PROMPT[1:]  # the conversation itself is unchanged


def test_regeneration_adopts_a_better_meta_prompt() -> None:
    """Equal initial Q and equal bonuses: the tie goes to P (regeneration). The new reply
    G scores 8k >= Q(P) = 5k, so m_cand becomes active (Eq. 3); then Q(P) = (5+5+8)k/3."""

    def responder(prompt: Prompt, i: int) -> str:
        return "Name the feeling first." if is_rewrite(prompt) else "G"

    backend = ScoringBackend(["A0", "A1"], digit=by_text({"G": 8}, default=5), responder=responder)
    result = run(backend, n=2, max_calls=5, c=1.0, eval_samples=1)
    (it,) = result.iterations
    assert (it.selected, it.action, it.adopted) == ("P", "regenerate", True)
    assert it.q_root_before == pytest.approx(5 * K)
    assert result.meta_prompts[1] == "Name the feeling first."
    assert result.active_meta == 1
    g = result.nodes[2]
    assert (g.parent, g.kind, g.meta, g.q) == (None, "regenerate", 1, pytest.approx(8 * K))
    assert result.root_q == pytest.approx(6 * K)
    assert (result.root_visits, result.root_expansions) == (3, 2)
    # Eq. 2 was fed the active meta-prompt and the feedback of the latest initial reply.
    (rewrite,) = [p for p in backend.prompts if is_rewrite(p)]
    assert "Before replying" in rewrite[1].content and "(scored 5.6/10)" in rewrite[1].content
    # A_{t+1} = M(P || m_cand).
    last = [e["prompt"] for m, e in backend.log if m == "generate"][-1]
    assert "Guidance for this reply:\nName the feeling first." in last[0].content


def test_regeneration_keeps_the_meta_prompt_when_the_new_reply_is_worse() -> None:
    backend = ScoringBackend(
        ["A0", "A1"],
        digit=by_text({"G": 2}, default=5),
        responder=lambda p, i: "   " if is_rewrite(p) else "G",
    )
    result = run(backend, n=2, max_calls=5, c=1.0, eval_samples=1)
    assert result.iterations[0].adopted is False
    assert result.active_meta == 0
    # The model wrote nothing usable: the feedback is folded into the guidance verbatim.
    assert result.meta_prompts[1].startswith(result.meta_prompts[0])
    assert "(scored 5.6/10)" in result.meta_prompts[1]


def test_selection_only_considers_what_the_budget_can_pay_for() -> None:
    # 2 calls left after initialisation: a regeneration (3 calls) is not on offer.
    backend = ScoringBackend(["A0", "A1"], digit=by_text({}, default=5))
    result = run(backend, n=2, max_calls=4, c=1.0)
    (it,) = result.iterations
    assert "P" not in it.uct and it.action == "refine"
    assert result.calls_used == 4


def test_it_stops_at_max_iterations_and_at_the_quality_threshold() -> None:
    backend = ScoringBackend(digit=by_text({}, default=5))
    assert run(backend, max_calls=20, max_iterations=0).stop_reason == "max_iterations"
    assert backend.calls == {"generate": 1, "choice_probabilities": 1}
    backend = ScoringBackend(digit=by_text({}, default=9))
    result = run(backend, max_calls=20, q_threshold=9.5)
    assert (result.stop_reason, result.iterations) == ("q_threshold", [])


def test_the_final_candidates_are_the_best_distinct_texts() -> None:
    backend = ScoringBackend(["same", "same", "other"], digit=by_text({"same": 9, "other": 1}))
    result = run(backend, n=3, max_calls=2)
    assert result.candidates == ["same", "other", "same"]  # distinct texts first
    assert result.chosen == [0, 2, 1]
    backend = ScoringBackend(["same", "same"], digit=by_text({}))
    assert run(backend, n=2, max_calls=2).candidates == ["same", "same"]  # nothing else


def test_a_non_finite_reading_gives_q_zero_and_is_recorded() -> None:
    backend = ScoringBackend(
        ["bad", "good"],
        digit=lambda r, v, s: [math.nan] * 10 if r == "bad" else 7,
    )
    result = run(backend, n=2, max_calls=2)
    bad = result.nodes[0]
    assert (bad.q, bad.problem) == (0.0, "non-finite self-evaluation")
    assert result.candidates == ["good", "bad"]
    json.dumps(result.to_dict(), allow_nan=False)


def test_seeded_runs_give_each_call_its_own_reproducible_seed() -> None:
    def seeds() -> list[int | None]:
        backend = ScoringBackend(digit=by_text({}))
        search = MctsrSearch(backend, MctsrConfig(max_calls=8))
        asyncio.run(search.run(PROMPT, CONTEXT, 2, GenerationParams(seed=11)))
        return [e["params"].seed for m, e in backend.log if m == "generate"]

    first = seeds()
    assert len(first) >= 3 and len(set(first)) == len(first)
    assert first == seeds()


def test_backend_failures_and_timeouts_propagate() -> None:
    from counselor_engine.backends.base import BackendError

    backend = ScoringBackend(digit=by_text({})).fail_next("choice_probabilities")
    with pytest.raises(BackendError):
        run(backend)
    slow = ScoringBackend(digit=by_text({}))
    slow.delay = 0.2
    search = MctsrSearch(slow, MctsrConfig(), timeout_s=0.01)
    with pytest.raises(TimeoutError):
        asyncio.run(search.run(PROMPT, CONTEXT, 2, PARAMS))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("c", -1.0, "mctsr.c"),
        ("c", math.nan, "mctsr.c"),
        ("epsilon", 0.0, "mctsr.epsilon"),
        ("max_calls", 1, "mctsr.max_calls"),
        ("max_iterations", -1, "mctsr.max_iterations"),
        ("eval_samples", 0, "mctsr.eval_samples"),
        ("eval_samples", 99, "mctsr.eval_samples"),
        ("feedback_standards", 17, "mctsr.feedback_standards"),
        ("q_threshold", 11.0, "mctsr.q_threshold"),
        ("meta_max_new_tokens", 0, "meta_max_new_tokens"),
        ("context_chars", 0, "context_chars"),
    ],
)
def test_bad_search_settings_are_refused_by_name(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        MctsrConfig(**{field: value})  # type: ignore[arg-type]


def test_bad_counselor_strategy_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="candidate_strategy"):
        CounselorConfig(candidate_strategy="beam")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="MctsrConfig"):
        CounselorConfig(candidate_strategy="mctsr", mctsr={"c": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stream_first"):
        CounselorConfig(candidate_strategy="mctsr", mode="stream_first")
    with pytest.raises(ValueError, match="n: at least one"):
        run(ScoringBackend(digit=by_text({})), n=0)


def test_the_standards_are_sixteen_and_complete() -> None:
    standards = default_standards()
    assert len(standards) == 16 == len({s.id for s in standards})
    assert all(s.name and s.description and s.suggestion for s in standards)
    assert len(default_views()) >= 2


# --- the counselor ------------------------------------------------------------------------
FAST = GenerationParams(max_new_tokens=10, temperature=0.9, top_p=0.95)


def _client() -> ClientState:
    return ClientState("client-1", "cbt", 0, 4, memory=MemoryStore(embedder=HashingEmbedder()))


async def _turn(counselor: Counselor, message: str) -> list:  # type: ignore[type-arg]
    return [event async for event in counselor.respond(message)]


async def test_an_mctsr_turn_judges_the_searched_candidates_and_records_the_tree() -> None:
    backend = FakeBackend()
    config = CounselorConfig(
        n_candidates=3, generation=FAST, seed=3, candidate_strategy="mctsr",
        mctsr=MctsrConfig(max_calls=6, eval_samples=1),
    )  # fmt: skip
    counselor = Counselor(backend, config=config)
    counselor.start_session(_client(), "v1")
    events = await _turn(counselor, "I keep worrying about my exams")
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.group is not None
    group = done.group
    search = group.search
    assert search is not None and search["strategy"] == "mctsr"
    assert search["calls_used"] <= 6 and search["node_count"] >= 3
    assert group.candidates == [search["nodes"][i]["text"] for i in search["chosen"]]
    assert len(group.support) == 3  # the judge compared every pair of searched candidates
    assert done.reply == group.candidates[group.delivered]
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == done.reply
    # The evidence keeps the plain counselor prompt, never a meta-prompt or a draft.
    assert all("Guidance for this reply" not in m["content"] for m in group.prompt)
    json.dumps(group.to_dict(), allow_nan=False)
    generated = [e for m, e in backend.log if m == "generate"]
    assert {e["adapter"] for e in generated} == {"v1"}  # drafts under the pinned adapter
    scored = [e for m, e in backend.log if m == "choice_probabilities"]
    assert {e["adapter"] for e in scored} == {None}  # the base model grades them
    # Search calls plus the judge's two (pointwise, pairwise) and nothing else.
    assert sum(backend.calls.values()) == search["calls_used"] + 2


async def test_a_failing_backend_mid_search_is_a_clean_retryable_error() -> None:
    backend = FakeBackend().fail_next("choice_probabilities")
    config = CounselorConfig(n_candidates=2, generation=FAST, candidate_strategy="mctsr")
    counselor = Counselor(backend, config=config)
    counselor.start_session(_client(), None)
    events = await _turn(counselor, "I feel low today")
    assert isinstance(events[-1], ErrorEvent) and events[-1].retryable
    assert counselor.turns == []
    events = await _turn(counselor, "I feel low today")
    assert isinstance(events[-1], DoneEvent)


async def test_a_sample_turn_carries_no_search_record() -> None:
    counselor = Counselor(FakeBackend(), config=CounselorConfig(n_candidates=2, generation=FAST))
    counselor.start_session(_client(), None)
    done = (await _turn(counselor, "hello there"))[-1]
    assert isinstance(done, DoneEvent) and done.group is not None
    assert done.group.search is None


async def test_an_mctsr_turn_on_the_tiny_model(tiny_backend) -> None:  # type: ignore[no-untyped-def]
    config = CounselorConfig(
        n_candidates=3, generation=FAST, seed=5, candidate_strategy="mctsr",
        mctsr=MctsrConfig(max_calls=6, eval_samples=1),
    )  # fmt: skip
    counselor = Counselor(tiny_backend, config=config)
    counselor.start_session(_client(), None)
    events = await _turn(counselor, "I have been anxious about work")
    done = events[-1]
    assert isinstance(done, DoneEvent), events[-1]
    group = done.group
    assert group is not None and group.search is not None
    search = group.search
    assert search["node_count"] >= 3 and search["calls_used"] <= 6
    assert all(0.0 <= q <= 10.0 for q in search["q_values"])
    assert search["q_values"] == sorted(search["q_values"], reverse=True)
    assert len(group.candidates) == 3 and done.reply in group.candidates
    json.dumps(group.to_dict(), allow_nan=False)


def test_the_cli_chats_with_mctsr_and_replays_identically(tiny_model_path, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    save = tmp_path / "session.json"
    common = ["--model", str(tiny_model_path)]
    args = ["--n", "2", "--max-new-tokens", "8", "--seed", "3", "--strategy", "mctsr"]
    chat = subprocess.run(
        [sys.executable, "-m", "counselor_engine", "chat", *args, "--save", str(save),
         "--client-file", str(tmp_path / "client.json"), *common],
        input="I feel stuck\n", capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert chat.returncode == 0, chat.stderr
    assert json.loads(save.read_text())["strategy"] == "mctsr"
    replay = subprocess.run(
        [sys.executable, "-m", "counselor_engine", "replay", str(save), *common],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    assert "replay identical" in replay.stderr
