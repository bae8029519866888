"""The rule layer: match the rules on normalised text and apply the modifiers.

:func:`rules_assess` is pure and fast and never raises. The rules are data
(:mod:`counselor_engine.safety.rules`); the modifiers' vocabulary and tests live in
:mod:`counselor_engine.safety.modifiers`; this module is the algorithm that combines them.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from counselor_engine.safety.assessment import RANK, Level, SafetyAssessment
from counselor_engine.safety.gating import may_match
from counselor_engine.safety.modifiers import (
    ACCIDENT,
    CLAUSE_BREAK,
    CURRENT,
    DENIAL,
    FIRST,
    HARD_SIGNALS,
    HEAVY_FAREWELL,
    HUMOUR,
    MEDIA,
    PAST,
    RESISTED,
    SERIOUS,
    URGE_BEFORE,
    clause_start,
    negated,
    post_negated,
    reassurance_only,
    subject_of,
)
from counselor_engine.safety.rules import IDIOMS, RULES, Rule, Signal
from counselor_engine.safety.text import normalise


@dataclass
class _Hit:
    rule: Rule
    level: Level
    signal: Signal
    notes: list[str]
    history: bool = False
    heavy: bool = False  # a farewell beyond thanks/bye: apology, love, "take care of my ..."


def _hits(norm: str, *, gate: bool = True) -> tuple[list[_Hit], list[str]]:
    reasons: list[str] = []
    media = bool(MEDIA.search(norm))
    text = norm
    for idiom in IDIOMS:
        name, pattern = idiom.name, idiom.pattern
        if gate and not may_match(idiom.needles, text):
            continue

        def _sub(m: re.Match[str], name: str = name, text: str = text) -> str:
            head = text[max(0, m.start() - 40) : m.start()]
            if name == "x_will_kill_me" and re.search(
                r"(?:said|says|told me|threatened|swore|"
                r"promised|keeps saying)\b[^.!?;]*$",
                head,
            ):
                return m.group()
            reasons.append(f"figure of speech ignored: {name}")
            return " _ " * (1 + m.group().count(" "))

        text = pattern.sub(_sub, text)
    hits: list[_Hit] = []
    for rule in RULES:
        if gate and not may_match(rule.needles, text):
            continue
        for m in rule.pattern.finditer(text):
            start = clause_start(text, m.start())
            before = text[start : m.start()]
            after = text[m.end() :]
            notes: list[str] = []
            level, signal = rule.level, rule.signal
            if (
                rule.category == "self_harm"
                and signal == "act"
                and (
                    URGE_BEFORE.search(before)
                    or URGE_BEFORE.search((before + m.group()).rsplit(" ", 1)[0])
                )
            ):
                signal = "urge"
            if re.search(r"\basked (?:me )?(?:if|whether|about)\b", before) and not re.search(
                r"\b(?:said|told (?:him|her|them)) yes\b", after
            ):
                reasons.append(f"reported question: {rule.id}")
                continue
            if rule.negatable and (negated(before) or post_negated(after)):
                # Said of someone else ("my stepdad won't be hurting anyone after tonight"),
                # the negation is no statement of the client's own intent: the hit goes, but
                # the learned layer may still read the message (model_may_raise).
                said_of = "negated of someone else" if subject_of(before) == "third" else "negated"
                reasons.append(f"{said_of}: {rule.id}")
                continue
            clause_end = CLAUSE_BREAK.search(text, m.end())
            clause = text[start : clause_end.start() if clause_end else len(text)]
            if rule.category == "self_harm" and signal == "act" and ACCIDENT.search(clause):
                reasons.append(f"accident, not self-harm: {rule.id}")
                continue
            # A first-person pronoun inside the match ("after i am gone") settles it.
            subject = "first" if FIRST & set(m.group().split()) else subject_of(before)
            if rule.topic and media and subject != "first":
                reasons.append(f"about fiction, news or study: {rule.id}")
                continue
            if rule.subject:
                if subject == "neutral":
                    reasons.append(f"group subject, not a personal statement: {rule.id}")
                    continue
                if subject == "third":
                    if media:
                        reasons.append(f"about fiction, news or study: {rule.id}")
                        continue
                    if level != "none":
                        level, signal = "concern", "third_party"
                        notes.append("someone else is at risk")
            history = False
            if (
                level == "crisis"
                and PAST.search(clause)
                and not CURRENT.search(
                    re.sub(r"\b(?:used to|am better now|i am better)\b", "", clause)
                )
            ):
                level, history = "concern", True
                notes.append("about the past")
            heavy = signal == "farewell" and bool(HEAVY_FAREWELL.search(m.group()))
            hits.append(_Hit(rule, level, signal, notes, history, heavy))
    return hits, reasons


def rules_assess(text: str, *, gate: bool = True) -> SafetyAssessment:
    """The rule layer alone. Pure and fast; never raises.

    1. Normalise (:func:`normalise`) and remove figures of speech.
    2. Match the rules; drop negated hits, accidents and media/study mentions; turn
       someone-else hits into ``third_party`` concern; past-only crisis hits into concern.
    3. Apply stated safety (denial of intent, resisted urges) and humour downgrades.
    4. Escalate accumulated risk (means/timeline/farewell + other evidence; two
       harm-to-others warning signs).
    5. The level is the highest remaining hit.

    ``gate=False`` runs every rule (tests prove gating changes nothing).
    """
    if not isinstance(text, str) or not text.strip():
        return SafetyAssessment("none")
    norm = normalise(text)
    hits, reasons = _hits(norm, gate=gate)
    raw_lower = unicodedata.normalize("NFKC", text).lower()
    humour = bool(HUMOUR.search(raw_lower)) and not SERIOUS.search(norm)
    denial = bool(DENIAL.search(norm))
    resisted = bool(RESISTED.search(norm))
    signals = {h.signal for h in hits}

    for h in hits:
        if (
            h.level == "crisis"
            and denial
            and h.signal in {"intent", "death_wish"}
            and not (signals & HARD_SIGNALS)
        ):
            h.level = "concern"
            h.notes.append("client states they would not act on it")
        if h.level == "crisis" and resisted and h.signal == "urge":
            h.level = "concern"
            h.notes.append("client says they resisted the urge")
        if humour and h.signal not in HARD_SIGNALS and h.level != "none":
            h.level = "concern" if h.level == "crisis" else "none"
            h.notes.append("humour marker")

    current = [h for h in hits if h.level != "none" and not h.history]
    self_risk = [h for h in current if h.rule.category in ("suicide", "self_harm")
                 and h.signal != "third_party"]  # fmt: skip
    # Means or a timeline escalate any other self-risk; a farewell only when it is more than
    # thanks and bye (session ends often say "thank you for everything").
    weak = {h.signal for h in hits if h.level == "none" and h.rule.category != "harm_to_others"
            and (h.signal != "farewell" or h.heavy)}  # fmt: skip
    if weak and self_risk and any(h.level == "concern" for h in self_risk):
        for h in self_risk:
            if h.level == "concern":
                h.level = "crisis"
                h.notes.append("escalated: " + ", ".join(sorted(weak)) + " with other risk")
    farewells = [h for h in hits if h.signal == "farewell"]
    heavy = [h for h in farewells if h.heavy]
    if len(farewells) >= 2 and heavy:
        hits.append(_Hit(farewells[0].rule, "crisis", "goodbye", ["escalated: farewell message"]))
    # Co-occurring warning signs: preparation or finality with any other suicide sign.
    kinds = {h.signal for h in self_risk if h.level == "concern"}
    if kinds & {"preparation", "goodbye"} and len(kinds) >= 2:
        for h in self_risk:
            if h.level == "concern":
                h.level = "crisis"
                h.notes.append("escalated: " + ", ".join(sorted(kinds)))
    others = [h for h in hits if h.rule.category == "harm_to_others" and not h.history
              and h.signal != "threat_received" and h.signal != "third_party"]  # fmt: skip
    other_signals = {h.signal for h in others}
    if other_signals & {"armed", "means"} and other_signals & {
        "targeting",
        "revenge",
        "harm_anger",
    }:
        # A weapon with a named target or revenge talk: a threat even if never said aloud.
        others.append(_Hit(others[0].rule, "concern", "armed", []))
        hits.append(others[-1])
    if len(other_signals) >= 2 and any(h.level == "concern" for h in others):
        for h in others:
            if h.level == "concern":
                h.level = "crisis"
                h.notes.append("escalated: " + ", ".join(sorted(other_signals)))

    level: Level = "none"
    categories: list[str] = []
    matched: list[str] = []
    for h in hits:
        if h.level == "none":
            continue
        if RANK[h.level] > RANK[level]:
            level = h.level
        if h.rule.category not in categories:
            categories.append(h.rule.category)
        if h.rule.id not in matched:
            matched.append(h.rule.id)
            note = f" ({'; '.join(h.notes)})" if h.notes else ""
            reasons.append(f"{h.level}: {h.rule.id} [{h.signal}]{note}")
    if level == "none" and reassurance_only(norm):
        reasons.append("reassurance to someone else: the message comforts another person")
    if level != "none":
        # Categories of the hits that set the level come first.
        top = [h.rule.category for h in hits if h.level == level]
        order = list(categories)
        categories.sort(key=lambda c: (c not in top, order.index(c)))
    return SafetyAssessment(level, tuple(categories), tuple(matched), tuple(reasons))
