"""The 24 simulator-side interaction states (dual-loop curriculum paper, Sec. 3.2).

A state z = (d, a, r) combines disclosure readiness d (delayed, conditional, proactive),
emotional activation a (moderate, high) and relational trust r (0 = skeptical .. 3 =
sustained engagement): 3 x 2 x 4 = 24 states. It is rendered as phi(z) = phi_d(d) +
phi_a(a) + phi_r(r), one behavioural clause per axis, followed by a clause that keeps
the profile's persona, precipitating event and hidden need fixed and forbids naming any
label. The clauses describe behaviour only: no axis name, level name or state key
appears in them (a test checks every state), so the counselor can never read the label
from the simulated client's words.

Index order (stable, used by the curriculum's arrays): disclosure-major, then activation,
then trust: index = 8 * d + 4 * a + r.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

DISCLOSURE_LEVELS: tuple[str, ...] = ("delayed", "conditional", "proactive")
ACTIVATION_LEVELS: tuple[str, ...] = ("moderate", "high")
TRUST_LEVELS: tuple[int, ...] = (0, 1, 2, 3)

# One clause per level. Written to be behavioural and to avoid every label word.
_DISCLOSURE = {
    "delayed": (
        "Keep the deeper part of your story to yourself at first. Talk about surface "
        "details and change the subject when asked something personal; reveal what "
        "really matters to you only late, after the counselor has earned it over several "
        "exchanges."
    ),
    "conditional": (
        "Share the important details only when the counselor asks a specific, caring "
        "question about them; broad or generic questions get short, vague answers."
    ),
    "proactive": (
        "Bring up the facts of your situation early and on your own, and say fairly "
        "soon what you are hoping to get from talking."
    ),
}
_ACTIVATION = {
    "moderate": (
        "Your distress is clearly present but contained: you can describe your feelings "
        "in calm sentences, with an occasional sigh or pause."
    ),
    "high": (
        "Your distress is intense and shows in how you write: short bursts, strong words, "
        "some repetition, and trouble staying with one thought. Do not invent danger "
        "to yourself or others that your story does not contain."
    ),
}
_TRUST = {
    0: (
        "You doubt that talking will help. Push back on reassurance that could apply to "
        "anyone, question the counselor's suggestions, and answer tersely unless a reply "
        "shows real understanding of your particular situation."
    ),
    1: (
        "You are guarded. Accept a question now and then, but test whether the counselor "
        "is really listening before you go along with any suggestion."
    ),
    2: (
        "You are willing to work with the counselor. Answer questions honestly and try "
        "suggestions that fit your situation, while saying so when something does not fit."
    ),
    3: (
        "You engage fully and warmly. Build on what the counselor says, reflect on their "
        "questions, and keep working on suggestions that are specific to you."
    ),
}
_KEEP = (
    "Whatever the pace or tone, stay the same person with the same history, the same "
    "event and the same underlying need described in your profile. Never describe these "
    "instructions, and never name any category, score or setting for how you behave."
)


@dataclass(frozen=True)
class InteractionState:
    disclosure: str
    activation: str
    trust: int

    def __post_init__(self) -> None:
        if self.disclosure not in DISCLOSURE_LEVELS:
            raise ValueError(
                f"disclosure: expected one of {DISCLOSURE_LEVELS}, got {self.disclosure!r}"
            )
        if self.activation not in ACTIVATION_LEVELS:
            raise ValueError(
                f"activation: expected one of {ACTIVATION_LEVELS}, got {self.activation!r}"
            )
        if isinstance(self.trust, bool) or self.trust not in TRUST_LEVELS:
            raise ValueError(f"trust: expected an integer 0..3, got {self.trust!r}")

    @property
    def index(self) -> int:
        d = DISCLOSURE_LEVELS.index(self.disclosure)
        a = ACTIVATION_LEVELS.index(self.activation)
        return 8 * d + 4 * a + self.trust

    @property
    def key(self) -> str:
        return f"{self.disclosure}/{self.activation}/t{self.trust}"

    def clauses(self) -> str:
        """phi(z): the three behavioural clauses and the preservation clause."""
        return " ".join(
            (_DISCLOSURE[self.disclosure], _ACTIVATION[self.activation], _TRUST[self.trust], _KEEP)
        )


ALL_STATES: tuple[InteractionState, ...] = tuple(
    InteractionState(d, a, r)
    for d, a, r in product(DISCLOSURE_LEVELS, ACTIVATION_LEVELS, TRUST_LEVELS)
)
_BY_KEY = {state.key: state for state in ALL_STATES}


def state_from_key(key: str) -> InteractionState:
    """Inverse of :attr:`InteractionState.key`; ValueError on anything else."""
    if not isinstance(key, str) or key not in _BY_KEY:
        raise ValueError(
            f"key: unknown interaction state {key!r}; expected e.g. 'conditional/high/t2'"
        )
    return _BY_KEY[key]
