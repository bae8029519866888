"""The verdict type every layer of crisis detection speaks: levels and :class:`SafetyAssessment`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["none", "concern", "crisis"]
Category = Literal["suicide", "self_harm", "harm_to_others"]

LEVELS: tuple[Level, ...] = ("none", "concern", "crisis")
RANK = {level: i for i, level in enumerate(LEVELS)}
CATEGORIES: tuple[Category, ...] = ("suicide", "self_harm", "harm_to_others")


@dataclass(frozen=True)
class SafetyAssessment:
    """The verdict on one message.

    ``matched`` holds rule ids for the clinician's alert (never shown to the client);
    ``reasons`` says in words what matched and which modifiers applied.
    """

    level: Level
    categories: tuple[str, ...] = ()
    matched: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def is_crisis(self) -> bool:
        return self.level == "crisis"

    @property
    def needs_flag(self) -> bool:
        """True at concern and crisis: the clinician sees this turn."""
        return self.level != "none"
