"""Response log-probabilities for training, with the LM head applied to response tokens only.

Same tokenisation and masks as the serving side (``encode_pairs`` from the transformers
backend; the engine's ``response_logprobs`` gives the same numbers, a test checks it),
but the decoder's hidden states are selected at response positions BEFORE the output
projection. With a large vocabulary (SmolLM2: 49,152) the full ``[batch, length, vocab]``
logits of a plain forward, and their gradient, dominate memory and a good share of the
compute; prompt positions never needed them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from counselor_engine.backends.transformers_backend import encode_pairs, response_logprobs


def _parts(model: Any) -> tuple[Any, Any] | None:
    """(decoder, output projection) of a causal LM, peft-wrapped or not; None when the
    model post-processes its logits (e.g. soft-capping), which this path would skip."""
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


def sequence_logprobs(
    model: Any,
    tokenizer: Any,
    prompts_text: Sequence[str],
    responses_text: Sequence[str],
    *,
    max_length: int,
) -> torch.Tensor:
    """Sum over response tokens (EOS included) of log p(token | everything before it),
    shape ``[batch]``; differentiable. Falls back to the engine's ``response_logprobs``
    for models whose logits are more than a linear head on the hidden state.

    1. Encode exactly as serving does: prompt ids + response ids (+EOS), right-padded,
       with an explicit response mask.
    2. Run the decoder (adapters included) to get hidden states.
    3. Keep the hidden states at positions t whose next token t+1 is a response token.
    4. Project only those through the LM head, log-softmax, pick the target token.
    5. Sum per row (index_add): prompt and padding contribute exactly zero.
    """
    parts = _parts(model)
    if parts is None:
        return response_logprobs(
            model, tokenizer, prompts_text, responses_text, max_length=max_length
        )
    decoder, head = parts
    input_ids, attention, response_mask = encode_pairs(
        tokenizer, prompts_text, responses_text, max_length=max_length
    )
    device = next(model.parameters()).device
    input_ids, attention, response_mask = (
        input_ids.to(device),
        attention.to(device),
        response_mask.to(device),
    )
    hidden = decoder(input_ids=input_ids, attention_mask=attention).last_hidden_state
    mask = response_mask[:, 1:]
    picked = head(hidden[:, :-1][mask]).float()
    token_lp = torch.log_softmax(picked, dim=-1).gather(-1, input_ids[:, 1:][mask].unsqueeze(-1))
    rows = torch.arange(input_ids.shape[0], device=device).unsqueeze(1).expand_as(mask)[mask]
    out = torch.zeros(input_ids.shape[0], dtype=token_lp.dtype, device=device)
    return out.index_add(0, rows, token_lp.squeeze(-1))
