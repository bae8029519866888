"""Tiny random-weight chat models, built in code, for exact, offline and fast tests.

A tiny Llama (2 layers, hidden 64) and a byte-level BPE tokenizer trained here on a
small built-in counseling corpus are saved with ``save_pretrained``, so
``TransformersBackend(model_path=...)`` loads them exactly like a real model: same chat
template shape as SmolLM2 (ChatML), same special tokens, ``pad == eos == <|im_end|>``.
The single characters the judge reads ("A", "B", "1".."5") are single tokens because a
byte-level tokenizer keeps every byte as a token of its own.

Everything is deterministic given ``seed``: the corpus is fixed, BPE training is
deterministic and the weights are drawn from a forked, seeded torch RNG.
"""

from __future__ import annotations

import itertools
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
JUDGE_TOKENS = ("A", "B", "1", "2", "3", "4", "5")

_SUBJECTS = ("I", "My partner", "My mother", "My friend", "My boss", "My brother")
_FEELINGS = (
    "feel anxious", "feel sad", "feel overwhelmed", "feel lonely", "feel angry",
    "feel hopeful", "feel tired", "feel stuck",
)  # fmt: skip
_SITUATIONS = (
    "about work", "after the argument", "when I try to sleep", "at family dinners",
    "since the move", "before exams",
)  # fmt: skip
_COUNSELOR = (
    "That sounds really hard. Can you tell me more about it?",
    "It makes sense that you feel this way.",
    "What helps you, even a little, when this happens?",
    "You noticed something important about yourself.",
    "Let us take a moment and slow down together.",
    "How would you like things to be different?",
    "On a scale from 1 to 5, how strong is the feeling right now?",
    "Which option fits better, A or B?",
    "Thank you for trusting me with this.",
    "It is okay to take small steps.",
    "What did you try last time, and how did it go?",
    "I hear that you are carrying a lot right now.",
    "Would it help to make a plan for the next week?",
    "Your feelings are valid, and we can explore them at your pace.",
    "Breathing slowly can calm the body when worry rises.",
    "Who else in your life could support you?",
)


def corpus() -> list[str]:
    """A few hundred short counseling-flavoured sentences (fixed order: determinism)."""
    client = [
        f"{who} {'feel' if who == 'I' else 'feels'}{feel[4:]} {where}."
        for who, feel, where in itertools.product(_SUBJECTS, _FEELINGS, _SITUATIONS)
    ]
    digits = [f"Rating {d} of 5. Answer {c}." for d in "12345" for c in "AB"]
    return client + list(_COUNSELOR) * 4 + digits


def build_tiny_model(
    directory: Path,
    *,
    seed: int = 0,
    vocab_size: int = 600,
    hidden_size: int = 64,
    num_layers: int = 2,
) -> Path:
    """Write a tiny random LlamaForCausalLM + trained tokenizer into ``directory``.

    Returns ``directory``. The result loads with ``AutoModelForCausalLM.from_pretrained``
    and ``AutoTokenizer.from_pretrained`` like any real chat model.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    for token in JUDGE_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token

    eos = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))  # type: ignore[arg-type]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        # Larger than the usual 0.02 so the random model has peaked, prompt-dependent
        # next-token distributions (tests compare them), not a near-uniform blur.
        initializer_range=0.2,
        bos_token_id=int(tokenizer.convert_tokens_to_ids("<|im_start|>")),  # type: ignore[arg-type]
        eos_token_id=eos,
        pad_token_id=eos,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


def build_tiny_adapter(
    model_dir: Path, directory: Path, *, seed: int = 0, rank: int = 4, scale: float = 0.5
) -> Path:
    """Write a LoRA adapter for the tiny model whose ``lora_B`` is non-zero (a freshly
    initialised LoRA is the identity, which would make adapter tests vacuous)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], lora_dropout=0.0
    )
    # peft draws lora_A from the global RNG: fork and seed it, or the adapter (and every
    # held-out comparison against it) changes from one call to the next.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    peft_model.save_pretrained(str(directory))
    return Path(directory)
