"""LiPO on a LoRA adapter with peft: the physical training of one round (paper Sec. 2.3).

No Django here: numbers and files in, numbers and files out, so the benchmark and the
tests drive it directly and ``training_worker.round`` only adds the database around it.

Choices that the paper leaves to the backend:

- LoRA targets the attention projections ``q_proj, k_proj, v_proj, o_proj`` (rank from
  settings, ``lora_alpha = 2 * rank``, no dropout). A round that continues from an active
  version loads that adapter and keeps its own config, so lineage stays one shape.
- The model stays in ``eval()`` while training: there is no dropout to switch on, and
  this way the policy at step 0 equals the parent exactly.
- Reference log-probabilities come from the same model under ``disable_adapter()`` and
  ``no_grad`` (the frozen backbone, Eq. 5's denominator), once per round.
- Log-probabilities are sums over response tokens only (EOS included), computed by
  ``counselor_engine.torchkit.response_logprobs``, the serving backend's function too
  (one tokenisation, one mask; the LM head runs on response positions only).
- Each candidate is scored once per step however many edges it is in; micro-batches are
  whole groups sorted by length, so padding stays small and the accumulated gradient is
  exactly the gradient of Eq. 6 over the whole batch.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from counselor_engine.backends.base import ChatMessage
from counselor_engine.lipo.config import LipoConfig
from counselor_engine.lipo.loss import pairwise_dpo_loss, population_loss
from counselor_engine.soca import Edge
from counselor_engine.torchkit import render_prompt, response_logprobs

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class TrainGroup:
    """One buffered candidate group: a prompt, its candidates and SOCA edges."""

    key: str
    modality: str
    prompt: Sequence[dict[str, str]]
    candidates: Sequence[str]
    edges: Sequence[Edge]


@dataclass
class Prepared:
    """A group ready for the model: the rendered prompt and its padded row length."""

    group: TrainGroup
    prompt_text: str
    length: int  # the longest row, capped at max_length
    rows: list[int]  # each candidate's row length, capped


@dataclass
class StepStats:
    loss: float
    grad_norm: float
    finite: bool
    forwards: int = 0  # micro-batches
    padded_tokens: int = 0
    real_tokens: int = 0


@dataclass
class Counters:
    """How much work the model did; the benchmark reports padding waste from it."""

    padded_tokens: int = 0
    real_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


def to_edges(raw: Sequence[dict[str, Any]] | Sequence[Edge], n: int) -> list[Edge]:
    """Stored ``{winner, loser, weight}`` dicts as checked :class:`Edge` objects."""
    edges: list[Edge] = []
    for item in raw:
        edge = (
            item
            if isinstance(item, Edge)
            else Edge(int(item["winner"]), int(item["loser"]), float(item["weight"]))
        )
        if not (0 <= edge.winner < n and 0 <= edge.loser < n) or edge.winner == edge.loser:
            raise ValueError(f"edge {edge} does not fit {n} candidates")
        if not (edge.weight > 0 and math.isfinite(edge.weight)):
            raise ValueError(f"edge {edge} has a non-positive weight")
        edges.append(edge)
    if not edges:
        raise ValueError("group has no edges")
    return edges


class LipoTrainer:
    """A base model with one trainable LoRA adapter, and the LiPO loop around it."""

    def __init__(
        self,
        model_path: Path | str,
        *,
        parent: Path | str | None,
        config: LipoConfig,
        device: str | None = None,
    ) -> None:
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        base = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        base.to(self.device)  # type: ignore[arg-type]  # in place; transformers' stub is odd
        with (
            torch.random.fork_rng(devices=[] if self.device.type == "cpu" else None),
            warnings.catch_warnings(),
        ):
            # peft calls a transformers API deprecated in v5; nothing for us to act on.
            warnings.filterwarnings("ignore", ".*is_gradient_checkpointing.*", FutureWarning)
            torch.manual_seed(config.seed)
            if parent is not None:
                model = PeftModel.from_pretrained(base, str(parent), is_trainable=True)
            else:
                lora = LoraConfig(
                    r=config.lora_rank,
                    lora_alpha=config.lora_alpha,
                    lora_dropout=0.0,
                    target_modules=list(config.target_modules),
                    task_type="CAUSAL_LM",
                )
                model = get_peft_model(base, lora)
        self.model: Any = model.eval()
        self.initial_state = self.lora_state()
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=0.0)
        self.counters = Counters()

    # -- data ---------------------------------------------------------------------------

    def prepare(self, groups: Sequence[TrainGroup]) -> list[Prepared]:
        """Render each prompt once and measure each group's longest row (capped)."""
        out: list[Prepared] = []
        eos = 1 if self.tokenizer.eos_token_id is not None else 0
        for group in groups:
            text = render_prompt(self.tokenizer, _messages(group.prompt))
            p_len = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            rows = [
                min(
                    p_len + len(self.tokenizer(c, add_special_tokens=False)["input_ids"]) + eos,
                    self.config.max_length,
                )
                for c in group.candidates
            ]
            out.append(Prepared(group, text, max(rows), rows))
        return out

    def plan(self, prepared: Sequence[Prepared]) -> list[list[int]]:
        """Micro-batches of whole groups: longest first, each within the token budget.

        Sorting by length keeps rows of one forward pass close in length (little
        padding); the longest batch comes first so a memory problem shows at once.
        """
        order = sorted(range(len(prepared)), key=lambda i: -prepared[i].length)
        batches: list[list[int]] = []
        rows = width = 0
        for i in order:
            n, length = len(prepared[i].group.candidates), prepared[i].length
            if batches and (rows + n) * max(width, length) <= self.config.micro_batch_tokens:
                batches[-1].append(i)
                rows, width = rows + n, max(width, length)
            else:
                batches.append([i])
                rows, width = n, length
        return batches

    def _logprobs(self, groups: Sequence[Prepared]) -> torch.Tensor:
        prompts = [p.prompt_text for p in groups for _ in p.group.candidates]
        responses = [c for p in groups for c in p.group.candidates]
        width = max(p.length for p in groups)
        self.counters.padded_tokens += width * len(responses)
        self.counters.real_tokens += sum(sum(p.rows) for p in groups)
        return response_logprobs(
            self.model, self.tokenizer, prompts, responses, max_length=self.config.max_length
        )

    def _per_group(
        self, prepared: Sequence[Prepared], batch: list[int], values: torch.Tensor
    ) -> Iterator[tuple[int, torch.Tensor]]:
        offset = 0
        for i in batch:
            n = len(prepared[i].group.candidates)
            yield i, values[offset : offset + n]
            offset += n

    @torch.no_grad()
    def sequence_logprobs(
        self, prepared: Sequence[Prepared], *, adapter: bool
    ) -> list[torch.Tensor]:
        """Per group, each candidate's response log-probability; with ``adapter=False``
        the adapter is disabled: the frozen backbone, i.e. the reference pi_{theta,0}."""
        out: list[torch.Tensor] = [torch.empty(0)] * len(prepared)
        context = contextlib.nullcontext() if adapter else self.model.disable_adapter()
        with context:
            for batch in self.plan(prepared):
                values = self._logprobs([prepared[i] for i in batch]).detach()
                for i, lp in self._per_group(prepared, batch, values):
                    out[i] = lp
        return out

    def reference(self, prepared: Sequence[Prepared]) -> list[torch.Tensor]:
        """Reference log-probs, computed once per round and cached by the caller."""
        return self.sequence_logprobs(prepared, adapter=False)

    # -- optimisation -------------------------------------------------------------------

    def step(self, prepared: Sequence[Prepared], reference: Sequence[torch.Tensor]) -> StepStats:
        """One AdamW step on Eq. 6 over the whole batch, accumulated over micro-batches.

        1. Per micro-batch (whole groups): policy log-probs with the adapter on.
        2. h = beta * (policy - reference) per candidate (Eq. 5's utility), on every
           SOCA edge of the group.
        3. The micro-batch contributes its share of the whole batch's objective
           (:meth:`batch_loss`), so the sum over micro-batches is exactly Eq. 6 (LiPO)
           or the mean over all pairs (pairwise DPO).
        4. Backward per micro-batch (gradients accumulate); then require a finite loss and
           gradient norm, else skip the update and report ``finite=False``.
        """
        self.optimizer.zero_grad(set_to_none=True)
        total, batches = 0.0, self.plan(prepared)
        all_pairs = sum(len(p.group.edges) for p in prepared)
        padded0, real0 = self.counters.padded_tokens, self.counters.real_tokens
        for batch in batches:
            policy = self._logprobs([prepared[i] for i in batch])
            pairs = []
            for i, lp in self._per_group(prepared, batch, policy):
                h = self.config.beta * (lp - reference[i].to(lp.device))
                pairs.append((h, prepared[i].group.edges))
            if not all(bool(torch.isfinite(h.detach()).all()) for h, _ in pairs):
                return self._not_finite(len(batches))
            loss = self.batch_loss(pairs, groups=len(prepared), pairs=all_pairs)
            loss.backward()
            total += float(loss.detach())
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grad_norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
        if not (math.isfinite(total) and math.isfinite(grad_norm)):
            return self._not_finite(len(batches))
        self.optimizer.step()
        return StepStats(
            loss=total,
            grad_norm=grad_norm,
            finite=True,
            forwards=len(batches),
            padded_tokens=self.counters.padded_tokens - padded0,
            real_tokens=self.counters.real_tokens - real0,
        )

    def batch_loss(
        self, part: Sequence[tuple[torch.Tensor, Sequence[Edge]]], *, groups: int, pairs: int
    ) -> torch.Tensor:
        """This micro-batch's share of the objective over a batch of ``groups`` groups
        holding ``pairs`` edges in all.

        - ``lipo``: Eq. 6 restricted to the part, times |part| / groups (each group's
          Eq. 5 loss weighs 1 / groups).
        - ``pairwise_dpo``: the unit-weight pair mean over the part, times its pair count
          / pairs (each pair weighs 1 / pairs, whatever group it came from).
        """
        if self.config.loss == "pairwise_dpo":
            count = sum(len(edges) for _, edges in part)
            return pairwise_dpo_loss(part) * (count / pairs)
        return population_loss(part) * (len(part) / groups)

    def _not_finite(self, forwards: int) -> StepStats:
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(loss=math.nan, grad_norm=math.nan, finite=False, forwards=forwards)

    def utilities(
        self, prepared: Sequence[Prepared], reference: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        """h per candidate under the adapter weights currently loaded (no gradients)."""
        policy = self.sequence_logprobs(prepared, adapter=True)
        return [
            self.config.beta * (p - r.to(p.device)) for p, r in zip(policy, reference, strict=True)
        ]

    # -- adapter weights ----------------------------------------------------------------

    def lora_state(self) -> dict[str, torch.Tensor]:
        """A detached copy of the adapter weights."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    @contextlib.contextmanager
    def using(self, state: dict[str, torch.Tensor]) -> Iterator[None]:
        """Temporarily load other adapter weights (e.g. the parent's) into the model."""
        from peft import set_peft_model_state_dict

        saved = self.lora_state()
        set_peft_model_state_dict(self.model, state)
        try:
            yield
        finally:
            set_peft_model_state_dict(self.model, saved)

    def update_ratio(
        self, before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]
    ) -> float:
        """||dW(after) - dW(before)||_F / ||W_base||_F over every adapted matrix, where
        dW = B A * scaling: how far the round moved the model, relative to its size."""
        from peft.tuners.lora import LoraLayer

        moved = base = 0.0
        for name, module in self.model.named_modules():
            if not isinstance(module, LoraLayer) or "default" not in module.lora_A:
                continue
            prefix = _state_prefix(name)
            scaling = float(module.scaling["default"])
            delta = []
            for state in (before, after):
                a = state[f"{prefix}.lora_A.weight"].float()
                b = state[f"{prefix}.lora_B.weight"].float()
                delta.append(b @ a * scaling)
            moved += float((delta[1] - delta[0]).pow(2).sum())
            weight: Any = module.get_base_layer().weight
            base += float(weight.detach().float().pow(2).sum())
        return math.sqrt(moved) / max(math.sqrt(base), 1e-12)

    # -- generation and files -----------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompt: Sequence[dict[str, str]], *, max_new_tokens: int) -> str:
        """One greedy reply under the adapter weights currently loaded."""
        text = render_prompt(self.tokenizer, _messages(prompt))
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        ids = ids[:, -self.config.max_length :].to(self.device)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        new = out[0, ids.shape[1] :].tolist()
        eos = self.tokenizer.eos_token_id
        if eos in new:
            new = new[: new.index(eos)]
        return str(self.tokenizer.decode(new, skip_special_tokens=True)).strip()

    def save(self, directory: Path) -> Path:
        """Save the adapter (peft ``save_pretrained``: adapter_config.json and
        adapter_model.safetensors) into a NEW folder ``directory``.

        Written into a hidden sibling first and renamed into place, so a crash never
        leaves a half-written version; an existing folder is never overwritten. Files are
        made read-only: nothing should write them again.
        """
        directory = Path(directory)
        if directory.exists():
            raise FileExistsError(f"{directory} exists: versions are never overwritten")
        directory.parent.mkdir(parents=True, exist_ok=True)
        staging = directory.parent / f".{directory.name}.partial"
        shutil.rmtree(staging, ignore_errors=True)  # a previous attempt that died here
        self.model.save_pretrained(str(staging))
        for path in staging.iterdir():
            path.chmod(0o444)
        staging.rename(directory)  # atomic on one file system
        return directory


def _messages(prompt: Sequence[dict[str, str]]) -> list[ChatMessage]:
    return [ChatMessage(m["role"], m["content"]) for m in prompt]  # type: ignore[arg-type]


def _state_prefix(module_name: str) -> str:
    """peft state-dict keys drop the adapter name: ``...q_proj.lora_A.weight``."""
    return module_name
