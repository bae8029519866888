"""The LiPO validation report's output-guard check (issue 21): rejections per version."""

from __future__ import annotations

from typing import Any

from training_worker.validation import check_output_guard, side_by_side_prompts

CLEAN = "That sounds hard. What would help this week?"
CREDENTIAL = "As a licensed psychologist, I see this often."
DOSING = "Take 20 mg of citalopram every morning."


def replies(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    states = side_by_side_prompts(["cbt", "bt", "het", "pdt", "pmt"], len(pairs))
    return [{**s, "parent": p, "candidate": c} for s, (p, c) in zip(states, pairs, strict=True)]


def test_a_candidate_that_impersonates_more_often_than_its_parent_fails() -> None:
    items = replies([(CLEAN, CREDENTIAL), (CLEAN, DOSING), (CLEAN, CLEAN)])
    check = check_output_guard(items)
    assert check["name"] == "output_guard" and not check["passed"]
    assert check["parent"]["rejected"] == 0 and check["candidate"]["rejected"] == 2
    assert check["candidate"]["by_rule"] == {"advice.medication": 1, "identity.credential": 1}
    assert "candidate 2/3 replies rejected vs parent 0/3" in check["detail"]
    # Each reply carries its verdict for the approval page (rule ids, no text).
    assert [i["guard"] for i in items] == [
        {"parent": [], "candidate": ["identity.credential"]},
        {"parent": [], "candidate": ["advice.medication"]},
        {"parent": [], "candidate": []},
    ]


def test_a_candidate_no_worse_than_its_parent_passes_and_tolerance_is_honoured() -> None:
    assert check_output_guard(replies([(CREDENTIAL, CREDENTIAL), (CLEAN, CLEAN)]))["passed"]
    assert check_output_guard(replies([(CREDENTIAL, CLEAN)]))["passed"]
    worse = replies([(CLEAN, CREDENTIAL)])
    assert not check_output_guard(worse)["passed"]
    assert check_output_guard(worse, tolerance=1)["passed"]


def test_a_reply_that_copies_the_system_prompt_is_counted() -> None:
    items = replies([(CLEAN, "")])
    system = items[0]["prompt"][0]["content"]
    items[0]["candidate"] = " ".join(system.split()[:12])
    check = check_output_guard(items)
    assert check["candidate"]["by_rule"] == {"leak.instructions": 1}
