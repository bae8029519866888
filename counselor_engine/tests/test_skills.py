"""Skill taxonomy and the shared prior table Q (Eq. 10)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from counselor_engine.skills import (
    MODALITIES,
    SKILLS,
    PriorTable,
    Skill,
    build_prior,
    get_skill,
    main,
    skills_for,
)
from counselor_engine.states import ALL_SLOTS

DATA = Path(str(resources.files("counselor_engine").joinpath("data")))


def _write_corpus(path: Path, records: list[dict[str, str]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def _turn(modality: str, skill: str, affect: str = "anxiety") -> dict[str, str]:
    return {
        "modality": modality,
        "stage": "core",
        "progress": "middle",
        "affect": affect,
        "skill": skill,
    }


def test_it_has_six_skills_per_modality() -> None:
    assert MODALITIES == ("cbt", "bt", "het", "pdt", "pmt")
    for modality in MODALITIES:
        ids = [s.id for s in skills_for(modality)]
        assert ids == [f"{modality.upper()}{k}" for k in range(1, 7)]
    assert len(SKILLS) == 30


def test_every_skill_is_described_in_plain_text() -> None:
    for skill in SKILLS.values():
        assert isinstance(skill, Skill)
        assert skill.modality in MODALITIES
        assert skill.name and skill.description and skill.instruction
        assert "\n" not in skill.description  # one paragraph
        assert skill.description.endswith(".") and skill.instruction.endswith(".")


def test_get_skill_finds_and_refuses() -> None:
    assert get_skill("PMT3").name == "Scaling questions"
    with pytest.raises(ValueError, match="skill_id"):
        get_skill("CBT7")
    with pytest.raises(ValueError, match="modality"):
        skills_for("dbt")


def test_it_builds_the_eq10_frequency_prior(tmp_path: Path) -> None:
    corpus = _write_corpus(
        tmp_path / "c.jsonl",
        [_turn("cbt", "CBT2"), _turn("cbt", "CBT2"), _turn("cbt", "CBT3"), _turn("bt", "BT1")],
    )
    table = build_prior(corpus)
    slot = "core/middle/anxiety"
    row = table.for_state("cbt", slot)
    assert row == pytest.approx(
        {"CBT1": 0, "CBT2": 2 / 3, "CBT3": 1 / 3, "CBT4": 0, "CBT5": 0, "CBT6": 0}
    )
    assert table.value("bt", slot, "BT1") == 1.0
    assert table.metadata["turns"] == 4
    assert table.observed("cbt", slot)


def test_an_unseen_state_falls_back_to_uniform(tmp_path: Path) -> None:
    table = build_prior(_write_corpus(tmp_path / "c.jsonl", [_turn("cbt", "CBT1")]))
    assert not table.observed("cbt", "core/middle/sadness")
    assert not table.observed("het", "core/middle/anxiety")
    assert table.values("het", "core/middle/anxiety", ["HET1", "HET6"]).tolist() == [1 / 6] * 2
    assert sum(table.for_state("pdt", "formulation/late/guilt").values()) == pytest.approx(1.0)


def test_values_are_aligned_with_the_requested_skills() -> None:
    table = PriorTable.load_default()
    slot = "consolidation/late/positive"
    row = table.for_state("pmt", slot)
    assert table.values("pmt", slot, ["PMT6", "PMT1"]).tolist() == [row["PMT6"], row["PMT1"]]
    assert table[("pmt", slot, "PMT6")] == row["PMT6"]
    assert ("pmt", slot, "PMT6") in table and ("pmt", slot, "BT1") not in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("cbt", "core/middle/joy", "CBT1"), "slot"),
        (("cbt", "core/middle/anxiety", "BT1"), "skill"),
        (("cbt", "core/middle/anxiety", "CBT9"), "skill"),
        (("dbt", "core/middle/anxiety", "CBT1"), "modality"),
    ],
)
def test_lookups_refuse_unknown_names(args: tuple[str, str, str], message: str) -> None:
    table = PriorTable.load_default()
    with pytest.raises(ValueError, match=message):
        table.value(*args)
    with pytest.raises(KeyError):
        table[args]


def test_it_is_a_read_only_mapping_over_every_key() -> None:
    table = PriorTable.load_default()
    keys = list(table)
    assert len(keys) == len(table) == 5 * 54 * 6
    assert keys[0] == ("cbt", ALL_SLOTS[0], "CBT1")
    assert not hasattr(table, "__setitem__")
    assert dict(table.items()) == dict(table)
    with pytest.raises(TypeError):
        table.metadata["note"] = "changed"  # type: ignore[index]


def test_the_default_table_is_the_prior_of_the_shipped_corpus() -> None:
    default = PriorTable.load_default()
    rebuilt = build_prior(DATA / "synthetic_skill_corpus.jsonl")
    assert dict(rebuilt) == dict(default)
    assert "NOT PsychEval" in default.metadata["note"]
    for modality in MODALITIES:
        for slot in ALL_SLOTS:
            assert default.observed(modality, slot)
            assert sum(default.for_state(modality, slot).values()) == pytest.approx(1.0)


def test_the_generator_reproduces_the_shipped_corpus(tmp_path: Path) -> None:
    from counselor_engine.data import make_synthetic_corpus as generator

    out = tmp_path / "corpus.jsonl"
    assert generator.main([str(out)]) == 0
    shipped = (DATA / "synthetic_skill_corpus.jsonl").read_text(encoding="utf-8")
    assert out.read_text(encoding="utf-8") == shipped
    assert set(generator.AFFINITIES) == set(SKILLS)


def test_json_round_trip_keeps_values_and_metadata(tmp_path: Path) -> None:
    table = build_prior(_write_corpus(tmp_path / "c.jsonl", [_turn("bt", "BT4")]), note="x")
    again = PriorTable.from_json(table.to_json())
    assert dict(again) == dict(table)
    assert again.metadata == table.metadata
    assert not again.observed("bt", "core/middle/sadness")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["values"]["bt"]["core/middle/anxiety"].pop("BT2"), "missing skills"),
        (lambda d: d["values"]["bt"]["core/middle/anxiety"].update(CBT1=0.1), "not in modality"),
        (lambda d: d["values"]["bt"]["core/middle/anxiety"].update(BT2=math.nan), "finite"),
        (lambda d: d["values"].update(dbt={}), "modality"),
        (lambda d: d.update(format="other"), "format"),
    ],
)
def test_from_json_refuses_a_bad_table(
    mutate: Callable[[dict[str, Any]], object], message: str, tmp_path: Path
) -> None:
    table = build_prior(_write_corpus(tmp_path / "c.jsonl", [_turn("bt", "BT4")]))
    document = json.loads(table.to_json())
    mutate(document)
    with pytest.raises(ValueError, match=message):
        PriorTable.from_json(json.dumps(document))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "c.jsonl:2"),
        (json.dumps({**_turn("cbt", "CBT1"), "skill": "BT1"}), "does not belong"),
        (json.dumps({**_turn("cbt", "CBT1"), "stage": "middle"}), "stage"),
        (json.dumps({"modality": "cbt"}), "missing"),
    ],
)
def test_build_prior_names_the_bad_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(_turn("cbt", "CBT1")) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        build_prior(path)


def test_build_prior_refuses_an_empty_corpus(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="jsonl_path"):
        build_prior(path)


def test_the_command_line_writes_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = _write_corpus(tmp_path / "c.jsonl", [_turn("het", "HET3")])
    out = tmp_path / "q.json"
    assert main(["build-prior", str(corpus), str(out), "--note", "test corpus"]) == 0
    table = PriorTable.from_json(out.read_text(encoding="utf-8"))
    assert table.value("het", "core/middle/anxiety", "HET3") == 1.0
    assert table.metadata["note"] == "test corpus"
    assert main(["build-prior", str(tmp_path / "absent.jsonl"), str(out)]) == 1
    assert "error" in capsys.readouterr().err


def test_it_runs_as_a_module(tmp_path: Path) -> None:
    corpus = _write_corpus(tmp_path / "c.jsonl", [_turn("pdt", "PDT2")])
    out = tmp_path / "q.json"
    subprocess.run(
        [sys.executable, "-m", "counselor_engine.skills", "build-prior", str(corpus), str(out)],
        check=True,
        capture_output=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert PriorTable.from_json(out.read_text()).value("pdt", "core/middle/anxiety", "PDT2") == 1
