"""The crisis rules and figures of speech, read from ``data/safety/rules.toml`` once.

The rules are data: clinicians and reviewers read and change them without reading the
matcher. The file is checked entry by entry at import; a malformed entry stops the import
with a :class:`RuleError` naming the rule and what is wrong, because a crisis detector that
silently skips a rule it could not read is worse than one that does not start.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counselor_engine.safety.assessment import CATEGORIES, LEVELS, Category, Level
from counselor_engine.safety.gating import required_literals

RULES_PATH = Path(__file__).resolve().parents[1] / "data" / "safety" / "rules.toml"

Signal = str
# The clinical signals the matcher knows (the package docstring's table). A rule naming any
# other would match but never take part in the modifiers keyed on signals, so it is refused.
SIGNALS: frozenset[Signal] = frozenset(
    {
        "intent", "death_wish", "method", "plan", "preparation", "goodbye", "burden", "act",
        "urge", "harm_intent", "hopelessness", "history", "third_party", "harm_anger",
        "threat_received", "inquiry", "means", "timeline", "farewell", "armed", "targeting",
        "revenge",
    }
)  # fmt: skip
_FLAGS = {"negatable": True, "subject": True, "topic": False}
_RULE_KEYS = frozenset({"id", "category", "level", "signal", "pattern", *_FLAGS})
_PLACEHOLDER = re.compile(r"\{([A-Z][A-Z_]*)\}")
_RULE_ID = re.compile(r"[a-z_]+\.[a-z_]+")


class RuleError(ValueError):
    """The rules file is malformed; the message names the entry and the problem."""


@dataclass(frozen=True)
class Rule:
    id: str
    category: Category
    level: Level
    signal: Signal
    pattern: re.Pattern[str]
    negatable: bool = True
    subject: bool = True  # nearest subject decides first person vs third party
    topic: bool = False  # drop when the message is about media/study and no "i" is the subject
    needles: frozenset[str] | None = None  # any match contains one of these (None: always run)


@dataclass(frozen=True)
class Idiom:
    """A figure of speech blanked out before the rules run."""

    name: str
    pattern: re.Pattern[str]
    needles: frozenset[str] | None


def _text(value: object, where: str) -> str:
    """A pattern: one string, or a list of strings joined with nothing between."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return "".join(value)
    raise RuleError(f"{where}: pattern must be a string or a non-empty list of strings")


def _expand(pattern: str, vocabulary: dict[str, str], where: str) -> str:
    def insert(m: re.Match[str]) -> str:
        if m.group(1) not in vocabulary:
            raise RuleError(f"{where}: unknown vocabulary name {{{m.group(1)}}}")
        return vocabulary[m.group(1)]

    return _PLACEHOLDER.sub(insert, pattern)


def _compile(pattern: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise RuleError(f"{where}: pattern does not compile: {e}") from None


def _choice(entry: dict[str, Any], key: str, allowed: tuple[str, ...] | frozenset[str],
            where: str) -> str:  # fmt: skip
    value = entry.get(key)
    if value not in allowed:
        raise RuleError(f"{where}: {key} {value!r} is not one of {', '.join(sorted(allowed))}")
    return str(value)


def _rule(entry: object, index: int, vocabulary: dict[str, str], seen: set[str]) -> Rule:
    where = f"rule #{index + 1}"
    if not isinstance(entry, dict):
        raise RuleError(f"{where}: expected a table")
    rule_id = entry.get("id")
    if not isinstance(rule_id, str) or not _RULE_ID.fullmatch(rule_id):
        raise RuleError(f"{where}: id {rule_id!r} is not 'category.name'")
    where = f"rule #{index + 1} {rule_id!r}"
    if rule_id in seen:
        raise RuleError(f"{where}: duplicate id")
    seen.add(rule_id)
    missing = {"category", "level", "signal", "pattern"} - set(entry)
    unknown = set(entry) - _RULE_KEYS
    if missing or unknown:
        raise RuleError(f"{where}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
    flags = {}
    for key, default in _FLAGS.items():
        value = entry.get(key, default)
        if not isinstance(value, bool):
            raise RuleError(f"{where}: {key} must be true or false, got {value!r}")
        flags[key] = value
    compiled = _compile(_expand(_text(entry["pattern"], where), vocabulary, where), where)
    return Rule(
        rule_id,
        _choice(entry, "category", CATEGORIES, where),  # type: ignore[arg-type]
        _choice(entry, "level", LEVELS, where),  # type: ignore[arg-type]
        _choice(entry, "signal", SIGNALS, where),
        compiled,
        needles=required_literals(compiled),
        **flags,
    )


def _idiom(entry: object, index: int, seen: set[str]) -> Idiom:
    where = f"idiom #{index + 1}"
    if not isinstance(entry, dict) or set(entry) != {"name", "pattern"}:
        raise RuleError(f"{where}: expected exactly the keys name and pattern")
    name = entry["name"]
    if not isinstance(name, str) or not name or name in seen:
        raise RuleError(f"{where}: name {name!r} is empty, not a string or a duplicate")
    seen.add(name)
    compiled = _compile(_text(entry["pattern"], f"{where} {name!r}"), f"{where} {name!r}")
    return Idiom(name, compiled, required_literals(compiled))


def parse(data: dict[str, Any]) -> tuple[tuple[Rule, ...], tuple[Idiom, ...]]:
    """Rules and idioms from the parsed file, in file order; :class:`RuleError` on any
    malformed entry. Vocabulary entries may use the ones defined above them."""
    unknown = set(data) - {"vocabulary", "rule", "idiom"}
    if unknown:
        raise RuleError(f"unknown top-level keys {sorted(unknown)}")
    vocabulary: dict[str, str] = {}
    for name, value in data.get("vocabulary", {}).items():
        if not re.fullmatch(r"[A-Z][A-Z_]*", name):
            raise RuleError(f"vocabulary {name!r}: names are upper case")
        where = f"vocabulary {name!r}"
        vocabulary[name] = _expand(_text(value, where), vocabulary, where)
        _compile(vocabulary[name], where)
    rules, idioms = data.get("rule", []), data.get("idiom", [])
    if not isinstance(rules, list) or not rules or not isinstance(idioms, list):
        raise RuleError("expected [[rule]] entries (at least one) and [[idiom]] entries")
    ids: set[str] = set()
    names: set[str] = set()
    return (
        tuple(_rule(entry, i, vocabulary, ids) for i, entry in enumerate(rules)),
        tuple(_idiom(entry, i, names) for i, entry in enumerate(idioms)),
    )


def load(path: Path = RULES_PATH) -> tuple[tuple[Rule, ...], tuple[Idiom, ...]]:
    """:func:`parse` of a rules file; the error names the file too."""
    try:
        return parse(tomllib.loads(path.read_text(encoding="utf-8")))
    except tomllib.TOMLDecodeError as e:
        raise RuleError(f"{path.name}: not valid TOML: {e}") from None
    except RuleError as e:
        raise RuleError(f"{path.name}: {e}") from None


RULES, IDIOMS = load()
