"""Command line: ``python -m counselor_engine {prepare-model,chat,replay,simulate}``.

``chat`` runs a real session in the terminal with the default model (one client message
per input line; end of input ends the session, with a rating prompt on a terminal). The
client's posterior and memory persist in a JSON file, so memory carries across runs.
Every session is saved; ``replay FILE`` reruns it with the same seed and reports whether
each reply came out identical. ``simulate`` runs headless simulation-lab courses (built-in
synthetic clients, or PsychAgent-style JSON) and prints the external metric families per
session.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any


def _data_dir() -> Path:
    from counselor_engine.models import default_data_dir

    return default_data_dir()


def _backend(args: argparse.Namespace) -> Any:
    from counselor_engine.backends import make_backend
    from counselor_engine.models import resolve_model_path

    if args.backend == "vllm":
        return make_backend("vllm", base_url=args.vllm_url, model=args.vllm_model)
    path = args.model or resolve_model_path(progress=lambda m: print(m, file=sys.stderr))
    return make_backend("transformers", model_path=path)


def _config(args: argparse.Namespace, seed: int) -> Any:
    from counselor_engine.counselor import CounselorConfig, default_generation

    return CounselorConfig(
        n_candidates=args.n,
        mode=args.mode,
        generation=replace(default_generation(), max_new_tokens=args.max_new_tokens),
        seed=seed,
        candidate_strategy=args.strategy,
    )


def _explain(event: Any, out: Any) -> None:
    from counselor_engine.counselor import DoneEvent, SkillEvent

    if isinstance(event, SkillEvent):
        d = event.decision
        out.write(
            f"\n[state {event.state_slot}] skill {d.chosen} p={d.records[d.chosen].probability:.2f}"
        )
        out.write(" " + " ".join(f"{s}:{r.probability:.2f}" for s, r in d.records.items()) + "\n")
    elif isinstance(event, DoneEvent) and event.group is not None:
        g = event.group
        for i, text in enumerate(g.candidates):
            mark = "*" if i == g.delivered else " "
            out.write(
                f"  {mark}[{i}] depth={g.depths[i]} point={g.pointwise[i]:.2f} {text[:100]!r}\n"
            )
        edges = (
            ", ".join(f"{e['winner']}>{e['loser']}({e['weight']:.2f})" for e in g.edges) or "none"
        )
        out.write(f"  edges: {edges}; delivered {g.delivered}; admissible={g.admissible}\n")


async def _run_session(
    counselor: Any, messages: list[str], *, explain: bool, echo: bool
) -> list[str]:
    from counselor_engine.counselor import DoneEvent, ErrorEvent, SafetyEvent, TokenEvent

    replies = []
    for message in messages:
        if echo:
            print(f"you> {message}")
        sys.stdout.write("counselor> ")
        reply = ""
        async for event in counselor.respond(message):
            if isinstance(event, TokenEvent):
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, ErrorEvent):
                sys.stdout.write(f"[{event.code}] {event.message}")
            elif isinstance(event, SafetyEvent):
                sys.stderr.write(f"\n[safety: {event.assessment.level}]\n")
            elif isinstance(event, DoneEvent):
                reply = event.reply
            if explain:
                _explain(event, sys.stderr)
        sys.stdout.write("\n")
        replies.append(reply)
    return replies


def _ask_rating() -> Any:
    from counselor_engine.counselor import RATING_ITEMS, SessionRating

    print("Rate this session from 0 to 10 (empty line to skip).", file=sys.stderr)
    values = []
    for item in RATING_ITEMS:
        answer = input(f"{item.replace('_', ' ')}: ").strip()
        if not answer:
            return None
        values.append(float(answer))
    return SessionRating(*values)


def cmd_prepare(args: argparse.Namespace) -> int:
    import os

    from counselor_engine.models import ensure_default_model, resolve_model_path

    if os.environ.get("PSYEVO_MODEL_PATH"):
        print(f"using PSYEVO_MODEL_PATH={resolve_model_path()}")
        return 0
    print(ensure_default_model(progress=lambda m: print(m, file=sys.stderr)))
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from counselor_engine.counselor import ClientState, Counselor

    client_file = Path(args.client_file or _data_dir() / "cli" / f"client-{args.modality}.json")
    if client_file.exists():
        client = ClientState.from_dict(json.loads(client_file.read_text()))
        client = replace(client, session_index=client.session_index + 1)
    else:
        client = ClientState("cli", args.modality, 0, args.planned_sessions)
    snapshot = client.to_dict()
    seed = args.seed if args.seed is not None else int(dt.datetime.now().timestamp())
    counselor = Counselor(_backend(args), config=_config(args, seed))
    counselor.start_session(client, None)
    interactive = sys.stdin.isatty()
    if interactive:
        print(
            "You are talking with an AI counselor. Press Ctrl-D to end the session.",
            file=sys.stderr,
        )
    messages: list[str] = []
    replies: list[str] = []
    for line in sys.stdin:
        text = line.rstrip("\n")
        if not text.strip():
            continue
        messages.append(text)
        replies += asyncio.run(_run_session(counselor, [text], explain=args.explain, echo=False))
    rating = _ask_rating() if interactive else None
    outcome = asyncio.run(counselor.end_session(rating))
    print(
        f"session reward {outcome.session_reward:.3f}; {len(outcome.posterior_updates)} posterior "
        f"updates{f' (skipped: {outcome.evidence.skip})' if outcome.evidence.skip else ''}; "
        f"{len(outcome.recap)} memory items",
        file=sys.stderr,
    )
    client_file.parent.mkdir(parents=True, exist_ok=True)
    client_file.write_text(json.dumps(client.to_dict(), indent=1))
    save = Path(args.save or _data_dir() / "sessions" / f"{dt.datetime.now():%Y%m%d-%H%M%S}.json")
    save.parent.mkdir(parents=True, exist_ok=True)
    save.write_text(
        json.dumps(
            {
                "format": 1,
                "seed": seed,
                "n": args.n,
                "mode": args.mode,
                "strategy": args.strategy,
                "max_new_tokens": args.max_new_tokens,
                "client": snapshot,
                "messages": messages,
                "replies": replies,
                "rating": None if rating is None else asdict(rating),
            },
            indent=1,
        )
    )
    print(f"saved to {save}", file=sys.stderr)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from counselor_engine.counselor import ClientState, Counselor

    saved = json.loads(Path(args.file).read_text())
    args.n, args.mode, args.max_new_tokens = saved["n"], saved["mode"], saved["max_new_tokens"]
    args.strategy = saved.get("strategy", "sample")  # sessions saved before --strategy
    counselor = Counselor(_backend(args), config=_config(args, saved["seed"]))
    counselor.start_session(ClientState.from_dict(saved["client"]), None)
    replies = asyncio.run(
        _run_session(counselor, saved["messages"], explain=args.explain, echo=True)
    )
    same = replies == saved["replies"]
    print("replay identical" if same else "replay DIFFERS from the saved session", file=sys.stderr)
    return 0 if same else 1


def _pick_profiles(args: argparse.Namespace) -> list[Any]:
    from counselor_engine.simulation import builtin_profiles, import_psychagent

    pool = import_psychagent(args.profiles) if args.profiles else list(builtin_profiles())
    if args.modality:
        pool = [p for p in pool if p.modality == args.modality]
    # Built-ins are grouped by modality: interleave so a few clients span modalities.
    groups: dict[str, list[Any]] = {}
    for profile in pool:
        groups.setdefault(profile.modality, []).append(profile)
    mixed = [g[i] for i in range(max(map(len, groups.values()), default=0))
             for g in groups.values() if i < len(g)]  # fmt: skip
    if args.clients < 1 or args.clients > len(mixed):
        raise SystemExit(f"--clients: choose 1..{len(mixed)} (profiles available)")
    return mixed[: args.clients]


def cmd_simulate(args: argparse.Namespace) -> int:
    from counselor_engine.counselor import CounselorConfig, default_generation
    from counselor_engine.simulation import Ablation, CurriculumController, run_courses, summarize

    if args.sessions < 1 or args.max_turns < 1 or args.n < 1:
        raise SystemExit("--sessions, --max-turns and --n must be >= 1")
    try:
        ablation = Ablation.parse(args.ablation)
        profiles = _pick_profiles(args)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    backend = _backend(args)
    judge_backend = None
    if args.judge_model:
        from counselor_engine.backends import make_backend

        judge_backend = make_backend("transformers", model_path=args.judge_model)
    curriculum = (
        CurriculumController(sorted({p.intent for p in profiles})) if args.curriculum else None
    )
    config = CounselorConfig(
        n_candidates=args.n,
        generation=replace(default_generation(), max_new_tokens=args.max_new_tokens),
        candidate_strategy=args.strategy,
    )

    def progress(profile: Any, session: Any) -> None:
        print(f"  done: {profile.id} session {session.index + 1}", file=sys.stderr)

    results = asyncio.run(
        run_courses(
            backend, backend, profiles, sessions=args.sessions, max_turns=args.max_turns,
            curriculum=curriculum, seed=args.seed, judge_backend=judge_backend,
            counselor_config=config, ablation=ablation,
            client_kwargs={"max_new_tokens": args.max_new_tokens}, on_session=progress,
        )
    )  # fmt: skip
    summary = summarize(results)
    families = ("c_shared", "c_spec", "l_shared", "l_spec", "overall")
    print(f"ablation {ablation.label}; strategy {args.strategy}; seed {args.seed}")
    print("profile   session state                  " + " ".join(f"{f:>8}" for f in families)
          + "  pass(client,supervisor,counselor)")  # fmt: skip
    for row in summary["sessions"]:
        values = " ".join(f"{row.get(f, float('nan')):8.2f}" for f in families)
        flags = ",".join(
            str(int(row.get(f"pass_{p}", 0))) for p in ("client", "supervisor", "counselor")
        )
        print(f"{row['profile']:<9} {row['session'] + 1:>7} {row['state']:<22} {values}  {flags}")
    print("pass rates: " + ", ".join(f"{k} {v:.2f}" for k, v in summary["pass_rates"].items()))
    if args.json:
        out = {**summary, "curriculum": curriculum.snapshot() if curriculum else None,
               "ablation": ablation.label, "seed": args.seed}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))
        print(f"saved to {args.json}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m counselor_engine", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare-model", help="fetch and convert the default model once")
    prep.set_defaults(func=cmd_prepare)
    for name, func in (("chat", cmd_chat), ("replay", cmd_replay)):
        p = sub.add_parser(name)
        p.set_defaults(func=func)
        p.add_argument(
            "--explain", action="store_true", help="show state, skill, candidates, graph"
        )
        p.add_argument(
            "--model", help="local model folder (default: SmolLM2, prepared on first use)"
        )
        p.add_argument("--backend", choices=("transformers", "vllm"), default="transformers")
        p.add_argument("--vllm-url", default="http://127.0.0.1:8001")
        p.add_argument("--vllm-model", default="smollm2-135m-instruct")
        if name == "replay":
            p.add_argument("file")
        else:
            p.add_argument("--modality", choices=("cbt", "bt", "het", "pdt", "pmt"), default="cbt")
            p.add_argument("--planned-sessions", type=int, default=8)
            p.add_argument("--mode", choices=("graph", "stream_first"), default="graph")
            p.add_argument("--strategy", choices=("sample", "mctsr"), default="sample")
            p.add_argument("--n", type=int, default=5)
            p.add_argument("--max-new-tokens", type=int, default=96)
            p.add_argument("--seed", type=int)
            p.add_argument(
                "--client-file", help="JSON file holding the client's posterior and memory"
            )
            p.add_argument("--save", help="where to save the session for replay")
    sim = sub.add_parser("simulate", help="run headless simulated-client courses")
    sim.set_defaults(func=cmd_simulate, backend="transformers")
    sim.add_argument("--model", help="local model folder (default: SmolLM2, prepared on first use)")
    sim.add_argument("--judge-model", help="another model folder for the external judge")
    sim.add_argument("--profiles", help="PsychAgent-style JSON file (default: built-in profiles)")
    sim.add_argument("--modality", choices=("cbt", "bt", "het", "pdt", "pmt"))
    sim.add_argument("--clients", type=int, default=2)
    sim.add_argument("--sessions", type=int, default=2)
    sim.add_argument("--max-turns", type=int, default=4)
    sim.add_argument("--n", type=int, default=3)
    sim.add_argument("--max-new-tokens", type=int, default=64)
    sim.add_argument("--strategy", choices=("sample", "mctsr"), default="sample")
    sim.add_argument(
        "--ablation", default="none", help="none | no_hbsp,no_lipo,pairwise_dpo,no_soca"
    )
    sim.add_argument("--curriculum", action="store_true", help="pick interaction states adaptively")
    sim.add_argument("--seed", type=int, default=7)
    sim.add_argument("--json", help="write the summary and curriculum snapshot here")
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
