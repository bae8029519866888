"""The language-model toolkit shared by serving and training: chat rendering, the
(prompt, response) token layout, response log-probabilities and shared-prefix trees.

Its own module so that the LiPO trainer (training_worker) and the transformers backend
both import it and neither imports the other: training does not depend on the serving
backend. Torch only; no transformers import (the model and tokenizer come in as objects).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from counselor_engine.backends.base import Prompt

__all__ = [
    "PrefixNode",
    "decoder_and_head",
    "encode_pairs",
    "pair_ids",
    "prefix_tree",
    "render_prompt",
    "response_logprobs",
]


def render_prompt(tokenizer: Any, prompt: Prompt) -> str:
    """The chat template applied to ``prompt``, ending with the assistant header."""
    messages = [{"role": m.role, "content": m.content} for m in prompt]
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def encode_pairs(
    tokenizer: Any,
    prompts_text: Sequence[str],
    responses_text: Sequence[str],
    *,
    max_length: int,
    append_eos: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, attention mask and response mask for (rendered prompt, response) pairs.

    Prompt and response are tokenized separately and concatenated as ids, so the boundary
    is exact whatever the tokenizer would merge across it. With ``append_eos`` the
    response ends with the EOS token: a preference over replies includes where they stop.
    Too long: the prompt loses tokens from its start (the recent context matters most),
    then the response is cut at its end. Rows are right-padded.
    """
    if len(prompts_text) != len(responses_text):
        raise ValueError("prompts_text and responses_text differ in length")
    eos = tokenizer.eos_token_id
    rows = [
        pair_ids(tokenizer, prompt, response, max_length=max_length, append_eos=append_eos)
        for prompt, response in zip(prompts_text, responses_text, strict=True)
    ]
    width = max((len(p) + len(r) for p, r in rows), default=0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)
    input_ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    response_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (p_ids, r_ids) in enumerate(rows):
        ids = p_ids + r_ids
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[i, : len(ids)] = 1
        response_mask[i, len(p_ids) : len(ids)] = True
    return input_ids, attention, response_mask


def pair_ids(
    tokenizer: Any, prompt_text: str, response_text: str, *, max_length: int, append_eos: bool
) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of one pair as :func:`encode_pairs` lays them out: each
    tokenized alone, EOS after the response, the prompt cut from its start when too long."""
    eos = tokenizer.eos_token_id
    p_ids = list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    r_ids = list(tokenizer(response_text, add_special_tokens=False)["input_ids"])
    if append_eos and eos is not None:
        r_ids.append(int(eos))
    r_ids = r_ids[:max_length]
    keep = max_length - len(r_ids)
    return (p_ids[len(p_ids) - keep :] if keep > 0 else []), r_ids


def decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """(decoder, output projection) of a causal LM, peft-wrapped or not; None when the
    model post-processes its logits (e.g. soft-capping), which the head-only path would skip."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    try:
        decoder, head = base.get_decoder(), base.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if decoder is None or head is None:
        return None
    return decoder, head


def response_logprobs(
    model: Any,
    tokenizer: Any,
    prompts_text: Sequence[str],
    responses_text: Sequence[str],
    *,
    max_length: int,
    append_eos: bool = True,
) -> torch.Tensor:
    """Sum of log p(response token | everything before it), per pair: shape ``[batch]``.

    Differentiable (no ``no_grad`` here): the LiPO trainer calls it with the adapter
    enabled for the policy and under ``model.disable_adapter()`` for the reference.
    ``prompts_text`` are already-rendered prompts (see :func:`render_prompt`). The
    response mask is explicit: prompt and padding positions contribute exactly zero.

    The LM head is applied to the hidden states at response positions only, not to the
    whole sequence. With SmolLM2's 49,152-token vocabulary, full ``[batch, length, vocab]``
    logits and their gradient would dominate training memory, and the prompt positions
    never need them. Models whose logits are more than a linear head on the last hidden
    state (see :func:`decoder_and_head`) take the plain forward instead.
    """
    input_ids, attention, response_mask = encode_pairs(
        tokenizer, prompts_text, responses_text, max_length=max_length, append_eos=append_eos
    )
    device = next(model.parameters()).device
    input_ids, attention, response_mask = (
        input_ids.to(device),
        attention.to(device),
        response_mask.to(device),
    )
    # Position t predicts token t+1: shift, then keep only the response targets.
    targets = input_ids[:, 1:]
    mask = response_mask[:, 1:]
    parts = decoder_and_head(model)
    if parts is None:
        logits = model(input_ids=input_ids, attention_mask=attention).logits
        picked = logits[:, :-1][mask].float()
    else:
        decoder, head = parts
        hidden = decoder(input_ids=input_ids, attention_mask=attention).last_hidden_state
        picked = head(hidden[:, :-1][mask]).float()
    token_lp = torch.log_softmax(picked, dim=-1).gather(-1, targets[mask].unsqueeze(-1))
    rows = torch.arange(input_ids.shape[0], device=device).unsqueeze(1).expand_as(mask)[mask]
    out = torch.zeros(input_ids.shape[0], dtype=token_lp.dtype, device=device)
    return out.index_add(0, rows, token_lp.squeeze(-1))


# A shared prefix is computed once, as its own forward with its KV cache copied to each
# continuation, only when that saves at least this many token computations: a few tokens
# do not pay for the extra forward call and copy.
_MIN_SAVING = 32
# Nesting depth of shared prefixes: bounds the recursion on pathological batches (each
# prompt a prefix of the next); deeper prefixes are simply not shared.
_MAX_DEPTH = 16


@dataclass(eq=False)
class PrefixNode:
    """A token prefix shared by several prompts of a batch (or by longer shared prefixes)."""

    tokens: list[int]  # from the start of the prompt
    children: list[int | PrefixNode]  # a prompt (its index) or a longer shared prefix


def prefix_tree(
    rows: Sequence[Sequence[int]], *, min_saving: int = _MIN_SAVING, max_depth: int = _MAX_DEPTH
) -> list[int | PrefixNode]:
    """The token prefixes that rows share, nested: the top items of a forest whose leaves
    are the row indices (each exactly once).

    This is the compacted trie of the rows (a node wherever rows that agreed so far
    diverge), built from their lexicographic order, where every set of rows with a
    common prefix is a run and a run's common prefix is the minimum of its neighbours'
    common prefixes. Generic in the rows: for the judge's batch it finds system prompt +
    conversation, then + reply A, then + reply B (one node per pair and order), then the
    criterion lines as leaves, so every shared token is computed once.

    A node is kept only if it saves ``min_saving`` token computations: ``(children - 1)
    x`` the tokens it adds to its parent; otherwise its children move up to its parent.
    Every child's tokens strictly extend its parent's: a row that ends where others go on
    (a prefix of another row, or a duplicate) keeps at least its last token to itself,
    since its next-token distribution is read there.
    """
    order = sorted(range(len(rows)), key=lambda i: list(rows[i]))
    lcp = [0] * len(order)  # lcp[k]: common prefix of sorted rows k-1 and k
    for k in range(1, len(order)):
        a, b = rows[order[k - 1]], rows[order[k]]
        n, limit = 0, min(len(a), len(b))
        while n < limit and a[n] == b[n]:
            n += 1
        lcp[k] = n

    def node(lo: int, hi: int, depth: int, own: int, level: int) -> list[int | PrefixNode]:
        """Sorted rows lo:hi under one node of ``own`` tokens, below a parent of
        ``depth``; or, when that node does not pay, its children in its place."""
        children = below(lo, hi, own, level + 1)
        if (len(children) - 1) * (own - depth) >= min_saving:
            return [PrefixNode(list(rows[order[lo]][:own]), children)]
        return children

    def below(lo: int, hi: int, depth: int, level: int) -> list[int | PrefixNode]:
        """The children of a ``depth``-token prefix that sorted rows lo:hi share (every
        one of them is longer than that)."""
        if level >= max_depth:
            return list(order[lo:hi])
        items: list[int | PrefixNode] = []
        start = lo
        for k in range(lo + 1, hi + 1):
            if k < hi and lcp[k] > depth:
                continue  # order[k] shares a token past depth with order[k - 1]: same run
            if k - start == 1:
                items.append(order[start])
                start = k
                continue
            common = min(lcp[start + 1 : k])  # > depth
            ends = start  # rows exactly ``common`` long sort first in their run
            while ends < k and len(rows[order[ends]]) == common:
                ends += 1
            if ends == start:
                items += node(start, k, depth, common, level)
            elif common - 1 > depth:  # share one token less: those rows keep their last
                items += node(start, k, depth, common - 1, level)
            else:  # they end one token past depth: leaves here, the rest below
                items += order[start:ends]
                if k - ends == 1:
                    items.append(order[ends])
                elif k > ends:
                    items += node(ends, k, depth, common, level)
            start = k
        return items

    return below(0, len(order), 0, 0)
