"""Fusion: the rules answer first, the learned layer may only raise their level.

:func:`assess` is what every caller runs on a client message. It asks the reader registry
(:mod:`counselor_engine.safety.registry`) for the served model's verdict; it never knows
which model serves or how it was loaded.
"""

from __future__ import annotations

import logging

from counselor_engine.safety import registry
from counselor_engine.safety.assessment import RANK, SafetyAssessment
from counselor_engine.safety.matcher import rules_assess
from counselor_engine.safety.text import normalise

log = logging.getLogger(__name__)


def assess(text: str) -> SafetyAssessment:
    """Assess one client message: the rules, then the learned layer. Never calls the LLM
    backend, never raises (a non-string or blank message is ``none``: the caller
    validates messages).

    The rules (:func:`rules_assess`) answer first. The crisis model
    (:func:`registry.verdict`) can only raise their level: a message the rules
    missed that the model scores above a threshold becomes concern or crisis with the
    category ``unspecified`` and the rule id ``model.concern`` / ``model.crisis``. When no
    model artifact loads, or the model fails on this message, the rules answer alone and the
    failure is logged.
    """
    ruled = rules_assess(text)
    if not model_may_raise(ruled) or not isinstance(text, str) or not text.strip():
        return ruled
    try:
        learned = registry.verdict(normalise(text))
    except Exception:
        log.exception("crisis model failed on a message; the rules answer alone")
        return ruled
    if learned is None or RANK[learned[0]] <= RANK[ruled.level]:
        return ruled
    level, risk, crisis = learned
    reason = f"{level}: model.{level} (P(risk)={risk:.2f}, P(crisis)={crisis:.2f})"
    categories = ruled.categories or ("unspecified",)
    return SafetyAssessment(
        level, categories, (*ruled.matched, f"model.{level}"), (*ruled.reasons, reason)
    )


_STATED_READING = (
    "negated:",
    "about fiction, news or study:",
    "figure of speech ignored:",
    "reassurance to someone else:",
)


def model_may_raise(ruled: SafetyAssessment) -> bool:
    """Whether the learned layer may raise the rules' verdict.

    Not above crisis, and not where the rules read a risk phrase as negated ("i have no
    wish to die"), as fiction/news/study, or as a figure of speech ("i shot him a message"),
    or read the whole message as comfort to someone else ("you're safe, i'll always be
    there for you"; :func:`modifiers.reassurance_only`) with nothing else found: the
    client's stated meaning beats a bag-of-words guess, which cannot see negation scope or
    idiom.
    """
    if ruled.level == "crisis":
        return False
    return ruled.level != "none" or not any(r.startswith(_STATED_READING) for r in ruled.reasons)
