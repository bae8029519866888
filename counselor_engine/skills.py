"""Skill taxonomy (six skills per modality) and the shared skill-prior table Q(s, a).

The taxonomy is this project's own plain-English description of common techniques in five
therapy modalities. ``instruction`` is the text the response generator receives when HBSP
selects the skill. The prior table is read-only during interaction (paper, Sec. 2.2); only
the client-private residuals in :mod:`counselor_engine.hbsp` learn.

Build a table from any skill-labelled corpus with::

    python -m counselor_engine.skills build-prior IN.jsonl OUT.json [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from counselor_engine import _validate
from counselor_engine.states import ALL_SLOTS, State

MODALITIES: tuple[str, ...] = ("cbt", "bt", "het", "pdt", "pmt")
"""CBT, behavioural, humanistic-existential, psychodynamic and postmodern therapy."""

PRIOR_FORMAT = "psyevo.prior-table/1"


@dataclass(frozen=True)
class Skill:
    """One counseling skill of one modality."""

    id: str
    modality: str
    name: str
    description: str
    instruction: str


def _skill(skill_id: str, name: str, description: str, instruction: str) -> Skill:
    modality = skill_id.rstrip("0123456789").lower()
    return Skill(skill_id, modality, name, " ".join(description.split()), instruction)


_TAXONOMY: tuple[Skill, ...] = (
    # --- Cognitive behavioural therapy -------------------------------------------------
    _skill(
        "CBT1",
        "Collaborative agenda and goals",
        """Counselor and client agree on what the session will cover and turn broad
        distress into specific, observable goals. Shared structure keeps sessions focused
        and makes later progress visible to both.""",
        "Invite the client to agree on one or two topics for today and help them phrase "
        "a concrete, achievable goal in their own words.",
    ),
    _skill(
        "CBT2",
        "Identifying automatic thoughts",
        """Helps the client notice the quick, evaluative thoughts that appear in a
        distressing moment and separate them from the situation and the feeling. Naming the
        thought is the first step before it can be examined.""",
        "Ask about a recent upsetting moment and gently help the client name the thought "
        "that went through their mind, separating situation, thought and feeling.",
    ),
    _skill(
        "CBT3",
        "Examining and reframing thoughts",
        """Guided questioning that weighs the evidence for and against a distressing
        thought and looks for a more balanced alternative. The aim is accuracy, not forced
        positivity.""",
        "Use one or two open questions to help the client weigh the evidence for a "
        "distressing thought and consider a more balanced way of seeing it; do not argue.",
    ),
    _skill(
        "CBT4",
        "Planning a behavioural experiment",
        """Turns a belief into a prediction that the client can test in daily life, then
        plans the test and how the result will be judged. Experience often shifts a belief
        more than discussion does.""",
        "Help the client turn a worry or belief into a specific prediction and plan a small, "
        "safe real-life test of it, including how they will notice the result.",
    ),
    _skill(
        "CBT5",
        "Explaining the cognitive model",
        """Brief psychoeducation on how situations, thoughts, feelings, body sensations
        and actions influence one another, illustrated with the client's own example.
        Understanding the model gives the client a reason to try the later techniques.""",
        "Briefly explain, using the client's own recent example, how thoughts, feelings, "
        "body sensations and actions affect one another; check that it makes sense to them.",
    ),
    _skill(
        "CBT6",
        "Action plan and relapse prevention",
        """Summarises what was learned, agrees on practice between sessions and prepares
        for setbacks by naming early warning signs and coping steps. Consolidates gains so
        they last beyond counseling.""",
        "Summarise what the client has found helpful, agree on one practice task before "
        "next time, and ask what early warning signs and coping steps they want to remember.",
    ),
    # --- Behavioural therapy ------------------------------------------------------------
    _skill(
        "BT1",
        "Functional analysis",
        """Maps a problem behaviour onto its triggers, the behaviour itself and what
        follows it, to find what keeps the pattern going. The map points to where change is
        most likely to work.""",
        "Ask what typically happens just before the difficulty, what the client does, and "
        "what happens right afterwards, to map the pattern together.",
    ),
    _skill(
        "BT2",
        "Activity scheduling",
        """Behavioural activation: plans small, specific activities that bring pleasure or
        a sense of mastery, scheduled at realistic times. Action often improves mood before
        motivation returns.""",
        "Help the client choose one small, specific activity that used to bring pleasure or "
        "a sense of achievement and plan when and where they will do it.",
    ),
    _skill(
        "BT3",
        "Graded exposure",
        """Builds a ladder of feared situations from least to most difficult and plans
        gradual, repeated contact with them without escape or safety behaviours. Anxiety
        falls as the client learns the situation is bearable.""",
        "Work with the client on a step-by-step ladder of feared situations and agree on a "
        "first manageable step, explaining why staying with the discomfort helps.",
    ),
    _skill(
        "BT4",
        "Arousal reduction",
        """Teaches a concrete body-based technique such as slow breathing or progressive
        muscle relaxation to lower physical tension. A calmer body makes other work
        possible.""",
        "Offer to guide a short, simple calming exercise such as slow breathing, describe "
        "the steps clearly, and ask how the client feels afterwards.",
    ),
    _skill(
        "BT5",
        "Self-monitoring",
        """Asks the client to record a behaviour, mood or urge with its time and context.
        Records replace vague recall with data and often change the behaviour by
        themselves.""",
        "Suggest a simple way for the client to record when the difficulty happens, how "
        "strong it is and what was going on, and agree on how to review it together.",
    ),
    _skill(
        "BT6",
        "Reinforcement and maintenance",
        """Identifies rewards and supports that keep new behaviour going and plans for
        situations in which old habits are likely to return. Maintenance is planned, not
        left to chance.""",
        "Acknowledge the client's progress, help them pick a way to reward and sustain the "
        "new behaviour, and plan for a situation where the old habit might come back.",
    ),
    # --- Humanistic-existential therapy -------------------------------------------------
    _skill(
        "HET1",
        "Empathic reflection",
        """Reflects back the feeling and meaning in what the client said, slightly deeper
        than the words, so the client feels understood and hears themselves more clearly.""",
        "Reflect the feeling and personal meaning in what the client just said, in warm and "
        "tentative language, without advice or questions that change the topic.",
    ),
    _skill(
        "HET2",
        "Validation and acceptance",
        """Conveys that the client's reactions make sense given their experience and that
        they are accepted as a person, without judgment. Acceptance lowers shame and opens
        exploration.""",
        "Convey that the client's feelings make sense given what they have been through, and "
        "express non-judgmental acceptance of them as a person.",
    ),
    _skill(
        "HET3",
        "Focusing on present experience",
        """Invites attention to what the client feels right now, including bodily sensations
        and unclear feelings, so that implicit experience can be put into words.""",
        "Invite the client to slow down and notice what they are feeling right now, "
        "including in the body, and to put that felt sense into words.",
    ),
    _skill(
        "HET4",
        "Exploring meaning and values",
        """Explores what matters most to the client and what their struggle says about
        what they value. Connecting with values gives direction and motivation.""",
        "Ask open questions that help the client explore what matters most to them and what "
        "this situation reveals about their values.",
    ),
    _skill(
        "HET5",
        "Responsibility and choice",
        """Helps the client recognise the choices still open to them, even under
        constraint, and their authorship of how they respond. Emphasises agency without
        blame.""",
        "Help the client notice the choices still open to them in this situation and what "
        "choosing one of them would mean, without implying blame.",
    ),
    _skill(
        "HET6",
        "Immediacy and genuineness",
        """The counselor openly and respectfully shares their here-and-now response to the
        client or to the relationship. Genuine contact models honest relating.""",
        "Share, briefly and respectfully, your own here-and-now response to what the client "
        "is saying or to your conversation, and check how it lands with them.",
    ),
    # --- Psychodynamic therapy ----------------------------------------------------------
    _skill(
        "PDT1",
        "Open exploration",
        """Encourages the client to speak freely about whatever comes to mind, following
        their associations with minimal structure. Unplanned material often carries
        important meaning.""",
        "Encourage the client to say more about whatever comes to mind, following their "
        "thread with open, non-directive prompts.",
    ),
    _skill(
        "PDT2",
        "Recurring relational patterns",
        """Looks for a repeating pattern in the client's relationships: what they wish for,
        how others respond, and how they then react. Seeing the pattern makes it
        changeable.""",
        "Help the client look across several relationships they have described for a "
        "repeating pattern of what they want, how others respond and how they react.",
    ),
    _skill(
        "PDT3",
        "Linking past and present",
        """Connects current feelings and reactions with earlier experiences, especially in
        the family. Understanding where a reaction comes from can loosen its hold.""",
        "Gently ask whether the present feeling or reaction reminds the client of anything "
        "from earlier in their life, and explore the connection together.",
    ),
    _skill(
        "PDT4",
        "Noticing defences",
        """Points out, with tact, how the client moves away from painful feelings (changing
        the subject, intellectualising, minimising). Naming the avoidance lets the feeling
        come back into view.""",
        "Tactfully point out a way the client seems to step away from a painful feeling and "
        "wonder with them what might be hard about staying with it.",
    ),
    _skill(
        "PDT5",
        "Exploring the counseling relationship",
        """Explores the client's feelings and expectations about the counselor and the
        counseling itself, where old relational patterns often show up in miniature.""",
        "Invite the client to talk about how they are experiencing this conversation and "
        "you, and whether it feels familiar from other relationships.",
    ),
    _skill(
        "PDT6",
        "Tentative interpretation",
        """Offers a hypothesis about an unspoken meaning or motive, framed as a possibility
        for the client to test against their own experience.""",
        "Offer a tentative hypothesis about a possible underlying meaning of what the client "
        "described, framed as a question they are free to reject.",
    ),
    # --- Postmodern therapy (solution-focused and narrative) ----------------------------
    _skill(
        "PMT1",
        "Finding exceptions",
        """Looks for times when the problem was absent or weaker and what the client did
        differently then. Exceptions show that change is already happening.""",
        "Ask about a recent time when the problem was absent or a little less, and explore "
        "what the client did differently then.",
    ),
    _skill(
        "PMT2",
        "Describing the preferred future",
        """Invites a detailed picture of life once the problem is resolved, often through a
        hypothetical question. A vivid preferred future sets the direction of the work.""",
        "Invite the client to imagine the problem has been resolved and to describe in "
        "concrete detail what they would notice first in their day.",
    ),
    _skill(
        "PMT3",
        "Scaling questions",
        """Asks the client to rate their situation on a 0-10 scale and explores what puts it
        where it is and what one point higher would look like. Makes small progress
        visible.""",
        "Ask the client to rate where things are now on a scale from 0 to 10, what keeps it "
        "from being lower, and what one step higher would look like.",
    ),
    _skill(
        "PMT4",
        "Externalizing the problem",
        """Talks about the problem as something separate from the client, with its own name
        and tactics, so the client can examine and resist it without feeling defined by it.""",
        "Help the client give the problem a name as something separate from them, and ask "
        "how it affects their life and when they have stood up to it.",
    ),
    _skill(
        "PMT5",
        "Re-authoring through unique outcomes",
        """Builds on moments that do not fit the problem story and develops them into an
        alternative, preferred account of who the client is.""",
        "Pick up a moment that does not fit the problem story and help the client explore "
        "what it says about them and the story they would prefer to live by.",
    ),
    _skill(
        "PMT6",
        "Strengths and resources",
        """Draws attention to the client's strengths, resources and efforts, with specific
        and genuine compliments. Recognised competence fuels further change.""",
        "Point out specific strengths or efforts you have noticed in what the client shared, "
        "genuinely and concretely, and ask how they could draw on them this week.",
    ),
)

SKILLS: Mapping[str, Skill] = MappingProxyType({skill.id: skill for skill in _TAXONOMY})
_BY_MODALITY: Mapping[str, tuple[Skill, ...]] = MappingProxyType(
    {m: tuple(s for s in _TAXONOMY if s.modality == m) for m in MODALITIES}
)
_POSITION: Mapping[str, int] = MappingProxyType(
    {s.id: i for group in _BY_MODALITY.values() for i, s in enumerate(group)}
)
_SLOT_SET = frozenset(ALL_SLOTS)


def _check_modality(modality: str, name: str = "modality") -> str:
    if modality not in _BY_MODALITY:
        raise ValueError(f"{name}: unknown modality {modality!r}; expected one of {MODALITIES}")
    return modality


def _check_slot(slot: str, name: str = "slot") -> str:
    if slot not in _SLOT_SET:
        raise ValueError(f"{name}: unknown state slot {slot!r}")
    return slot


def skills_for(modality: str) -> list[Skill]:
    """The six skills of ``modality`` in id order."""
    return list(_BY_MODALITY[_check_modality(modality)])


def get_skill(skill_id: str) -> Skill:
    """The skill with this id; ValueError if there is none."""
    try:
        return SKILLS[skill_id]
    except (KeyError, TypeError):
        raise ValueError(f"skill_id: unknown skill {skill_id!r}") from None


def _check_skill(skill_id: str, modality: str | None = None, name: str = "skill") -> Skill:
    skill = SKILLS.get(skill_id) if isinstance(skill_id, str) else None
    if skill is None:
        raise ValueError(f"{name}: unknown skill {skill_id!r}")
    if modality is not None and skill.modality != modality:
        raise ValueError(f"{name}: skill {skill_id!r} does not belong to modality {modality!r}")
    return skill


class PriorTable:
    """The shared skill-prior table Q(s, a), per modality and state slot; read-only.

    Mapping-like over keys ``(modality, slot_id, skill_id)`` for every skill of every
    modality in every one of the 54 slots: ``table[key]``, ``key in table``, ``len``,
    iteration, :meth:`keys` and :meth:`items` (so ``dict(table)`` works). It is not a
    ``collections.abc.Mapping``, because :meth:`values` is the aligned row lookup the engine
    needs, not ``Mapping.values()``.

    A (modality, slot) row absent from the source data has no observed labels; Eq. 10 is
    undefined there (0/0) and the paper is silent, so such a row falls back to the uniform
    value 1/6 for each of the modality's skills (no preference before any evidence).
    :meth:`observed` tells the two apart.
    """

    def __init__(
        self,
        rows: Mapping[tuple[str, str], Mapping[str, float]],
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self._rows: dict[tuple[str, str], tuple[float, ...]] = {}
        for (modality, slot), row in rows.items():
            self._rows[(_check_modality(modality, "rows"), _check_slot(slot, "rows"))] = (
                _row_values(modality, slot, row)
            )
        # A JSON round trip deep-copies and proves the metadata serialisable.
        self._metadata: Mapping[str, Any] = MappingProxyType(
            json.loads(json.dumps(dict(metadata or {})))
        )

    # --- Mapping-like access -----------------------------------------------------------
    def __getitem__(self, key: tuple[str, str, str]) -> float:
        try:
            modality, slot, skill = key
            return self.value(modality, slot, skill)
        except (ValueError, TypeError):
            raise KeyError(key) from None

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[tuple[str, str, str]]:
        for modality in MODALITIES:
            for slot in ALL_SLOTS:
                for skill in _BY_MODALITY[modality]:
                    yield (modality, slot, skill.id)

    def __len__(self) -> int:
        return sum(len(skills) for skills in _BY_MODALITY.values()) * len(ALL_SLOTS)

    def keys(self) -> Iterator[tuple[str, str, str]]:
        return iter(self)

    def items(self) -> Iterator[tuple[tuple[str, str, str], float]]:
        for key in self:
            yield key, self[key]

    # --- Lookups ------------------------------------------------------------------------
    @property
    def metadata(self) -> Mapping[str, Any]:
        """How the table was made (source, method, counts); a read-only copy."""
        return self._metadata

    def observed(self, modality: str, slot: str) -> bool:
        """Whether the source data held a row for this state (False: uniform fallback)."""
        return (_check_modality(modality), _check_slot(slot)) in self._rows

    def _row(self, modality: str, slot: str) -> tuple[float, ...]:
        key = (_check_modality(modality), _check_slot(slot))
        row = self._rows.get(key)
        if row is None:
            return (1.0 / len(_BY_MODALITY[modality]),) * len(_BY_MODALITY[modality])
        return row

    def value(self, modality: str, slot: str, skill: str) -> float:
        """Q(s, a) for one skill."""
        row = self._row(modality, slot)
        return row[_POSITION[_check_skill(skill, modality).id]]

    def values(self, modality: str, slot: str, skill_ids: Sequence[str]) -> np.ndarray:
        """Q(s, a) for the given skills, aligned with ``skill_ids``."""
        row = self._row(modality, slot)
        positions = [_POSITION[_check_skill(s, modality, "skill_ids").id] for s in skill_ids]
        return np.array([row[p] for p in positions], dtype=np.float64)

    def for_state(self, modality: str, slot: str) -> dict[str, float]:
        """The row for one state as ``{skill_id: Q}``: what ``SkillPosterior.decide`` takes."""
        row = self._row(modality, slot)
        return {skill.id: row[i] for i, skill in enumerate(_BY_MODALITY[modality])}

    # --- Storage ------------------------------------------------------------------------
    def to_json(self) -> str:
        """The table as JSON: observed rows only (absent rows mean the uniform fallback)."""
        values: dict[str, dict[str, dict[str, float]]] = {}
        for modality in MODALITIES:
            for slot in ALL_SLOTS:
                row = self._rows.get((modality, slot))
                if row is not None:
                    skills = _BY_MODALITY[modality]
                    values.setdefault(modality, {})[slot] = {
                        s.id: v for s, v in zip(skills, row, strict=True)
                    }
        document = {"format": PRIOR_FORMAT, "metadata": dict(self._metadata), "values": values}
        return json.dumps(document, indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PriorTable:
        """Parse :meth:`to_json` output; ValueError on any malformed or unknown entry."""
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"text: not valid JSON ({exc})") from exc
        if not isinstance(document, dict) or document.get("format") != PRIOR_FORMAT:
            raise ValueError(f"text: expected a document with format {PRIOR_FORMAT!r}")
        values = document.get("values")
        if not isinstance(values, dict):
            raise ValueError("text: 'values' must be an object")
        rows: dict[tuple[str, str], Mapping[str, float]] = {}
        for modality, by_slot in values.items():
            _check_modality(modality, "text")
            if not isinstance(by_slot, dict):
                raise ValueError(f"text: values[{modality!r}] must be an object")
            for slot, row in by_slot.items():
                if not isinstance(row, dict):
                    raise ValueError(f"text: values[{modality!r}][{slot!r}] must be an object")
                rows[(modality, slot)] = row
        metadata = document.get("metadata", {})
        if not isinstance(metadata, dict):
            raise ValueError("text: 'metadata' must be an object")
        return cls(rows, metadata)

    @classmethod
    def load_default(cls) -> PriorTable:
        """The shipped default table (built from a synthetic corpus: see its metadata)."""
        return _default_table()


def _row_values(modality: str, slot: str, row: Mapping[str, float]) -> tuple[float, ...]:
    """One row as values in skill order; every skill of the modality must be present."""
    skills = _BY_MODALITY[modality]
    where = f"rows[({modality!r}, {slot!r})]"
    unknown = sorted(set(row) - {s.id for s in skills})
    if unknown:
        raise ValueError(f"{where}: skills not in modality {modality!r}: {unknown}")
    missing = [s.id for s in skills if s.id not in row]
    if missing:
        raise ValueError(f"{where}: missing skills {missing}")
    return tuple(_validate.finite(f"{where}[{s.id!r}]", row[s.id]) for s in skills)


@cache
def _default_table() -> PriorTable:
    data = resources.files("counselor_engine").joinpath("data", "prior_default.json")
    return PriorTable.from_json(data.read_text(encoding="utf-8"))


_CORPUS_FIELDS = ("modality", "stage", "progress", "affect", "skill")


def _parse_corpus_line(line: str, where: str) -> tuple[str, str, str]:
    """One labelled turn -> (modality, slot_id, skill_id)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object")
    missing = [f for f in _CORPUS_FIELDS if not isinstance(record.get(f), str)]
    if missing:
        raise ValueError(f"{where}: missing or non-string fields {missing}")
    modality = _check_modality(record["modality"], where)
    try:
        state = State(record["stage"], record["progress"], record["affect"])
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    skill = _check_skill(record["skill"], modality, where)
    return modality, state.slot_id, skill.id


def build_prior(jsonl_path: str | Path, *, note: str | None = None) -> PriorTable:
    """The frequency prior of Eq. 10 from a corpus of skill-labelled turns.

    1. Read one JSON object per non-blank line with keys modality, stage, progress,
       affect and skill; any malformed line raises ValueError naming its line number.
    2. Count n(s, a) per modality and state slot s = stage/progress/affect.
    3. For every state with at least one label, Q(s, a) = n(s, a) / sum_a' n(s, a')
       (Eq. 10), with 0 for the modality's skills never seen there. States without labels
       are left out and fall back to uniform (see :class:`PriorTable`).
    """
    path = Path(jsonl_path)
    counts: dict[tuple[str, str], dict[str, int]] = {}
    turns = 0
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            modality, slot, skill = _parse_corpus_line(line, f"{path.name}:{number}")
            row = counts.setdefault((modality, slot), {})
            row[skill] = row.get(skill, 0) + 1
            turns += 1
    if turns == 0:
        raise ValueError(f"jsonl_path: {path.name} holds no labelled turns")
    rows: dict[tuple[str, str], dict[str, float]] = {}
    for (modality, slot), row in counts.items():
        total = sum(row.values())
        rows[(modality, slot)] = {s.id: row.get(s.id, 0) / total for s in _BY_MODALITY[modality]}
    metadata: dict[str, Any] = {
        "method": "frequency prior, PsyEvo Eq. 10: Q(s,a) = n(s,a) / sum_a' n(s,a')",
        "source": path.name,
        "turns": turns,
        "states_observed": {m: sum(1 for k in rows if k[0] == m) for m in MODALITIES},
        "unobserved_states": "absent rows fall back to uniform 1/6 over the modality's skills",
    }
    if note:
        metadata["note"] = note
    return PriorTable(rows, metadata)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``build-prior IN OUT [--note TEXT]``."""
    parser = argparse.ArgumentParser(prog="python -m counselor_engine.skills")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build-prior", help="build the Eq. 10 frequency prior")
    build.add_argument("input", help="JSONL corpus of skill-labelled turns")
    build.add_argument("output", help="where to write the prior table (JSON)")
    build.add_argument("--note", default=None, help="provenance note stored in the metadata")
    args = parser.parse_args(argv)
    try:
        table = build_prior(args.input, note=args.note)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    Path(args.output).write_text(table.to_json(), encoding="utf-8")
    observed = table.metadata["states_observed"]
    print(f"wrote {args.output}: {table.metadata['turns']} turns, states observed {observed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
