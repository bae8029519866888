"""MCTSr-Zero: a principled tree search over candidate replies (seed 002, section 4).

The search turns one client message into a small tree of drafted replies and returns the
``n`` best of them, so the rest of the turn (internal judge, SOCA graph, evidence) works on
them exactly as on sampled candidates.

1. Initialisation (4.1): ``n`` initial replies A_0..A_{n-1} ~ M(P || m_0) in ONE batched
   generation; all are evaluated in ONE batched scoring call.
2. Selection (4.2, Eq. 7): every answer node and the root P are scored with
   UCT_s = Q(s) + c * sqrt(ln(N(Parent(s)) + 1) / (N(s) + eps)); the arg-max is expanded.
3. Regeneration with meta-prompt adaptation (4.3, Eq. 2-3) when P is selected: a candidate
   meta-prompt m_cand = M(m_active || F_n) is written from the feedback F_n of the most
   recent initial reply, a new initial reply A_{t+1} = M(P || m_cand) is drafted and
   evaluated, and m_active becomes m_cand iff Q(A_{t+1}) >= Q(P) (Q(P) before A_{t+1}
   joins).
4. Reflective self-refine (4.4) when an answer node a is selected:
   a' = M(a || F_a || m_active), a new child of a.
5. Principled self-evaluation (4.5, Eq. 4): each of the 16 standards is rated by next-token
   probabilities (never parsed from text); one evaluator framing ("view") gives one sample
   R^i = the mean over standards; Q(a) = (min R + mean R) / 2.
6. Backpropagation (4.6, Eq. 5-6): every answer ancestor p of a new node takes
   Q(p) <- (Q(p) + max_{children} Q) / 2, innermost first; Q(P) = mean Q of P's children.
7. Termination (4.8): the call budget (``max_calls``), ``max_iterations`` or ``q_threshold``.

Choices where the paper is silent or loose (each has a test in tests/test_mctsr.py):

- Scale: a two-digit "10" is not one token in most tokenizers, and the backend reads one
  next token. Each standard is therefore rated on the ten single digits 0-9 and the
  expected digit is mapped linearly onto the paper's 0-10 scale (x 10/9).
- Samples: probability readings are deterministic, so repeating one prompt gives one
  sample again. The ``eval_samples`` samples of Eq. 4 come from distinct evaluator framings
  (``views`` in prompts/mctsr_standards.json); the standards within a sample weigh equally.
- Feedback F (critique and suggestions) is built from the scores, not generated: the
  ``feedback_standards`` lowest-rated standards with their score and written suggestion.
  This keeps F principled, costs no call and parses no model text.
- Initialisation evaluates all ``n`` initial replies (same single call), not only A_0;
  Q(P) then follows Eq. 6, which is the paper's Q(P) = Q(A_0) when n = 1.
- Visit counts: a node is visited once when evaluated, and once more for every evaluation
  below it, so N(a) is the size of a's subtree and N(P) the number of answer nodes. The
  root has no parent ("adjusted for P"): its parent count is N(P) and its own count is the
  number of times it was expanded (initialisation plus each regeneration).
- Eq. 7 is read as ln(N(Parent) + 1), as its typesetting groups the argument and as in
  MCTSr. Eq. 3 is applied with ">=" (the equation) where the prose says ">".
- Eq. 5 uses the node's current Q (already moved by earlier backpropagations).
- Selection only considers actions the remaining budget can pay for (refine: 2 calls,
  regeneration: 3); ties go to P, then to the lower node id.
- A_n of Eq. 2 is the most recently created child of P.
- Generation (initial, refine, regeneration, meta-prompt) runs under the session's adapter;
  scoring runs on the base model, as the internal judge does: a policy never grades itself.
- A non-finite probability makes that node's Q = 0 (it is never preferred) and is recorded
  as the node's ``problem``; the turn continues.
- Final output: the ``n`` highest-Q nodes with distinct texts (ties: lower id first), then
  duplicates if fewer than ``n`` texts are distinct; the top one is the paper's output.
- The trained prompt is the plain counselor prompt P (no meta-prompt, no draft): the
  search improves the data, the adapter learns to produce it from P.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Literal, TypeVar

from counselor_engine.backends.base import Backend, BackendError, ChatMessage, GenerationParams
from counselor_engine.judge import JudgeContext, _clip, _render_context
from counselor_engine.seeds import stable_seed
from counselor_engine.text import strip_control

PROMPTS = Path(__file__).with_name("prompts")
SCORE_DIGITS = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9")
SCORE_MAX = 10.0
REFINE_CALLS = 2  # generate + evaluate
REGENERATE_CALLS = 3  # meta-prompt + generate + evaluate
ROOT = "P"
T = TypeVar("T")


# --- the standards --------------------------------------------------------------------------
@dataclass(frozen=True)
class Standard:
    id: str
    name: str
    description: str
    suggestion: str


@cache
def _standards_file() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((PROMPTS / "mctsr_standards.json").read_text())
    return data


def default_standards() -> tuple[Standard, ...]:
    return tuple(
        Standard(s["id"], s["name"], s["description"], s["suggestion"])
        for s in _standards_file()["standards"]
    )


def default_views() -> tuple[str, ...]:
    return tuple(str(v) for v in _standards_file()["views"])


@cache
def _prompt(name: str) -> str:
    return (PROMPTS / f"{name}.txt").read_text().strip()


# --- the equations --------------------------------------------------------------------------
def expected_score(row: Sequence[float]) -> float:
    """E[digit] over "0".."9" mapped onto 0-10; NaN when the row is unusable."""
    if len(row) != len(SCORE_DIGITS):
        raise ValueError(f"row: expected {len(SCORE_DIGITS)} probabilities, got {len(row)}")
    total = sum(row)
    if not math.isfinite(total) or total <= 0 or any(p < 0 for p in row):
        return math.nan
    digit = sum(k * p for k, p in enumerate(row)) / total
    return digit * SCORE_MAX / (len(SCORE_DIGITS) - 1)


def _checked(name: str, values: Sequence[float]) -> list[float]:
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{name}: at least one value is needed")
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name}: values must be finite")
    return out


def q_value(samples: Sequence[float]) -> float:
    """Eq. 4: Q(a) = (min R_a + mean R_a) / 2."""
    r = _checked("samples", samples)
    return 0.5 * (min(r) + sum(r) / len(r))


def backprop_value(q_parent: float, child_qs: Sequence[float]) -> float:
    """Eq. 5: Q'(p) = (Q(p) + max_c Q(c)) / 2."""
    (q,) = _checked("q_parent", [q_parent])
    return 0.5 * (q + max(_checked("child_qs", child_qs)))


def root_value(initial_qs: Sequence[float]) -> float:
    """Eq. 6: Q(P) = mean Q over P's children (the initial replies)."""
    qs = _checked("initial_qs", initial_qs)
    return sum(qs) / len(qs)


def uct(q: float, visits: int, parent_visits: int, *, c: float, epsilon: float) -> float:
    """Eq. 7: Q(s) + c * sqrt(ln(N(Parent(s)) + 1) / (N(s) + eps))."""
    if visits < 0 or parent_visits < 0:
        raise ValueError("visits: counts must be >= 0")
    if not (math.isfinite(q) and c >= 0 and epsilon > 0):
        raise ValueError("uct: q must be finite, c >= 0 and epsilon > 0")
    return q + c * math.sqrt(math.log(parent_visits + 1) / (visits + epsilon))


def adopt_candidate(q_new: float, q_root: float) -> bool:
    """Eq. 3: switch the active meta-prompt iff Q(A_{t+1}) >= Q(P)."""
    return q_new >= q_root


# --- configuration and records --------------------------------------------------------------
@dataclass(frozen=True)
class MctsrConfig:
    """Knobs of the search; c = 2.8 is the paper's (App. C.3)."""

    c: float = 2.8
    epsilon: float = 1e-6
    max_calls: int = 12  # backend calls of the search per turn (the judge's are extra)
    max_iterations: int | None = None
    eval_samples: int = 2
    feedback_standards: int = 3
    q_threshold: float | None = None  # stop once the best Q reaches it
    meta_max_new_tokens: int = 96
    max_meta_chars: int = 800
    context_chars: int = 1200
    response_chars: int = 800

    def __post_init__(self) -> None:
        if not (math.isfinite(self.c) and self.c >= 0):
            raise ValueError(f"mctsr.c: must be finite and >= 0, got {self.c!r}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"mctsr.epsilon: must be finite and > 0, got {self.epsilon!r}")
        if self.max_calls < REFINE_CALLS:
            raise ValueError(
                f"mctsr.max_calls: initialisation alone takes {REFINE_CALLS} calls, "
                f"got {self.max_calls}"
            )
        if self.max_iterations is not None and self.max_iterations < 0:
            raise ValueError("mctsr.max_iterations: must be >= 0 or None")
        if not 1 <= self.eval_samples <= len(default_views()):
            raise ValueError(
                f"mctsr.eval_samples: must lie in [1, {len(default_views())}] "
                f"(one per evaluator view), got {self.eval_samples}"
            )
        if not 1 <= self.feedback_standards <= len(default_standards()):
            raise ValueError("mctsr.feedback_standards: must lie in [1, 16]")
        if self.q_threshold is not None and not 0.0 <= self.q_threshold <= SCORE_MAX:
            raise ValueError("mctsr.q_threshold: must lie in [0, 10] or be None")
        if min(self.meta_max_new_tokens, self.max_meta_chars) < 1:
            raise ValueError("mctsr.meta_max_new_tokens and max_meta_chars must be positive")
        if min(self.context_chars, self.response_chars) < 1:
            raise ValueError("mctsr.context_chars and response_chars must be positive")


NodeKind = Literal["initial", "regenerate", "refine"]


@dataclass
class Node:
    """One drafted reply. ``parent`` is None for P's children."""

    id: int
    parent: int | None
    kind: NodeKind
    text: str
    meta: int  # index of the meta-prompt in force when it was drafted
    iteration: int  # 0 = initialisation
    depth: int  # 1 for P's children
    samples: list[float]  # R_a, one per evaluator view
    standard_scores: dict[str, float]  # mean over views, 0-10
    q_eval: float  # Eq. 4 at evaluation
    q: float  # current Q (Eq. 5 moves it)
    visits: int = 1
    children: list[int] = field(default_factory=list)
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parent": self.parent,
            "kind": self.kind,
            "text": self.text,
            "meta": self.meta,
            "iteration": self.iteration,
            "depth": self.depth,
            "samples": list(self.samples),
            "standards": dict(self.standard_scores),
            "q_eval": self.q_eval,
            "q": self.q,
            "visits": self.visits,
            "children": list(self.children),
            "problem": self.problem,
        }


@dataclass
class Iteration:
    """One select-expand-evaluate-backpropagate cycle, for the record."""

    index: int
    uct: dict[str, float]  # "P" or node id -> UCT value of every affordable choice
    selected: str
    action: Literal["refine", "regenerate"]
    node: int  # the new node
    q_new: float
    q_root_before: float
    adopted: bool | None  # Eq. 3 outcome (regeneration only)
    calls_used: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uct": dict(self.uct),
            "selected": self.selected,
            "action": self.action,
            "node": self.node,
            "q_new": self.q_new,
            "q_root_before": self.q_root_before,
            "adopted": self.adopted,
            "calls_used": self.calls_used,
        }


@dataclass
class SearchResult:
    """The whole tree, how it grew, and the chosen candidates (JSON-ready via to_dict)."""

    nodes: list[Node]
    root_q: float
    root_visits: int
    root_expansions: int
    meta_prompts: list[str]
    active_meta: int
    iterations: list[Iteration]
    calls_used: int
    max_calls: int
    stop_reason: str
    chosen: list[int]
    c: float

    @property
    def candidates(self) -> list[str]:
        return [self.nodes[i].text for i in self.chosen]

    @property
    def best(self) -> Node:
        return self.nodes[self.chosen[0]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": "mctsr",
            "c": self.c,
            "node_count": len(self.nodes),
            "calls_used": self.calls_used,
            "max_calls": self.max_calls,
            "stop_reason": self.stop_reason,
            "root": {
                "q": self.root_q,
                "visits": self.root_visits,
                "expansions": self.root_expansions,
            },
            "chosen": list(self.chosen),
            "q_values": [self.nodes[i].q for i in self.chosen],
            "meta_prompts": list(self.meta_prompts),
            "active_meta": self.active_meta,
            "nodes": [n.to_dict() for n in self.nodes],
            "iterations": [it.to_dict() for it in self.iterations],
        }


@dataclass
class _Evaluation:
    samples: list[float]
    standard_scores: dict[str, float]
    q: float
    problem: str = ""


# --- the search ----------------------------------------------------------------------------
class MctsrSearch:
    """One search per turn; create it per call or reuse it (it keeps no turn state)."""

    def __init__(
        self,
        backend: Backend,
        config: MctsrConfig | None = None,
        *,
        adapter: str | None = None,
        timeout_s: float | None = None,
        standards: Sequence[Standard] | None = None,
        views: Sequence[str] | None = None,
    ) -> None:
        self.backend = backend
        self.config = config or MctsrConfig()
        self.adapter = adapter
        self.timeout_s = timeout_s
        self.standards = tuple(standards) if standards is not None else default_standards()
        all_views = tuple(views) if views is not None else default_views()
        if not self.standards:
            raise ValueError("standards: at least one standard is needed")
        if len(all_views) < self.config.eval_samples:
            raise ValueError("views: fewer evaluator views than eval_samples")
        self.views = all_views[: self.config.eval_samples]

    async def run(
        self,
        prompt: Sequence[ChatMessage],
        context: JudgeContext,
        n: int,
        params: GenerationParams,
    ) -> SearchResult:
        """Search, then return the ``n`` best distinct nodes (see the module docstring)."""
        if n < 1:
            raise ValueError("n: at least one candidate is needed")
        state = _State(self, list(prompt), context, params)
        await state.initialise(n)
        await state.iterate()
        return state.result(n)


class _State:
    """The mutable tree of one run; every backend call goes through :meth:`_call`."""

    def __init__(
        self,
        search: MctsrSearch,
        prompt: list[ChatMessage],
        context: JudgeContext,
        params: GenerationParams,
    ) -> None:
        self.s = search
        self.cfg = search.config
        self.prompt = prompt
        self.ctx = _render_context(context, self.cfg.context_chars)
        self.params = params
        self.nodes: list[Node] = []
        self.meta_prompts = [_prompt("mctsr_meta_initial")]
        self.active_meta = 0
        self.root_q = 0.0
        self.root_visits = 0
        self.root_expansions = 0
        self.iterations: list[Iteration] = []
        self.calls = 0
        self.stop_reason = ""

    # -- backend access ------------------------------------------------------------------
    async def _call(self, awaitable: Awaitable[T]) -> T:
        if self.calls >= self.cfg.max_calls:  # a bug, not a user error: never overspend
            raise RuntimeError("mctsr: call budget exceeded")
        self.calls += 1
        if self.s.timeout_s is None:
            return await awaitable
        return await asyncio.wait_for(awaitable, timeout=self.s.timeout_s)

    def _params(self, *, max_new_tokens: int | None = None) -> GenerationParams:
        p = self.params
        seed = p.seed
        if seed is not None:
            seed = stable_seed(seed, "mctsr", self.calls)
        return replace(p, max_new_tokens=max_new_tokens or p.max_new_tokens, seed=seed)

    async def _generate(self, prompt: list[ChatMessage], n: int, **kw: int) -> list[str]:
        params = self._params(**kw)
        texts = await self._call(
            self.s.backend.generate(prompt, n=n, params=params, adapter=self.s.adapter)
        )
        if len(texts) != n:
            raise BackendError(f"backend returned {len(texts)} texts, expected {n}")
        return [strip_control(t) for t in texts]

    # -- prompts --------------------------------------------------------------------------
    def _with_guidance(self, *blocks: str) -> list[ChatMessage]:
        """P with extra blocks appended to its system message (one is made if missing)."""
        extra = "\n\n".join(blocks)
        msgs = list(self.prompt)
        if msgs and msgs[0].role == "system":
            return [ChatMessage("system", msgs[0].content + "\n\n" + extra), *msgs[1:]]
        return [ChatMessage("system", extra), *msgs]

    def _approach(self, meta: int) -> str:
        return _prompt("mctsr_approach").format(meta=self.meta_prompts[meta])

    def feedback(self, node: Node) -> str:
        """F: the weakest standards with their scores and suggestions (no model text)."""
        by_id = {s.id: s for s in self.s.standards}
        ranked = sorted(by_id, key=lambda sid: (node.standard_scores.get(sid, 0.0), sid))
        lines = []
        for sid in ranked[: self.cfg.feedback_standards]:
            st = by_id[sid]
            score = node.standard_scores.get(sid, 0.0)
            lines.append(f"- {st.name} (scored {score:.1f}/10): {st.suggestion}")
        return "\n".join(lines)

    def _eval_prompts(self, text: str) -> list[list[ChatMessage]]:
        reply = _clip(text, self.cfg.response_chars)
        prompts = []
        for view in self.s.views:
            system = _prompt("mctsr_evaluate").format(view=view)
            for st in self.s.standards:
                body = (
                    f"{self.ctx}\n\n<reply>\n{reply}\n</reply>\n\n"
                    f"Standard: {st.name}. {st.description}\nRate 0-9."
                )
                prompts.append([ChatMessage("system", system), ChatMessage("user", body)])
        return prompts

    # -- evaluation (Eq. 4) ---------------------------------------------------------------
    async def _evaluate(self, texts: Sequence[str]) -> list[_Evaluation]:
        """All texts x views x standards in ONE batched call, on the base model."""
        prompts = [p for t in texts for p in self._eval_prompts(t)]
        rows = await self._call(self.s.backend.choice_probabilities(prompts, SCORE_DIGITS))
        if len(rows) != len(prompts):
            raise BackendError(f"backend returned {len(rows)} rows, expected {len(prompts)}")
        per_view, per_text = len(self.s.standards), len(self.s.standards) * len(self.s.views)
        out = []
        for k in range(len(texts)):
            scores = [expected_score(r) for r in rows[k * per_text : (k + 1) * per_text]]
            if not all(math.isfinite(x) for x in scores):
                out.append(_Evaluation([], {}, 0.0, "non-finite self-evaluation"))
                continue
            samples = [
                sum(scores[v * per_view : (v + 1) * per_view]) / per_view
                for v in range(len(self.s.views))
            ]
            standard_scores = {
                st.id: sum(scores[v * per_view + j] for v in range(len(self.s.views)))
                / len(self.s.views)
                for j, st in enumerate(self.s.standards)
            }
            out.append(_Evaluation(samples, standard_scores, q_value(samples)))
        return out

    def _add(
        self, parent: int | None, kind: NodeKind, text: str, meta: int, ev: _Evaluation
    ) -> Node:
        depth = 1 if parent is None else self.nodes[parent].depth + 1
        node = Node(
            id=len(self.nodes), parent=parent, kind=kind, text=text, meta=meta,
            iteration=len(self.iterations) + (0 if kind == "initial" else 1), depth=depth,
            samples=ev.samples, standard_scores=ev.standard_scores, q_eval=ev.q, q=ev.q,
            problem=ev.problem,
        )  # fmt: skip
        self.nodes.append(node)
        if parent is not None:
            self.nodes[parent].children.append(node.id)
        return node

    def _initial(self) -> list[Node]:
        return [n for n in self.nodes if n.parent is None]

    # -- backpropagation (Eq. 5-6) --------------------------------------------------------
    def _backpropagate(self, node: Node) -> None:
        current = node.parent
        while current is not None:
            p = self.nodes[current]
            p.q = backprop_value(p.q, [self.nodes[c].q for c in p.children])
            p.visits += 1
            current = p.parent
        self.root_visits += 1
        self.root_q = root_value([n.q for n in self._initial()])

    # -- the phases -----------------------------------------------------------------------
    async def initialise(self, n: int) -> None:
        texts = await self._generate(self._with_guidance(self._approach(0)), n)
        for text, ev in zip(texts, await self._evaluate(texts), strict=True):
            self._add(None, "initial", text, 0, ev)
        self.root_visits = n
        self.root_expansions = 1
        self.root_q = root_value([node.q for node in self.nodes])

    def _choices(self) -> dict[str, float]:
        """UCT (Eq. 7) of every choice the remaining budget can pay for; P first."""
        left = self.cfg.max_calls - self.calls
        c, eps = self.cfg.c, self.cfg.epsilon
        values: dict[str, float] = {}
        if left >= REGENERATE_CALLS:
            values[ROOT] = uct(
                self.root_q, self.root_expansions, self.root_visits, c=c, epsilon=eps
            )
        if left >= REFINE_CALLS:
            for node in self.nodes:
                parent_visits = (
                    self.root_visits if node.parent is None else self.nodes[node.parent].visits
                )
                values[str(node.id)] = uct(node.q, node.visits, parent_visits, c=c, epsilon=eps)
        return values

    async def iterate(self) -> None:
        cfg = self.cfg
        while True:
            if cfg.max_iterations is not None and len(self.iterations) >= cfg.max_iterations:
                self.stop_reason = "max_iterations"
                return
            if cfg.q_threshold is not None and max(n.q for n in self.nodes) >= cfg.q_threshold:
                self.stop_reason = "q_threshold"
                return
            values = self._choices()
            if not values:
                self.stop_reason = "budget"
                return
            selected = max(values, key=lambda k: values[k])  # first maximum: P, then low id
            q_root_before = self.root_q
            if selected == ROOT:
                node, adopted = await self._regenerate()
            else:
                node, adopted = await self._refine(self.nodes[int(selected)]), None
            self.iterations.append(
                Iteration(
                    index=len(self.iterations) + 1, uct=values, selected=selected,
                    action="regenerate" if selected == ROOT else "refine", node=node.id,
                    q_new=node.q_eval, q_root_before=q_root_before, adopted=adopted,
                    calls_used=self.calls,
                )
            )  # fmt: skip

    async def _regenerate(self) -> tuple[Node, bool]:
        """Eq. 2 (m_cand from m_active and F_n), a new initial reply, then Eq. 3."""
        latest = self._initial()[-1]
        body = (
            f"Current guidance:\n{self.meta_prompts[self.active_meta]}\n\n"
            f"Review of a reply written with it:\n{self.feedback(latest)}"
        )
        rewrite = [
            ChatMessage("system", _prompt("mctsr_meta_rewrite")),
            ChatMessage("user", body),
        ]
        (draft,) = await self._generate(rewrite, 1, max_new_tokens=self.cfg.meta_max_new_tokens)
        m_cand = draft.strip()[: self.cfg.max_meta_chars].strip()
        if not m_cand:  # the model wrote nothing usable: fold the feedback in verbatim
            m_cand = f"{self.meta_prompts[self.active_meta]}\n{self.feedback(latest)}"
        self.meta_prompts.append(m_cand)
        cand = len(self.meta_prompts) - 1
        (text,) = await self._generate(self._with_guidance(self._approach(cand)), 1)
        (ev,) = await self._evaluate([text])
        q_root_before = self.root_q
        node = self._add(None, "regenerate", text, cand, ev)
        adopted = adopt_candidate(node.q, q_root_before)
        if adopted:
            self.active_meta = cand
        self.root_expansions += 1
        self._backpropagate(node)
        return node, adopted

    async def _refine(self, target: Node) -> Node:
        """a' = M(a || F_a || m_active): a child of the selected node, then Eq. 5-6."""
        refine = _prompt("mctsr_refine").format(
            draft=_clip(target.text, self.cfg.response_chars), feedback=self.feedback(target)
        )
        (text,) = await self._generate(
            self._with_guidance(self._approach(self.active_meta), refine), 1
        )
        (ev,) = await self._evaluate([text])
        node = self._add(target.id, "refine", text, self.active_meta, ev)
        self._backpropagate(node)
        return node

    def result(self, n: int) -> SearchResult:
        ranked = sorted(self.nodes, key=lambda node: (-node.q, node.id))
        chosen: list[int] = []
        seen: set[str] = set()
        for node in ranked:
            if node.text not in seen:
                seen.add(node.text)
                chosen.append(node.id)
        chosen += [node.id for node in ranked if node.id not in chosen]
        return SearchResult(
            nodes=self.nodes, root_q=self.root_q, root_visits=self.root_visits,
            root_expansions=self.root_expansions, meta_prompts=self.meta_prompts,
            active_meta=self.active_meta, iterations=self.iterations, calls_used=self.calls,
            max_calls=self.cfg.max_calls, stop_reason=self.stop_reason, chosen=chosen[:n],
            c=self.cfg.c,
        )  # fmt: skip
