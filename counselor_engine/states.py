"""The 54-slot dialogue state used to index the skill table (paper, App. C).

A slot is stage x progress x affect: 3 counseling stages, 3 within-session progress bins and
6 keyword-based affect categories. Slot ids are stable, human-readable strings such as
``core/middle/anxiety``; they are stored in the database, so never rename one.

The affect classifier is a small rule set over English keywords, with negation ("I'm not
anxious") and intensity modifiers ("really", "a bit"). It is deliberately transparent: a
clinician can read why a turn was labelled as it was, and the lexicon is data that can be
extended with :meth:`AffectClassifier.extend`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from counselor_engine import _validate

STAGES: tuple[str, ...] = ("formulation", "core", "consolidation")
"""Problem formulation and goal setting; core intervention; consolidation."""
PROGRESS: tuple[str, ...] = ("early", "middle", "late")
AFFECTS: tuple[str, ...] = ("anxiety", "sadness", "anger", "guilt", "calmness", "positive")
"""``positive`` is the paper's "positive affect"."""

DEFAULT_AFFECT = "calmness"
"""Label for a turn with no affect cue at all: no expressed distress reads as calm/neutral."""

ALL_SLOTS: tuple[str, ...] = tuple(
    f"{stage}/{progress}/{affect}"
    for stage in STAGES
    for progress in PROGRESS
    for affect in AFFECTS
)
"""The 54 slot ids in a fixed order: grouped by stage, then progress, then affect."""


@dataclass(frozen=True)
class State:
    """One of the 54 discrete states."""

    stage: str
    progress: str
    affect: str

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"stage: unknown stage {self.stage!r}; expected one of {STAGES}")
        if self.progress not in PROGRESS:
            raise ValueError(f"progress: unknown bin {self.progress!r}; expected one of {PROGRESS}")
        if self.affect not in AFFECTS:
            raise ValueError(f"affect: unknown category {self.affect!r}; expected one of {AFFECTS}")

    @property
    def slot_id(self) -> str:
        return f"{self.stage}/{self.progress}/{self.affect}"


def parse_slot(slot_id: str) -> State:
    """The state named by ``slot_id``; ValueError for anything not in ``ALL_SLOTS``."""
    if not isinstance(slot_id, str) or slot_id.count("/") != 2:
        raise ValueError(f"slot_id: unknown state slot {slot_id!r}")
    stage, progress, affect = slot_id.split("/")
    try:
        return State(stage, progress, affect)
    except ValueError:
        raise ValueError(f"slot_id: unknown state slot {slot_id!r}") from None


def stage_for(session_index: int, planned_sessions: int) -> str:
    """Counseling stage from the session's place in the planned course.

    ``session_index`` is zero-based. With f = session_index / planned_sessions (the share of
    the course already behind us), the rule is:

    1. formulation: the first session, and any session with f < 0.2;
    2. consolidation: the last planned session, any with f >= 0.8, and sessions beyond
       the plan (the course was extended, so it is in its closing phase);
    3. core: everything else.

    Rule 1 wins over rule 2, so a one-session course is formulation; a two-session course
    is formulation then consolidation; ten sessions give 2 + 6 + 2. Comparisons use integer
    arithmetic, so boundaries are exact.
    """
    index = _validate.integer("session_index", session_index, minimum=0)
    planned = _validate.integer("planned_sessions", planned_sessions, minimum=1)
    if index == 0 or 5 * index < planned:
        return "formulation"
    if index >= planned - 1 or 5 * index >= 4 * planned:
        return "consolidation"
    return "core"


def progress_for(turn_index: int, turn_budget: int) -> str:
    """Within-session progress bin from thresholds 0.33 and 0.66 of the turn budget.

    ``turn_index`` is zero-based, and the fraction is turn_index / turn_budget (the share of
    the budget already used), so with a budget of 3 each bin gets one turn. Turns past the
    budget (a session running over) stay in ``late``.
    """
    index = _validate.integer("turn_index", turn_index, minimum=0)
    budget = _validate.integer("turn_budget", turn_budget, minimum=1)
    if 100 * index < 33 * budget:
        return "early"
    if 100 * index < 66 * budget:
        return "middle"
    return "late"


def encode_state(
    session_index: int, planned_sessions: int, turn_index: int, turn_budget: int, client_text: str
) -> State:
    """The state for one counselor turn: stage, progress bin and the client's affect."""
    return State(
        stage_for(session_index, planned_sessions),
        progress_for(turn_index, turn_budget),
        classify_affect(client_text),
    )


# --- Affect keyword rules ------------------------------------------------------------------


def _phrases(text: str) -> tuple[str, ...]:
    """Comma-separated phrases -> tuple (keeps the lexicon compact and diff-friendly)."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


# A cue is a space-separated word sequence; a word ending in "*" matches any word with that
# prefix. Lower case; apostrophes kept ("can't").
AFFECT_CUES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "anxiety": _phrases(
            "anxi*, worr*, nervous*, panic*, scared, afraid, fear, fears, fearful, frighten*, "
            "terrified, terrifying, stress, stressed, stressful, overwhelm*, tense, tension, "
            "uneasy, dread*, restless, on edge, jittery, apprehensive, can't breathe"
        ),
        "sadness": _phrases(
            "sad, sadness, sadder, depress*, unhappy, hopeless*, empty, lonely, loneliness, "
            "cry, crying, cried, tears, tearful, miserable, grief, griev*, heartbroken, "
            "devastated, despair*, worthless, gloomy, disappointed, feel down, feeling down, "
            "felt down, feel low, feeling low, felt low, numb"
        ),
        "anger": _phrases(
            "angry, anger, angrier, mad at, furious, annoy*, irritat*, frustrat*, resent*, "
            "rage, enraged, livid, pissed, fed up, hate, hostile, outraged, bitter"
        ),
        "guilt": _phrases(
            "guilt*, ashamed, shame*, my fault, blame myself, blaming myself, regret*, "
            "remorse*, embarrass*, i should have, i should've, i shouldn't have, "
            "let them down, let you down, let him down, let her down, let everyone down"
        ),
        "calmness": _phrases(
            "calm*, relax*, peaceful, at peace, at ease, settled, steady, grounded, okay, ok, "
            "fine, alright, all right"
        ),
        "positive": _phrases(
            "happy, happier, happiest, happiness, glad, hopeful, proud, excited, grateful, "
            "thankful, great, wonderful, joy*, relieved, motivated, confident, optimistic, "
            "cheerful, delighted, pleased, encouraged, enjoy*, feel better, feeling better, "
            "felt better, doing better, getting better, feel good, feeling good, felt good"
        ),
    }
)
NEGATORS: frozenset[str] = frozenset(
    _phrases(
        "aint, arent, barely, cannot, cant, couldnt, didnt, doesnt, dont, hardly, hasnt, "
        "havent, isnt, neither, never, no, nor, not, nothing, shouldnt, wasnt, werent, "
        "without, wont, wouldnt"
    )
)  # plus every word ending in "n't"
INTENSIFIERS: frozenset[str] = frozenset(
    _phrases(
        "absolutely, awfully, completely, constantly, deeply, extremely, horribly, incredibly, "
        "insanely, massively, overwhelmingly, really, seriously, so, super, terribly, too, "
        "totally, utterly, very"
    )
)
DOWNTONERS: tuple[str, ...] = _phrases(
    "slightly, somewhat, mildly, kinda, a bit, a little, kind of, sort of"
)

# A negated cue is not evidence for its own category. Negating a distress word ("not
# anxious") is weak evidence of calm; negating calm ("can't relax") suggests anxiety;
# negating positive affect ("not happy") suggests sadness.
NEGATION_TARGETS: Mapping[str, str] = MappingProxyType(
    {
        "anxiety": "calmness",
        "sadness": "calmness",
        "anger": "calmness",
        "guilt": "calmness",
        "calmness": "anxiety",
        "positive": "sadness",
    }
)

NEGATION_WINDOW = 3  # words before a cue in which a negator applies ("don't feel so anxious")
MODIFIER_WINDOW = 2  # words before a cue in which an intensifier or downtoner applies
INTENSIFIED_WEIGHT = 1.5
DOWNTONED_WEIGHT = 0.5
NEGATED_WEIGHT = 0.5

_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)*|[.,;:!?]")
_CLAUSE_BREAKS = frozenset({".", ",", ";", ":", "!", "?", "but", "though", "although", "however"})


def _tokens(text: str) -> list[list[str]]:
    """Lower-cased word tokens, split into clauses (a negator never crosses a clause)."""
    words = _TOKEN.findall(text.lower().replace("\u2019", "'"))
    clauses: list[list[str]] = [[]]
    for word in words:
        if word in _CLAUSE_BREAKS:
            if clauses[-1]:
                clauses.append([])
        else:
            clauses[-1].append(word)
    return [c for c in clauses if c]


def _word_matches(pattern: str, word: str) -> bool:
    if pattern.endswith("*"):
        return word.startswith(pattern[:-1])
    return word == pattern


@dataclass(frozen=True)
class _Cue:
    category: str
    words: tuple[str, ...]

    def matches(self, clause: list[str], start: int) -> bool:
        if start + len(self.words) > len(clause):
            return False
        return all(_word_matches(p, clause[start + k]) for k, p in enumerate(self.words))


@dataclass(frozen=True)
class AffectClassifier:
    """Keyword rules mapping client text to one of the six affect categories.

    Scoring, per clause (split at punctuation and at "but"/"though"/"however"):

    1. Find cues left to right, longest first ("feeling better" before "better").
    2. A cue weighs 1.0; x1.5 after an intensifier ("really anxious") and x0.5 after a
       downtoner ("a bit anxious") within ``MODIFIER_WINDOW`` words.
    3. A negator within ``NEGATION_WINDOW`` words before the cue ("not", "never",
       any "n't") cancels the cue and adds ``NEGATED_WEIGHT`` to the category in
       ``NEGATION_TARGETS`` instead; modifiers are then ignored.
    4. The category with the highest total wins; a tie goes to the category whose cue came
       last (the client's latest words). No cue at all gives ``DEFAULT_AFFECT``.
    """

    cues: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: AFFECT_CUES)
    negators: frozenset[str] = NEGATORS
    intensifiers: frozenset[str] = INTENSIFIERS
    downtoners: tuple[str, ...] = DOWNTONERS
    negation_targets: Mapping[str, str] = field(default_factory=lambda: NEGATION_TARGETS)
    default: str = DEFAULT_AFFECT

    def __post_init__(self) -> None:
        unknown = sorted(set(self.cues) - set(AFFECTS))
        if unknown:
            raise ValueError(f"cues: unknown affect categories {unknown}")
        if self.default not in AFFECTS:
            raise ValueError(f"default: unknown affect category {self.default!r}")

    @cached_property
    def _compiled(self) -> tuple[_Cue, ...]:
        cues = [
            _Cue(category, tuple(phrase.split()))
            for category, phrases in self.cues.items()
            for phrase in phrases
        ]
        return tuple(sorted(cues, key=lambda cue: -len(cue.words)))

    @cached_property
    def _downtoners(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(phrase.split()) for phrase in self.downtoners)

    def extend(self, category: str, *phrases: str) -> AffectClassifier:
        """A copy of this classifier with extra cue phrases for ``category``."""
        if category not in AFFECTS:
            raise ValueError(f"category: unknown affect category {category!r}")
        cues = dict(self.cues)
        cues[category] = (*cues.get(category, ()), *(p.lower() for p in phrases))
        return AffectClassifier(
            cues,
            self.negators,
            self.intensifiers,
            self.downtoners,
            self.negation_targets,
            self.default,
        )

    def _is_negator(self, word: str) -> bool:
        return word in self.negators or word.endswith("n't")

    def _weight(self, clause: list[str], start: int) -> tuple[float, bool]:
        """(intensity multiplier, negated) for a cue starting at ``clause[start]``."""
        before = clause[max(0, start - NEGATION_WINDOW) : start]
        if any(self._is_negator(w) for w in before):
            return NEGATED_WEIGHT, True
        near = clause[max(0, start - MODIFIER_WINDOW) : start]
        weight = 1.0
        if any(w in self.intensifiers for w in near):
            weight *= INTENSIFIED_WEIGHT
        if any(self._ends_with(clause, start, phrase) for phrase in self._downtoners):
            weight *= DOWNTONED_WEIGHT
        return weight, False

    @staticmethod
    def _ends_with(clause: list[str], start: int, phrase: tuple[str, ...]) -> bool:
        """Whether ``phrase`` ends at most one word before ``clause[start]``."""
        for end in (start, start - 1):
            lo = end - len(phrase)
            if lo >= 0 and tuple(clause[lo:end]) == phrase:
                return True
        return False

    def scores(self, text: str) -> dict[str, float]:
        """Evidence per category (all six keys), following the numbered rules above."""
        totals, _ = self._score(text)
        return totals

    def _score(self, text: str) -> tuple[dict[str, float], dict[str, int]]:
        if not isinstance(text, str):
            raise ValueError(f"text: expected a string, got {type(text).__name__}")
        totals = dict.fromkeys(AFFECTS, 0.0)
        last_seen = dict.fromkeys(AFFECTS, -1)
        position = 0
        for clause in _tokens(text):
            start = 0
            while start < len(clause):
                cue = next((c for c in self._compiled if c.matches(clause, start)), None)
                if cue is None:
                    start += 1
                    continue
                weight, negated = self._weight(clause, start)
                category = self.negation_targets.get(cue.category) if negated else cue.category
                if category is not None:
                    totals[category] += weight
                    last_seen[category] = position + start
                start += len(cue.words)
            position += len(clause)
        return totals, last_seen

    def classify(self, text: str) -> str:
        """The winning category (rule 4 of the class docstring)."""
        totals, last_seen = self._score(text)
        best = max(AFFECTS, key=lambda a: (totals[a], last_seen[a]))
        return best if totals[best] > 0.0 else self.default


DEFAULT_CLASSIFIER = AffectClassifier()


def classify_affect(text: str) -> str:
    """One of ``AFFECTS`` for a client's message, by the default keyword rules."""
    return DEFAULT_CLASSIFIER.classify(text)
