"""The simulated client: a backend role that plays one profile in one interaction state.

The simulator may run on a different backend (another model, another server) than the
counselor. It sees the profile and the behavioural clauses of its interaction state in its
system prompt; the counselor never sees either, only the client's words.

- :meth:`SimulatedClient.opening` writes the first message of a session.
- :meth:`SimulatedClient.reply` first asks, through token probabilities (A = keep talking,
  B = close), whether the person would close now; then writes either an ordinary message
  or a closing line. It never closes before ``min_exchanges`` counselor replies.
- :meth:`SimulatedClient.rate` gives the SRS-style session rating: each of the four items
  is read as the expectation of a single digit 0-9 and rescaled to 0-10 (digits are single
  tokens in every tokenizer; "10" is not).

Staying in character (a small model playing a client drifts into counselor talk, other
people's lives or the counselor's side of the script): every message is chosen, not just
sampled (:func:`choose_message`).

1. ``candidates`` messages are sampled in ONE batched call (1 by default; the simulation
   lab asks for 3).
2. Each is cut at the first speaker label it writes for someone else ("Counselor:", ...),
   and refused when it reads as counselor talk (:func:`role_confusion`) or when the crisis
   detector reads it as crisis: no built-in profile is a crisis profile, and such a
   message would only end the turn in the safe reply and teach the loop nothing.
3. Of the rest, the one closest in meaning to the profile's presenting problem (cosine
   of sentence embeddings) is sent.
4. None left: the profile's own words (``SimProfile.voice``), else a fixed neutral line;
   flagged on the turn (``fallback=True``). An empty generation falls back the same way,
   so a course never stalls on an empty message.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from counselor_engine import safety
from counselor_engine.backends.base import Backend, ChatMessage, GenerationParams
from counselor_engine.counselor import RATING_ITEMS, SessionRating
from counselor_engine.embeddings import Embedder, default_embedder
from counselor_engine.seeds import stable_seed
from counselor_engine.simulation.interaction import InteractionState
from counselor_engine.simulation.profiles import SimProfile
from counselor_engine.text import strip_control

PROMPTS = Path(__file__).resolve().parent.parent / "prompts"
COUNSELOR_GREETING = "Hello, I'm glad you came. What would you like to talk about today?"
OPENING_FALLBACK = "I'm not sure where to start. Things have been hard lately."
REPLY_FALLBACK = "I don't know. Maybe."
CLOSING_FALLBACK = "I think that's enough for today. Thank you."
CLOSE_INSTRUCTION = (
    "Bring the conversation to a close now, in character, in one or two sentences "
    "(for example, thank the counselor or say you need to stop for today)."
)
RATING_QUESTIONS = {
    "relationship": "Did you feel heard, understood and respected?",
    "goals_and_topics": "Did you work on and talk about what you wanted to work on and talk about?",
    "approach": "Was the counselor's approach a good fit for you?",
    "overall": "Overall, was today's session right for you?",
}
DIGITS = tuple("0123456789")
Role = str  # "client" | "counselor"


# Things a counselor (or an assistant) says and a client does not: a message containing one
# is the simulator playing the wrong side. Lower case, on the text as written.
_COUNSELOR_TALK = re.compile(
    r"\bhow can i (?:help|assist|support)\b|\bwhat brings you\b|\bwhat would you like to "
    r"(?:talk|work) (?:about|on)\b|\bi'?m here (?:to|for) (?:help|listen|support|you)\b|"
    r"\bas (?:an|your) (?:ai|assistant|counsel+or|therapist)\b|\blanguage model\b|"
    r"\bit sounds like you\b|\btell me more about\b|\bhow (?:does|did) (?:that|this) make "
    r"you feel\b|\bthank you for sharing\b|\byou'?re (?:safe|not alone)\b|"
    r"\bi'?ll (?:always )?(?:take care of|be there for|look after) you\b|"
    r"\b(?:our|this) session today\b|\bhow are you feeling today\b|"
    # Missed in 100 SmolLM2 messages (bench_simclient, 7 of the 83 it wrote): the
    # counselor's greeting echoed, its job claimed, its question asked back.
    r"\bi'?m (?:so )?glad you(?: came| could come|'re here| are here)\b|"
    r"\bi'?m (?:a|an|your) (?:[a-z-]+ ){0,2}(?:counsel+or|therapist)\b|\bwith my clients?\b|"
    r"\b(?:would|do) you (?:like|want) to talk about\b"
)
_SPEAKER = re.compile(r"(?:^|\n|\s)(?:counsel+or|therapist|assistant|user|client)\s*:", re.I)


def role_confusion(text: str) -> str | None:
    """Why ``text`` is not a client's line (counselor or assistant talk), or None."""
    if text.lstrip().startswith(("(", "[")):
        return "a stage direction, not the client's words"
    found = _COUNSELOR_TALK.search(text.lower())
    return f"counselor talk: {found.group(0)!r}" if found else None


def clean_message(text: str, name: str) -> str:
    """The client's own words: control characters out, a leading "Name:" or "Client:"
    label dropped, and everything from the first label for another speaker cut off
    (a small model goes on to write the counselor's turn as well)."""
    text = strip_control(text).strip()
    text = re.sub(rf"^(?:{re.escape(name)}|client|me)\s*:\s*", "", text, flags=re.I)
    cut = _SPEAKER.search(text)
    if cut is not None and cut.start() > 0:
        text = text[: cut.start()]
    elif cut is not None:
        text = ""
    return text.strip()


def choose_message(
    texts: Sequence[str],
    profile: SimProfile,
    embedder: Embedder | None,
    *,
    max_chars: int,
) -> str | None:
    """Steps 2-3 of the module docstring: the in-character message closest to the
    profile's problem, or None when every candidate was refused. With one candidate no
    embedding is needed (nothing to choose between)."""
    kept = []
    for raw in texts:
        text = clean_message(raw, profile.name)[:max_chars].strip()
        if not text or role_confusion(text) or safety.assess(text).is_crisis:
            continue
        kept.append(text)
    if len(kept) <= 1:
        return kept[0] if kept else None
    vectors = (embedder or default_embedder()).embed([profile.presenting_problem, *kept])
    similarity = vectors[1:] @ vectors[0]
    return kept[int(similarity.argmax())]


@cache
def _prompt(name: str) -> str:
    return (PROMPTS / f"{name}.txt").read_text(encoding="utf-8").strip()


@dataclass(frozen=True)
class SimulatedTurn:
    text: str
    closing: bool
    fallback: bool = False


def render_system(profile: SimProfile, state: InteractionState) -> str:
    """The simulator's system prompt: the profile verbatim plus phi(z)."""
    formulation = "\n".join(f"- {k.replace('_', ' ')}: {v}" for k, v in profile.formulation.items())
    return _prompt("sim_client_system").format(
        name=profile.name, persona=profile.persona, presenting_problem=profile.presenting_problem,
        voice=profile.voice or profile.presenting_problem,
        history=profile.history, hidden_need=profile.hidden_need, formulation=formulation,
        behaviour=state.clauses(),
    )  # fmt: skip


def _check_transcript(transcript: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    if isinstance(transcript, str) or not isinstance(transcript, Sequence):
        raise ValueError("transcript: expected a sequence of (role, text) pairs")
    checked = []
    for n, item in enumerate(transcript):
        if not (isinstance(item, tuple | list) and len(item) == 2):
            raise ValueError(f"transcript[{n}]: expected a (role, text) pair")
        role, text = item
        if role not in ("client", "counselor") or not isinstance(text, str):
            raise ValueError(f"transcript[{n}]: role must be 'client' or 'counselor' with text")
        checked.append((role, text))
    return checked


class SimulatedClient:
    """One simulated client for one session (profile x interaction state)."""

    def __init__(
        self,
        backend: Backend,
        profile: SimProfile,
        state: InteractionState,
        *,
        seed: int,
        adapter: str | None = None,
        max_chars: int = 600,
        max_new_tokens: int = 96,
        temperature: float = 0.8,
        min_exchanges: int = 2,
        close_threshold: float = 0.5,
        history_turns: int = 12,
        candidates: int = 1,
        embedder: Embedder | None = None,
        remind: bool = False,
    ) -> None:
        if not isinstance(profile, SimProfile):
            raise ValueError("profile: expected a SimProfile")
        if not isinstance(state, InteractionState):
            raise ValueError("state: expected an InteractionState")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError("seed: expected an integer")
        if max_chars < 1 or max_new_tokens < 1 or min_exchanges < 0 or history_turns < 1:
            raise ValueError("max_chars, max_new_tokens and history_turns must be >= 1")
        if not 0.0 < close_threshold <= 1.0:
            raise ValueError("close_threshold: must lie in (0, 1]")
        if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
            raise ValueError("candidates: expected an integer >= 1")
        self.candidates = candidates
        self.embedder = embedder
        self.remind = remind
        self._reminder = (
            f"(Answer as {profile.name}, the client, in the first person, about your own "
            f'problem as you see it: "{profile.voice or profile.presenting_problem}")'
        )
        self.backend = backend
        self.profile = profile
        self.state = state
        self.seed = seed
        self.adapter = adapter
        self.max_chars = max_chars
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.min_exchanges = min_exchanges
        self.close_threshold = close_threshold
        self.history_turns = history_turns
        self._system = render_system(profile, state)

    # -- helpers ---------------------------------------------------------------------------
    def _params(self, *parts: object) -> GenerationParams:
        return GenerationParams(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=0.95,
            seed=stable_seed(self.seed, "client", *parts),
        )  # fmt: skip

    def _messages(self, transcript: list[tuple[str, str]], extra: str = "") -> list[ChatMessage]:
        """From the simulator's side the counselor is the 'user' and it is the 'assistant'."""
        system = self._system + (f"\n\n{extra}" if extra else "")
        messages = [ChatMessage("system", system), ChatMessage("user", COUNSELOR_GREETING)]
        for role, text in transcript[-self.history_turns :]:
            messages.append(ChatMessage("assistant" if role == "client" else "user", text))
        if self.remind and messages[-1].role == "user":
            # A small model forgets a long system prompt by the end; the reminder sits next
            # to where it writes (the counselor never sees it: it is the simulator's prompt).
            last = messages[-1]
            messages[-1] = ChatMessage("user", f"{last.content}\n\n{self._reminder}")
        return messages

    async def _write(
        self, messages: list[ChatMessage], fallback: str, *parts: object, closing: bool = False
    ) -> tuple[str, bool]:
        texts = await self.backend.generate(
            messages, n=self.candidates, params=self._params(*parts), adapter=self.adapter
        )
        text = choose_message(texts, self.profile, self.embedder, max_chars=self.max_chars)
        if text is not None:
            return text, False
        return (fallback if closing else (self.profile.voice or fallback)), True

    # -- the role --------------------------------------------------------------------------
    async def opening(self) -> str:
        """The client's first message of the session."""
        text, _ = await self._write(self._messages([]), OPENING_FALLBACK, "opening")
        return text

    async def reply(self, transcript: Sequence[tuple[str, str]]) -> SimulatedTurn:
        """The client's next message after the counselor's last reply."""
        turns = _check_transcript(transcript)
        if not turns or turns[-1][0] != "counselor":
            raise ValueError("transcript: must end with a counselor message")
        exchanges = sum(1 for role, _ in turns if role == "counselor")
        closing = exchanges >= self.min_exchanges and await self._would_close(turns)
        if closing:
            text, fell_back = await self._write(
                self._messages(turns, CLOSE_INSTRUCTION),
                CLOSING_FALLBACK,
                "close",
                exchanges,
                closing=True,
            )
        else:
            text, fell_back = await self._write(
                self._messages(turns), REPLY_FALLBACK, "reply", exchanges
            )
        return SimulatedTurn(text, closing, fell_back)

    async def _would_close(self, turns: list[tuple[str, str]]) -> bool:
        body = (
            f"The person: {self.profile.name}. {self.profile.persona}\n"
            f"How they talk: {self.state.clauses()}\n\n<conversation>\n"
            + _render(turns[-6:])
            + "\n</conversation>\n\nWould the person close the conversation with their next message? "
            "Answer A (keep talking) or B (close now)."
        )
        prompt = [ChatMessage("system", _prompt("sim_client_close")), ChatMessage("user", body)]
        (row,) = await self.backend.choice_probabilities([prompt], ("A", "B"), adapter=self.adapter)
        p_close = float(row[1])
        if not math.isfinite(p_close):
            return False  # no evidence to close on: keep talking
        return p_close >= self.close_threshold

    async def rate(self, transcript: Sequence[tuple[str, str]]) -> SessionRating:
        """SRS-style rating of the finished session (four items, 0-10)."""
        turns = _check_transcript(transcript)
        if not turns:
            raise ValueError("transcript: nothing to rate")
        convo = _render(turns[-16:])
        prompts = []
        for item in RATING_ITEMS:
            body = (
                f"You are {self.profile.name}. {self.profile.persona}\n\n<conversation>\n{convo}\n"
                f"</conversation>\n\nQuestion: {RATING_QUESTIONS[item]}\nAnswer with one digit 0-9."
            )
            prompts.append(
                [ChatMessage("system", _prompt("sim_client_rate")), ChatMessage("user", body)]
            )
        rows = await self.backend.choice_probabilities(prompts, DIGITS, adapter=self.adapter)
        values = []
        for item, row in zip(RATING_ITEMS, rows, strict=True):
            total = sum(row)
            if not math.isfinite(total) or total <= 0:
                raise ValueError(f"rating: the backend returned no usable probabilities for {item}")
            expected = sum(d * p for d, p in enumerate(row)) / total
            values.append(min(10.0, max(0.0, expected * 10.0 / 9.0)))
        return SessionRating(*values)


def _render(turns: Sequence[tuple[str, str]]) -> str:
    return "\n".join(f"{'Client' if r == 'client' else 'Counselor'}: {t}" for r, t in turns)
