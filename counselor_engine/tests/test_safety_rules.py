"""The rules file (``data/safety/rules.toml``): read once, and refused loudly when malformed.

A crisis detector that skipped a rule it could not read would miss what that rule was
written for without a word; these tests pin the refusal and its message.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pytest

from counselor_engine import safety
from counselor_engine.safety import rules

DATA = tomllib.loads(rules.RULES_PATH.read_text(encoding="utf-8"))


def test_it_loads_every_rule_and_idiom_in_file_order() -> None:
    assert [r.id for r in safety.RULES] == [entry["id"] for entry in DATA["rule"]]
    assert [i.name for i in rules.IDIOMS] == [entry["name"] for entry in DATA["idiom"]]
    assert len({r.id for r in safety.RULES}) == len(safety.RULES)
    assert {r.signal for r in safety.RULES} <= rules.SIGNALS


def test_vocabulary_names_expand_into_the_patterns() -> None:
    rule = next(r for r in safety.RULES if r.id == "suicide.self_kill")
    assert "{KILL}" not in rule.pattern.pattern and "myself|me self" in rule.pattern.pattern
    assert rule.pattern.search("i want to kill myself")


def _broken(change: str) -> dict[str, Any]:
    data = copy.deepcopy(DATA)
    first = data["rule"][0]
    if change == "level":
        first["level"] = "severe"
    elif change == "signal":
        first["signal"] = "intnet"
    elif change == "regex":
        first["pattern"] = "\\b(?:kill myself"
    elif change == "vocabulary":
        first["pattern"] = "{NOPE} myself"
    elif change == "duplicate":
        data["rule"][1]["id"] = first["id"]
    elif change == "unknown_key":
        first["negateable"] = False
    elif change == "flag":
        first["negatable"] = "no"
    elif change == "missing":
        del first["pattern"]
    elif change == "idiom":
        data["idiom"][0]["pattern"] = "(?<=a+)b"
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("level", r"rule #1 'suicide.self_kill': level 'severe' is not one of concern, crisis"),
        ("signal", r"rule #1 'suicide.self_kill': signal 'intnet' is not one of"),
        ("regex", r"rule #1 'suicide.self_kill': pattern does not compile"),
        ("vocabulary", r"rule #1 'suicide.self_kill': unknown vocabulary name \{NOPE\}"),
        ("duplicate", r"rule #2 'suicide.self_kill': duplicate id"),
        ("unknown_key", r"unknown keys \['negateable'\]"),
        ("flag", r"negatable must be true or false"),
        ("missing", r"missing keys \['pattern'\]"),
        ("idiom", r"idiom #1 'killing_me': pattern does not compile"),
    ],
)
def test_a_malformed_rule_is_refused_with_its_id_and_the_problem(change: str, message: str) -> None:
    with pytest.raises(rules.RuleError, match=message):
        rules.parse(_broken(change))


def test_the_file_name_is_in_the_error(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(rules.RULES_PATH.read_text(encoding="utf-8").replace(
        'level = "crisis"', 'level = "critical"', 1
    ), encoding="utf-8")  # fmt: skip
    with pytest.raises(rules.RuleError, match=r"^rules\.toml: rule #1 .*'critical'"):
        rules.load(path)
    path.write_text("[[rule]\n", encoding="utf-8")
    with pytest.raises(rules.RuleError, match=r"rules\.toml: not valid TOML"):
        rules.load(path)
