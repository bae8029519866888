"""Headless courses on the tiny model, the reporting-only proof (PsyEvo App. G) and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from counselor_engine.__main__ import main
from counselor_engine.backends.base import GenerationParams
from counselor_engine.counselor import CounselorConfig
from counselor_engine.embeddings import HashingEmbedder
from counselor_engine.simulation import (
    Ablation,
    CurriculumController,
    builtin_profiles,
    run_course,
    run_courses,
    summarize,
)
from counselor_engine.tests.fakes import FakeBackend

FAMILIES = ("c_shared", "c_spec", "l_shared", "l_spec", "overall")
CONFIG = CounselorConfig(n_candidates=2, generation=GenerationParams(max_new_tokens=8), memory_k=0)
SMALL = {"max_new_tokens": 8}


async def test_it_runs_two_clients_for_two_sessions_concurrently(tiny_backend) -> None:  # type: ignore[no-untyped-def]
    profiles = [builtin_profiles()[0], builtin_profiles()[12]]  # cbt-01, pdt-01
    curriculum = CurriculumController(sorted({p.intent for p in builtin_profiles()}))
    client_backend = FakeBackend(name="simulator")  # the simulator is its own backend role
    results = await run_courses(
        tiny_backend, client_backend, profiles, sessions=2, max_turns=3, curriculum=curriculum,
        seed=5, counselor_config=CONFIG, memory_embedder=HashingEmbedder(), client_kwargs=SMALL,
    )  # fmt: skip
    assert [r.profile.id for r in results] == ["cbt-01", "pdt-01"]
    for course in results:
        assert [s.index for s in course.sessions] == [0, 1]
        for session in course.sessions:
            roles = [role for role, _ in session.transcript]
            assert roles[0] == "client" and roles == ["client", "counselor"] * (len(roles) // 2)
            assert 1 <= len(roles) // 2 <= 3
            assert session.rating is not None and session.outcome is not None
            assert len(session.groups) == len(roles) // 2
            delivered = [g.candidates[g.delivered] for g in session.groups]
            assert delivered == [t for r, t in session.transcript if r == "counselor"]
            assert session.report is not None
            assert set(FAMILIES) <= set(session.report.metrics)
            assert session.error == ""
        assert course.client is not None and len(course.client.session_rewards) == 2
        # Three turns give two judged outcomes (the last has no reaction): enough to learn.
        assert course.client.posterior.cells(), "the course learned client-private residuals"
    # Every finished session fed the curriculum once (K = 1 groups of internal rewards).
    assert curriculum.snapshot()["total_groups"] == 4
    # The simulator spoke through its own backend only.
    assert client_backend.calls["generate"] >= 4
    table = summarize(results)
    assert len(table["sessions"]) == 4 and "pass_all" in table["pass_rates"]


def course_fingerprint(result, curriculum) -> dict:  # type: ignore[no-untyped-def]
    """Everything the learning path consumes or writes."""
    return {
        "posterior": result.client.posterior.to_dict(),
        "rewards": list(result.client.session_rewards),
        "groups": [[g.to_dict() for g in s.groups] for s in result.sessions],
        "credit": [s.outcome.credit for s in result.sessions],
        "states": [s.state.key for s in result.sessions],
        "transcripts": [s.transcript for s in result.sessions],
        "curriculum": curriculum.snapshot(),
    }


async def test_external_reports_never_change_what_learning_consumes(tiny_backend) -> None:  # type: ignore[no-untyped-def]
    """The paper's write-path audit: two different external judges, identical learning."""
    profile = builtin_profiles()[4]  # bt-01
    runs = []
    for judge in (FakeBackend(name="judge-a"), tiny_backend):
        curriculum = CurriculumController([profile.intent])
        result = await run_course(
            tiny_backend, tiny_backend, profile, sessions=2, max_turns=2,
            curriculum=curriculum, rng=np.random.default_rng(99), judge_backend=judge,
            counselor_config=CONFIG, memory_embedder=HashingEmbedder(), client_kwargs=SMALL,
        )  # fmt: skip
        runs.append((result, curriculum))
    (first, cur_a), (second, cur_b) = runs
    reports = [[s.report.to_dict() for s in r.sessions] for r, _ in runs]  # type: ignore[union-attr]
    assert reports[0] != reports[1], "the two judges must disagree for the test to mean anything"
    assert course_fingerprint(first, cur_a) == course_fingerprint(second, cur_b)


async def test_no_hbsp_courses_leave_the_posterior_untouched() -> None:
    backend = FakeBackend()
    result = await run_course(
        backend, backend, builtin_profiles()[8], sessions=2, max_turns=2, curriculum=None,
        rng=np.random.default_rng(1), counselor_config=CONFIG, ablation=Ablation(no_hbsp=True),
        memory_embedder=HashingEmbedder(),
    )  # fmt: skip
    assert result.client is not None and result.client.posterior.cells() == {}
    assert all(s.outcome is not None and s.outcome.posterior_updates == [] for s in result.sessions)


async def test_a_backend_failure_cuts_the_session_but_not_the_course() -> None:
    backend = FakeBackend()
    counselor_backend = FakeBackend().fail_always("generate")
    result = await run_course(
        counselor_backend, backend, builtin_profiles()[0], sessions=2, max_turns=2,
        curriculum=None, rng=np.random.default_rng(1), counselor_config=CONFIG,
        memory_embedder=HashingEmbedder(),
    )  # fmt: skip
    for session in result.sessions:
        assert session.error.startswith("backend_error")
        assert session.transcript == [] and session.report is None and session.rating is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sessions": 0}, "sessions"),
        ({"max_turns": 0}, "max_turns"),
        ({"rng": 5}, "rng"),
        ({"curriculum": CurriculumController(["other"])}, "has no intent"),
    ],
)
async def test_it_refuses_bad_course_arguments(kwargs, message) -> None:  # type: ignore[no-untyped-def]
    args = {"sessions": 1, "max_turns": 1, "curriculum": None, "rng": np.random.default_rng(0)}
    with pytest.raises(ValueError, match=message):
        await run_course(FakeBackend(), FakeBackend(), builtin_profiles()[0], **{**args, **kwargs})


def test_the_cli_prints_metric_families_per_session(tiny_model_path, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "sim.json"
    code = main([
        "simulate", "--model", str(tiny_model_path), "--clients", "2", "--sessions", "1",
        "--max-turns", "1", "--n", "2", "--max-new-tokens", "6", "--curriculum",
        "--ablation", "no_soca", "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "ablation no_soca" in printed and "c_shared" in printed and "l_spec" in printed
    assert "cbt-01" in printed and "bt-01" in printed  # interleaved across modalities
    saved = json.loads(out.read_text())
    assert len(saved["sessions"]) == 2 and saved["curriculum"]["total_groups"] == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--clients", "0"], "--clients"),
        (["--ablation", "bogus"], "unknown"),
        (["--sessions", "0"], "--sessions"),
    ],
)
def test_the_cli_refuses_bad_arguments(argv, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit, match=message):
        main(["simulate", "--model", "/nonexistent", *argv])
