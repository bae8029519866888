"""Synthetic client profiles for the simulation lab, and an importer for PsychAgent-style JSON.

A profile is the fixed semantic core of a simulated client (the curriculum paper's scenario
x): who the person is, what brings them, their history, the support need they do not state
at first, and a case formulation in the terms of their therapy modality (CBT core beliefs
and automatic thoughts, BT antecedents and consequences, HET incongruence, PDT core
conflict, PMT dominant story and exceptions). ``intent`` is the curriculum's support-intent
key c = h(x). Interaction states change how a profile talks, never what it is.

The 20 built-in profiles (4 per modality) are fictional and were written for this project;
they live in ``counselor_engine/data/sim_profiles.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from counselor_engine.skills import MODALITIES

DATA = Path(__file__).resolve().parent.parent / "data" / "sim_profiles.json"
_TEXT_FIELDS = ("name", "persona", "presenting_problem", "history", "hidden_need", "intent")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,79}$")
MAX_FIELD_CHARS = 2000


@dataclass(frozen=True)
class SimProfile:
    id: str
    modality: str
    name: str
    persona: str
    presenting_problem: str
    history: str
    hidden_need: str
    formulation: dict[str, str] = field(hash=False)
    intent: str
    # The presenting problem in the person's own first-person words (optional: imported
    # profiles may lack it). The simulator anchors its messages on it and falls back to it.
    voice: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID.match(self.id):
            raise ValueError(f"id: expected 1-80 letters, digits or _.:- , got {self.id!r}")
        if self.modality not in MODALITIES:
            raise ValueError(f"modality: expected one of {MODALITIES}, got {self.modality!r}")
        for name in _TEXT_FIELDS:
            _check_text(f"{self.id}.{name}", getattr(self, name))
        if self.voice:
            _check_text(f"{self.id}.voice", self.voice)
        if not isinstance(self.formulation, Mapping) or not self.formulation:
            raise ValueError(f"{self.id}.formulation: expected a non-empty mapping of text")
        for key, value in self.formulation.items():
            _check_text(f"{self.id}.formulation[{key!r}]", key)
            _check_text(f"{self.id}.formulation[{key!r}]", value)
        # A private copy: callers mutating their dict must not change a frozen profile.
        object.__setattr__(self, "formulation", dict(self.formulation))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "modality": self.modality,
            "name": self.name,
            "persona": self.persona,
            "presenting_problem": self.presenting_problem,
            "history": self.history,
            "hidden_need": self.hidden_need,
            "formulation": dict(self.formulation),
            "intent": self.intent,
            **({"voice": self.voice} if self.voice else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SimProfile:
        if not isinstance(data, Mapping):
            raise ValueError("profile: expected a JSON object")
        missing = [k for k in ("id", "modality", *_TEXT_FIELDS, "formulation") if k not in data]
        if missing:
            raise ValueError(f"profile {data.get('id', '?')!r}: missing fields {missing}")
        return cls(
            id=data["id"], modality=data["modality"], name=data["name"],
            persona=data["persona"], presenting_problem=data["presenting_problem"],
            history=data["history"], hidden_need=data["hidden_need"],
            formulation=data["formulation"], intent=data["intent"],
            voice=data.get("voice", ""),
        )  # fmt: skip


def _check_text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}: expected non-empty text")
    if len(value) > MAX_FIELD_CHARS:
        raise ValueError(f"{name}: longer than {MAX_FIELD_CHARS} characters")
    return value


@cache
def builtin_profiles() -> tuple[SimProfile, ...]:
    """The project's 20 synthetic profiles, 4 per modality, in file order."""
    data = json.loads(DATA.read_text(encoding="utf-8"))
    profiles = tuple(SimProfile.from_dict(item) for item in data["profiles"])
    ids = [p.id for p in profiles]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{DATA}: duplicate profile ids")
    return profiles


# --- PsychAgent-style import -----------------------------------------------------------------
# PsychAgent / PsychEval case files are not a published schema we can pin, so we accept the
# field names such files use (and a few common synonyms), first match wins:
_ALIASES: dict[str, tuple[str, ...]] = {
    "id": ("id", "client_id", "case_id", "profile_id"),
    "modality": ("modality", "therapy", "therapy_type", "school", "approach", "orientation"),
    "name": ("name", "client_name", "nickname"),
    "persona": ("persona", "basic_info", "basic_information", "portrait", "profile"),
    "presenting_problem": (
        "presenting_problem",
        "chief_complaint",
        "main_problem",
        "problem",
        "topic_detail",
    ),
    "history": ("history", "background", "growth_experience", "personal_history", "life_history"),
    "hidden_need": ("hidden_need", "core_demand", "support_need", "underlying_need", "goal"),
    "formulation": (
        "formulation",
        "case_conceptualization",
        "conceptualization",
        "cognitive_model",
    ),
    "intent": ("intent", "support_intent", "category", "topic"),
}
# Modality names as such files spell them -> the engine's modality ids.
_MODALITY_WORDS: tuple[tuple[str, str], ...] = (
    ("cognitive", "cbt"), ("cbt", "cbt"), ("sfbt", "pmt"), ("solution", "pmt"),
    ("narrative", "pmt"), ("postmodern", "pmt"), ("humanistic", "het"), ("existential", "het"),
    ("person-cent", "het"), ("client-cent", "het"), ("psychodynamic", "pdt"),
    ("psychoanalytic", "pdt"), ("behavio", "bt"),
)  # fmt: skip
# Formulation keys collected from the top level when no formulation object is given.
_FORMULATION_KEYS = (
    "core_belief", "core_beliefs", "intermediate_belief", "intermediate_beliefs",
    "automatic_thoughts", "triggering_situation", "situation", "coping_strategy",
    "coping_strategies", "target_behaviour", "target_behavior", "antecedents",
    "consequences", "avoidance_pattern", "values", "incongruence", "conditions_of_worth",
    "existential_concern", "felt_sense", "core_conflict", "defenses", "defences",
    "early_relationships", "transference_risk", "dominant_story", "exceptions",
    "preferred_future", "externalized_problem", "resources",
)  # fmt: skip


def import_psychagent(data: str | Path | Mapping[str, Any] | Sequence[Any]) -> list[SimProfile]:
    """Profiles from PsychAgent-style JSON: a path, a JSON string, one object, a list of
    objects, or an object ``{"profiles": [...]}`` (also ``"clients"`` / ``"cases"``).

    Field mapping (first alias present wins; see ``_ALIASES``):

    - id <- id | client_id | case_id | profile_id (default ``psychagent-<n>``)
    - modality <- modality | therapy | therapy_type | school | approach | orientation,
      matched by word ("cognitive behavioral therapy" -> cbt, "humanistic" -> het,
      "psychodynamic" -> pdt, "narrative"/"solution-focused" -> pmt, "behavioral" -> bt)
    - name <- name | client_name | nickname (default: the id)
    - persona <- persona | basic_info | portrait | profile; an object becomes "key: value; ..."
    - presenting_problem <- presenting_problem | chief_complaint | main_problem | problem
    - history <- history | background | growth_experience | personal_history
    - hidden_need <- hidden_need | core_demand | support_need | underlying_need | goal
    - formulation <- formulation | case_conceptualization | conceptualization |
      cognitive_model (an object of text, lists joined with "; "), else the known
      modality keys found at the top level (core_beliefs, automatic_thoughts, core_conflict ...)
    - intent <- intent | support_intent | category | topic (default ``"general"``)

    Any missing required field, unknown modality or non-text value raises ValueError that
    names the record and the field. Duplicate ids are refused.
    """
    records = _records(_load(data))
    profiles = [_convert(record, n) for n, record in enumerate(records)]
    seen: set[str] = set()
    for profile in profiles:
        if profile.id in seen:
            raise ValueError(f"duplicate profile id {profile.id!r}")
        seen.add(profile.id)
    return profiles


def _load(data: Any) -> Any:
    if isinstance(data, Path) or (
        isinstance(data, str) and not data.lstrip().startswith(("{", "["))
    ):
        path = Path(data)
        if not path.is_file():
            raise ValueError(
                f"data: no such file {str(path)!r} (pass JSON text, a path or objects)"
            )
        data = path.read_text(encoding="utf-8")
    if isinstance(data, str):
        try:
            return json.loads(data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"data: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return data


def _records(data: Any) -> list[Mapping[str, Any]]:
    if isinstance(data, Mapping):
        for key in ("profiles", "clients", "cases"):
            if key in data:
                return _records(data[key])
        return [data]
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        if not data:
            raise ValueError("data: no profiles found")
        for n, item in enumerate(data):
            if not isinstance(item, Mapping):
                raise ValueError(f"record {n}: expected a JSON object, got {type(item).__name__}")
        return list(data)
    raise ValueError(f"data: expected JSON objects, got {type(data).__name__}")


def _pick(record: Mapping[str, Any], field_name: str) -> Any:
    for alias in _ALIASES[field_name]:
        if alias in record and record[alias] not in (None, "", [], {}):
            return record[alias]
    return None


def _as_text(where: str, value: Any) -> str:
    if isinstance(value, str):
        return value.strip()
    if (
        isinstance(value, Sequence)
        and not isinstance(value, bytes)
        and all(isinstance(v, str) for v in value)
    ):
        return "; ".join(v.strip() for v in value)
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {_as_text(where, v)}" for k, v in value.items())
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"{where}: expected text, got {type(value).__name__}")


def _modality(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: missing therapy modality (modality/therapy/school)")
    lowered = value.strip().lower()
    if lowered in MODALITIES:
        return lowered
    # Most specific words first: "cognitive behavioral" is cbt, not bt.
    for word, modality in _MODALITY_WORDS:
        if word in lowered:
            return modality
    raise ValueError(f"{where}: unknown therapy modality {value!r}")


def _convert(record: Mapping[str, Any], n: int) -> SimProfile:
    raw_id = _pick(record, "id")
    pid = _as_text(f"record {n}.id", raw_id) if raw_id is not None else f"psychagent-{n}"
    where = f"record {n} ({pid})"
    values: dict[str, Any] = {
        "id": pid,
        "modality": _modality(f"{where}.modality", _pick(record, "modality")),
    }
    for name in ("persona", "presenting_problem", "history", "hidden_need"):
        value = _pick(record, name)
        if value is None:
            raise ValueError(
                f"{where}: missing {name} (accepted keys: {', '.join(_ALIASES[name])})"
            )
        values[name] = _as_text(f"{where}.{name}", value)
    name_value = _pick(record, "name")
    values["name"] = _as_text(f"{where}.name", name_value) if name_value is not None else pid
    intent = _pick(record, "intent")
    values["intent"] = _as_text(f"{where}.intent", intent) if intent is not None else "general"
    values["formulation"] = _formulation(where, record)
    try:
        return SimProfile(**values)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _formulation(where: str, record: Mapping[str, Any]) -> dict[str, str]:
    given = _pick(record, "formulation")
    if given is not None:
        if not isinstance(given, Mapping):
            raise ValueError(f"{where}.formulation: expected an object of text fields")
        found = {str(k): _as_text(f"{where}.formulation.{k}", v) for k, v in given.items()}
    else:
        found = {
            key: _as_text(f"{where}.{key}", record[key])
            for key in _FORMULATION_KEYS
            if key in record and record[key] not in (None, "", [], {})
        }
    found = {k: v for k, v in found.items() if v}
    if not found:
        raise ValueError(
            f"{where}: missing formulation (a 'formulation' object or keys such as "
            "core_beliefs, automatic_thoughts, core_conflict)"
        )
    return found
