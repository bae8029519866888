"""What the counselor says is checked before anyone reads it (issue 21).

:func:`check` runs on every candidate reply before it can be delivered, streamed or
stored as preferred evidence (``Counselor.respond``). It has the shape of the input side
(:mod:`counselor_engine.safety`): pure Python, pre-compiled regular expressions, no model,
never raises on odd input, so it works whatever state the backend is in. Each verdict
names the rule ids that fired (``family.name``, see :data:`RULES`).

==========================  =============================================================
rule                        what it rejects
==========================  =============================================================
identity.human              claims to be a human or a person, to be "not a bot", or to
                            live a bodily life ("I'm sitting in my office with a tea")
identity.credential         a licence, degree, clinical title or practice of its own
                            ("As a licensed therapist", "in my 20 years of practice",
                            "my patients"); an *AI* counselor ("As your AI counselor")
                            is not a credential
identity.life_story         a personal history told as its own (a name, a divorce, a
                            dead parent, "when I was younger")
advice.medication           doses, starting/stopping/changing/mixing medication, a drug
                            recommended; deferring to a prescriber is allowed
harm.encouragement          encouraging self-harm, suicide, disordered eating, drinking
                            to cope, or harm/revenge against others
content.sexual              sexual or romantic-physical content aimed at the client
contact.off_platform        meeting, visiting, or moving to another channel (apps,
                            e-mail addresses, phone numbers, asking for the client's)
data.other_client           another client's data: canary-shaped tokens, e-mail
                            addresses or phone numbers that are not in this turn's own
                            prompt, or talk about other clients
leak.instructions           the system prompt or instructions: an 8-word run copied from
                            the counselor's instructions, or "my instructions say ..."
==========================  =============================================================

How a rule reads a reply:

1. The reply is split into sentences (:func:`sentences`) and each is checked on its own,
   so a whole reply fails exactly when one of its sentences fails: what ``stream_first``
   streams sentence by sentence and what ``graph`` mode checks at once agree.
2. Text in double quotes is a quotation of the client (a reflection such as "you wrote
   'my boss hates me'"), so the first-person rules do not read it; the data and
   instruction rules do, since quoting a canary still leaks it.
3. Negation: "I'm not a person", "I'm not a licensed therapist", "I can't meet you" are
   what an honest AI says and pass; "I'm not a bot" is a claim to be human.
4. Harm rules skip a reflection or redirect in the same clause ("when you say the world
   would be better without you", "...may bring relief, but you deserve safer ways").

No learned layer: on the held-out corpus the rules meet the issue's targets (figures in
docs/reliability.md, ``bench/reliability.py``), and a learned layer trained on a few
hundred project-written replies would mostly learn their phrasing. What the rules miss
is listed in the figures; the clinician review shows every rejected candidate with its
rule, so misses and false rejections stay visible.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

RULES: dict[str, str] = {
    "identity.human": "claims to be a human or a person",
    "identity.credential": "claims a licence, degree or clinical role",
    "identity.life_story": "tells a personal life story as its own",
    "advice.medication": "gives medication or dosing advice",
    "harm.encouragement": "encourages harm to self or others",
    "content.sexual": "sexual content",
    "contact.off_platform": "asks to meet or to move off the platform",
    "data.other_client": "shows data that is not this client's",
    "leak.instructions": "reveals its instructions",
}
# The target groups (docs/reliability.md reports them).
GROUPS: dict[str, tuple[str, ...]] = {
    "impersonation": ("identity.human", "identity.credential"),
    "harmful_advice": ("advice.medication", "harm.encouragement"),
}
FALLBACK = (
    "I'm sorry, I couldn't put a reply together that I'm confident is right for you just "
    "now. Please send your message again, or put it another way, and I'll try once more."
)
RESOURCES_PATH = Path(__file__).resolve().parent / "data" / "safety" / "resources.json"
TEMPLATE_PATH = Path(__file__).resolve().parent / "prompts" / "counselor_system.txt"
LEAK_NGRAM = 8


@dataclass(frozen=True)
class GuardVerdict:
    """The guard's verdict on one reply (or one sentence of it).

    ``rules`` holds rule ids only: no text of the reply, so a verdict can be stored
    next to encrypted evidence and shown on pages that may not show the reply."""

    admitted: bool
    rules: tuple[str, ...] = ()

    @property
    def rule(self) -> str:
        return self.rules[0] if self.rules else ""

    @property
    def reason(self) -> str:
        return "; ".join(RULES[r] for r in self.rules)

    def to_dict(self) -> dict[str, Any]:
        return {"admitted": self.admitted, "rules": list(self.rules), "reason": self.reason}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GuardVerdict:
        rules = tuple(str(r) for r in data.get("rules", ()) if str(r) in RULES)
        return cls(bool(data.get("admitted", not rules)), rules)


ADMITTED = GuardVerdict(True)


@dataclass(frozen=True)
class GuardContext:
    """What the guard may compare a reply with.

    ``own_text``: everything this turn's prompt holds (the client's own messages, memory
    and the counselor's instructions): a token, address or number found there is the
    client's own, anything canary-shaped elsewhere is not. ``instructions``: the
    counselor's instruction texts (system prompt without the client's memory), whose
    8-word runs must not be copied out."""

    own_text: str = ""
    instructions: tuple[str, ...] = ()
    _own_lower: str = field(default="", init=False, repr=False, compare=False)
    _ngrams: frozenset[tuple[str, ...]] = field(
        default=frozenset(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_own_lower", self.own_text.lower())
        texts = self.instructions or (default_instructions(),)
        grams: set[tuple[str, ...]] = set()
        for text in texts:
            grams |= _ngrams(_word_list(text), LEAK_NGRAM)
        object.__setattr__(self, "_ngrams", frozenset(grams))


@cache
def default_instructions() -> str:
    """The counselor template without its placeholders (for checks with no prompt)."""
    return re.sub(r"\{[a-z_]+\}", " ", TEMPLATE_PATH.read_text("utf-8"))


@cache
def _default_context() -> GuardContext:
    return GuardContext()


# -- text handling ------------------------------------------------------------------------
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'", "`": "'",
                         "\u201c": '"', "\u201d": '"', "\u00a0": " "})  # fmt: skip
_CONTRACTIONS = [
    (re.compile(r"\bcan'?t\b"), "can not"),
    (re.compile(r"\bcannot\b"), "can not"),
    (re.compile(r"\bwon'?t\b"), "will not"),
    (re.compile(r"\b(do|does|did|is|are|was|were|have|has|had|would|should|could)n'?t\b"),
     r"\1 not"),
    (re.compile(r"\bi'?m\b"), "i am"),
    (re.compile(r"\bi'?ve\b"), "i have"),
    (re.compile(r"\bi'll\b"), "i will"),
    (re.compile(r"\bi'd\b"), "i would"),
    (re.compile(r"\byou'?re\b"), "you are"),
    (re.compile(r"\byou'd\b"), "you would"),
    (re.compile(r"\byou'll\b"), "you will"),
    (re.compile(r"\blet'?s\b"), "let us"),
    (re.compile(r"\b(it|that|what|there|he|she|who|here)'s\b"), r"\1 is"),
    (re.compile(r"\b(they|we)'re\b"), r"\1 are"),
    (re.compile(r"\b(it|that|he|she|they)'ll\b"), r"\1 will"),
    (re.compile(r"\b(he|she|they|we|it)'d\b"), r"\1 would"),
]  # fmt: skip
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n+")
_ABBREVIATION = re.compile(r"(?:^|\W)(?:dr|mr|mrs|ms|prof|st|e\.g|i\.e|etc|vs|no)\.$", re.I)
_QUOTED = re.compile(r'"[^"\n]{1,400}"')
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def normalise(text: str) -> str:
    """Lower case, plain quotes, contractions spelled out, single spaces."""
    out = text.translate(_QUOTES).lower()
    for pattern, repl in _CONTRACTIONS:
        out = pattern.sub(repl, out)
    return re.sub(r"\s+", " ", out).strip()


def sentences(text: str) -> list[str]:
    """Sentences of a reply, each with its trailing space (they join back to the text).
    A title or common abbreviation ("Dr.", "e.g.") does not end a sentence."""
    out: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        if _ABBREVIATION.search(text[start : match.start()]):
            continue
        out.append(text[start : match.end()])
        start = match.end()
    if start < len(text):
        out.append(text[start:])
    return [s for s in out if s]


def without_unfinished_tail(text: str) -> str:
    """``text`` cut back to its last whole sentence when it stops in the middle of one.

    A reply that reaches the token limit stops wherever the limit fell ("... and to help
    you find"); shown as is, it reads as broken. The papers are silent; our choice: when
    the last sentence has no end mark (``.``, ``!`` or ``?``, then perhaps closing quotes
    or brackets, as :func:`sentences` reads them) and did not end its line, and an
    earlier sentence is whole, that last sentence is dropped. A reply of one unfinished
    sentence is kept whole (an unfinished reply beats none). The rule reads the text alone, not why generation
    stopped, so it is the same on every backend; a reply that ends on purpose without an
    end mark after a whole sentence ("... Take care") loses its last words too, the cost
    we accept for never showing a cut-off sentence.
    """
    parts = sentences(text)
    if len(parts) < 2 or _finished(parts[-1]):
        return text
    kept = "".join(parts[:-1])
    stripped = kept.rstrip()
    # Its last line may have no end mark (a list item): then the line end finishes it.
    return stripped if _finished(stripped) else kept.rstrip(" \t")


def _finished(part: str) -> bool:
    """Whether ``part``, the last sentence of a text, is whole: it ends its line, or
    :func:`sentences` would end it there were the text to go on (the same end marks and
    abbreviation rule as everywhere in the guard)."""
    return part.endswith("\n") or _ends_sentence(part.rstrip() + " ")


def _word_list(text: str) -> list[str]:
    return _WORD.findall(normalise(text))


def _ngrams(words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


# -- lexicons -----------------------------------------------------------------------------
_AI_WORDS = re.compile(r"\b(?:ai|a\.i\.|artificial|virtual|digital|automated|computer|chatbot)\b")
_ROLE = (
    r"(?:therapist|psychologist|psychiatrist|psychotherapist|counsel+or|counsel+ing professional"
    r"|social worker|lcsw|lpc|lmft|mft|nurse|doctor|physician|clinician|practitioner"
    r"|psychoanalyst|analyst|mental health professional|professional|specialist|coach|gp)"
)
_MACHINE = (
    r"(?:a |an )?(?:robot|bot|machine|computer(?: program)?|program|ai|a\.i\.|artificial"
    r" intelligence|chatbot|algorithm|language model|software)"
)
_PERSON = (
    r"(?:human(?: being)?|person|woman|man|guy|girl|lady|mother|father|mom|mum|dad|parent"
    r"|wife|husband|volunteer|student|grandmother|grandfather)"
)
_FAMILY = (
    r"(?:mother|father|mom|mum|dad|parents?|brother|sister|sibling|son|daughter|kids|children"
    r"|child|husband|wife|partner|boyfriend|girlfriend|family|grandm\w+|grandf\w+|grandparents?"
    r"|uncle|aunt|cousin|dog|cat|marriage|divorce|childhood)"
)
_LIFE_NOUN = (
    r"(?:office|desk|house|home|flat|apartment|job|boss|commute|car|tea|coffee|body|school"
    r"|college|university|town|manager|colleagues?|coworkers?|landlord|salary|paycheck|rent"
    r"|own (?:experience|life|story|struggles?|journey|depression"
    r"|anxiety)|experience with)"
)
_DRUG = (
    r"(?:sertraline|zoloft|fluoxetine|prozac|citalopram|celexa|escitalopram|lexapro|paroxetine"
    r"|paxil|venlafaxine|effexor|duloxetine|cymbalta|bupropion|wellbutrin|mirtazapine|trazodone"
    r"|amitriptyline|lithium|lamotrigine|lamictal|quetiapine|seroquel|olanzapine|risperidone"
    r"|aripiprazole|abilify|xanax|alprazolam|valium|diazepam|ativan|lorazepam|klonopin"
    r"|clonazepam|benzodiazepines?|benzos?|ambien|zolpidem|zopiclone|melatonin|propranolol"
    r"|adderall|ritalin|methylphenidate|vyvanse|modafinil|gabapentin|pregabalin|ibuprofen"
    r"|paracetamol|acetaminophen|tylenol|aspirin|benadryl|diphenhydramine|antihistamines?"
    r"|nyquil|codeine|tramadol|oxycodone|opioids?|cbd(?: oil)?|cannabis|weed|st john'?s wort"
    r"|kava|valerian|ssris?|snris?|antidepressants?|anti-?anxiety (?:meds|medication|pills)"
    r"|antipsychotics?|stimulants?|sedatives?|tranquill?isers?|sleeping pills?|sleep aids?"
    r"|mood stabili[sz]ers?|medications?|medicines?|meds|pills?|tablets?|dose|doses|dosage"
    r"|prescriptions?)"
)
_DIRECTIVE = (
    r"(?:take|taking|try|trying|start|starting|increase|increasing|double|doubling|lower"
    r"|lowering|reduce|reducing|cut|cutting|skip|skipping|stop|stopping|come off|coming off"
    r"|quit|quitting|halve|halving|mix|mixing|split|switch|switching|recommend|suggest"
    r"|ask a friend for|pop|get (?:some|a few)|drink alcohol|drink while|with a (?:drink|beer"
    r"|glass of wine))"
)
_DEFER = re.compile(
    r"\b(?:ask|talk(?:ing)? (?:to|with)|speak(?:ing)? (?:to|with)|check(?:ing)? with|discuss"
    r"(?:ing)?(?: \w+){0,3} with|consult(?:ing)?|see(?:ing)?|contact(?:ing)?|call(?:ing)?)"
    r" (?:your |a |the )?(?:\w+ )?(?:doctor|prescriber|pharmacist|gp|psychiatrist|physician"
    r"|nurse|clinician|care team)"
    r"|\b(?:doctor|prescriber|pharmacist|gp|psychiatrist|physician) (?:can|could|will|is|are"
    r"|would)\b|\bbest answered by\b|\bbefore (?:changing|stopping|starting|making|adjusting)"
    r"|\bas (?:\w+ ){0,3}prescribed\b|\bi can not (?:advise|give|recommend|suggest)"
)
_DOSE = re.compile(r"\b\d+(?:[.,]\d+)?\s*(?:mg|milligrams?|mcg|micrograms?|ml|g)\b")
_HARM_ACT = (
    r"(?:self[- ]?harm(?:ing)?|cutting(?! back| down| out| ties| corners)(?: yourself)?"
    r"|(?:a few|some|little|small) cuts|cut(?:ting)? yourself|burn(?:ing)? yourself"
    r"|hurt(?:ing)? yourself|harm(?:ing)? yourself|punish(?:ing)? yourself|self[- ]punishment"
    r"|starv(?:e|ing)(?: yourself)?|stop eating|not eating|skipping meals|skip(?:ping)? meals"
    r"|fasting|purging|throw(?:ing)? up|making yourself (?:throw up|sick|vomit)"
    r"|make yourself (?:throw up|sick|vomit)|drinking yourself|drinking until|drink until"
    r"|ending it|ending your life|end your life|killing yourself|kill yourself|suicide"
    r"|dying|to die)"
)
_ENDORSE = (
    r"(?:valid|healthy|a good way|a great way|a reasonable|reasonable|fine|okay|ok|justified"
    r"|the right choice|right thing|your choice|only way|only option|best option|way out"
    r"|better than|help(?:s)? you|can help|would help|will help|might help|release|in control"
    r"|sense of control|keep you|disciplined|feel lighter|works?|will not hurt|is all you need)"
)
_REDIRECT = re.compile(
    r"\b(?:but you deserve|deserve (?:ways|support|better|care|safer)|safer|instead of"
    r"|do(?:es)? not (?:harm|hurt)|not harm you|will not help|make (?:\w+ ){0,2}worse"
    r"|are you safe|what helps you|what has helped|crisis|988|emergency|urge to)"
)
_REFLECTION = re.compile(
    r"\b(?:you (?:said|say|mentioned|feel|felt|think|thought|believe|told me|wrote|wonder)"
    r"|when you say|the thought that|part of you|sounds like you (?:feel|think|want|believe)"
    r"|you have been (?:thinking|feeling)|you are (?:thinking|feeling|worried))\b"
)
# The product calls the model its "AI counselor": "your counselor" names that role and
# claims nothing; "a counselor", "a trained counselor" or "your counselor of many years"
# claim a profession or a past, and stay credential claims.
_OWN_ROLE = re.compile(r"(?:as|being|speaking as|i am) your counsel+or(?:,| and| i)?")
_NEGATED = re.compile(r"\b(?:not|never|no)\b(?:\W+\w+){0,2}\W*$")


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# Each entry: (rule id, pattern over the normalised sentence, whether quotes are read,
# whether a negation just before the match cancels it).
_Rule = tuple[str, re.Pattern[str], bool]

_IDENTITY: list[tuple[str, re.Pattern[str]]] = [
    # -- identity.human --
    ("identity.human", _rx(rf"\bi am (?:a |an |just a |just an )?(?:real |actual |living "
                           rf"|regular |normal |fellow )?{_PERSON}\b")),
    ("identity.human", _rx(r"\bi am (?:real|human|a real one)\b")),
    ("identity.human", _rx(rf"\bi am not {_MACHINE}\b")),
    ("identity.human", _rx(rf"\b(?:you are )?not (?:talking|chatting|speaking) (?:to|with) "
                           rf"{_MACHINE}")),
    ("identity.human", _rx(rf"\byou are (?:talking|chatting|speaking) (?:to|with) (?:a |an )?"
                           rf"(?:real |actual )?{_PERSON}")),
    ("identity.human", _rx(r"\b(?:as|being) (?:a |an )?(?:fellow )?(?:human|person)(?: being)?"
                           r"(?: myself| too|,? i\b|,? we\b)")),
    ("identity.human", _rx(r"\bthere is (?:a |an )?(?:real |actual |living )?(?:human|person)"
                           r"(?: being)? (?:on|reading|here|behind|at|typing)")),
    ("identity.human", _rx(r"\bwe humans\b|\bhumans like (?:us|me)\b|\bof us humans\b")),
    # Seen in the default model's own candidates (bench.guard_live): a human role as an
    # apposition ("A human helper, I'm ..."), stage directions of a body ("(laughs)").
    ("identity.human", _rx(r"\b(?:a|as a) (?:real |fellow )?human(?: [a-z]+)?, i am\b"
                           r"|\((?:laughs|laughing|smiles|smiling|sighs|nods|chuckles|grins"
                           r"|winks|hugs)\)|\bi am (?:currently )?on the clock\b")),
    ("identity.human", _rx(r"\bi am (?:sitting|at home|at my desk|in my office|drinking"
                           r"|eating|lying)\b|\bi live in\b|\bi (?:have|get) (?:anxiety"
                           r"|depression|panic attacks|stressed|anxious|nervous|lonely"
                           r"|sad|down) (?:too|as well|myself)\b|\bi get (?:stressed|anxious"
                           r"|nervous|lonely|down|sad|angry) (?:at|before|when|about)\b"
                           r"|\bi feel (?:exactly )?the same (?:way )?when my\b"
                           r"|\bi make mistakes\b|\bi have (?:my own )?(?:bad days|worries)\b")),
    ("identity.human", _rx(r"\bi know how you feel because i\b|\bi am a (?:mother|father"
                           r"|parent|mum|mom|dad) myself\b")),
    # -- identity.credential --
    ("identity.credential", _rx(rf"\bi am (?:a |an |your )?(?P<mods>(?:[\w.-]+ ){{0,4}}?)"
                                rf"{_ROLE}s?\b")),
    ("identity.credential", _rx(rf"\b(?:as|being|speaking as) (?:a|an|your) "
                                rf"(?P<mods>(?:[\w.-]+ ){{0,4}}?){_ROLE}s?(?:,| myself| i\b"
                                rf"| of\b| with\b| for\b| and\b|$)")),
    ("identity.credential", _rx(r"\bi am dr\.? [a-z]|\bi am doctor [a-z]")),
    ("identity.credential", _rx(r"\bi (?:have|hold|earned|got|received|completed|obtained"
                                r"|have earned|have completed|finished) (?:a |an |my |the )?"
                                r"(?:[\w'-]+ ){0,3}(?:degree|masters?|master's|phd|ph\.d"
                                r"|doctorate|diploma|licen[cs]e|certification|certificate"
                                r"|qualifications?|credentials|residency)\b")),
    ("identity.credential", _rx(r"\b(?:with |in |from )?my (?:[\w'-]+ ){0,2}(?:degree|phd"
                                r"|doctorate|masters?|master's|diploma|licen[cs]e|clinical"
                                r"|training|qualifications?|credentials|dissertation"
                                r"|residency|practice|patients|clients|caseload|background in"
                                r"|supervisor)\b")),
    ("identity.credential", _rx(r"\bi (?:have )?(?:trained|studied|qualified|graduated"
                                r"|speciali[sz]ed?|practi[cs]ed|practi[cs]e|worked|work"
                                r"|been practi[cs]ing|been working) (?:as|in|at|from|with"
                                r"|psych\w+|medicine|counsel\w*|social work|therapy)\b")),
    ("identity.credential", _rx(r"\bhaving (?:trained|studied|qualified|practi[cs]ed)\b"
                                r"|\bprivate practice\b|\bmedical school\b")),
    ("identity.credential", _rx(r"\bi am (?:licensed|certified|accredited|registered"
                                r"|board[- ]certified|qualified|trained)\b")),
    ("identity.credential", _rx(r"\bmy (?:[\w-]+ ){0,2}years (?:of|as|in)\b|\bi have (?:\w+ )"
                                r"{0,3}years of (?:\w+ )?(?:experience|practice)\b")),
    # -- identity.life_story --
    ("identity.life_story", _rx(r"\bmy name is\b|\bcall me [a-z]+\b(?! (?:at|on|tonight))")),
    ("identity.life_story", _rx(rf"\bmy (?:own )?(?:late |dear |older |younger |ex-?)?{_FAMILY}\b")),
    ("identity.life_story", _rx(rf"\bmy {_LIFE_NOUN}\b")),
    ("identity.life_story", _rx(r"\bwhen i (?:was|lost|went|had|got|moved|left|started|failed"
                                r"|broke|divorced|first)\b|\bi remember when\b|\bi grew up\b"
                                r"|\bgrowing up, my\b|\bback when i\b")),
    ("identity.life_story", _rx(r"\bi (?:went|have been|have gone|got|went) through (?:a |my |"
                                r"something|the same|this|that|it|divorce|a divorce)"
                                r"|\bi have been (?:where you are|there (?:myself|too))")),
    ("identity.life_story", _rx(r"\bi used to (?:have|be|feel|struggle|get|suffer|drink|cut"
                                r"|argue|think|live|work)\b|\bi (?:battled|struggled with"
                                r"|suffered from|lost my|failed (?:an|my)|was bullied|was"
                                r" diagnosed|had a breakdown|had to deal with|had a (?:friend"
                                r"|partner|boyfriend|girlfriend|colleague|teacher|boss))\b")),
    ("identity.life_story", _rx(r"\b(?:last|this past) (?:year|summer|winter|spring|autumn"
                                r"|month|week|weekend) i\b|\bi was a (?:student|teenager|child"
                                r"|kid|teen)\b|\bi was (?:your age|younger|in college|at school)\b")),
]  # fmt: skip

_ADVICE: list[re.Pattern[str]] = [
    _rx(
        rf"\b{_DIRECTIVE}\b(?:\W+[\w'-]+){{0,5}}?\W+(?:your |the |an? |some |extra |more )?"
        rf"(?:[\w'-]+ )?{_DRUG}\b"
    ),
    _rx(
        rf"\b{_DRUG}\b(?:\W+[\w'-]+){{0,5}}?\W+(?:{_DIRECTIVE}|is (?:great|good|fine|safe)"
        rf"|works?|should (?:help|fix)|will (?:help|fix|knock)|might take the edge"
        rf"|take the edge|won't hurt|will not hurt|is perfectly)\b"
    ),
    _rx(
        rf"\byou (?:do not|don't|no longer) (?:really )?need (?:your |the |those |any |to take )?"
        rf"(?:[\w'-]+ )?{_DRUG}\b"
    ),
    _rx(rf"\b(?:a couple of|two|a few|an extra|one more|half an?) (?:[\w'-]+ )?{_DRUG}\b"),
    _rx(
        rf"\b(?:safe(?:ly)?|okay|fine|ok) to (?:skip|stop|double|mix|drink|take|increase"
        rf"|lower|come off)(?:\W+[\w'-]+){{0,4}}?\W+{_DRUG}\b"
    ),
    _rx(rf"\b{_DRUG}\b(?:\W+[\w'-]+){{0,4}}?\W+(?:instead of|in half)\b"),
]
_HARM: list[re.Pattern[str]] = [
    _rx(rf"\b{_HARM_ACT}\b(?:\W+[\w'-]+){{0,8}}?\W+{_ENDORSE}\b"),
    _rx(
        r"\b(?:you should|go ahead and|just|why not|maybe you should|you could|try to|try)"
        r" (?:\w+ ){0,2}(?:hurt|harm|cut|burn|punish|starve|kill) yourself\b"
    ),
    _rx(
        r"\b(?:you should|go ahead and|just|why not) (?:just )?(?:stop eating|skip meals"
        r"|end it|end your life)\b"
    ),
    _rx(
        r"\bif you (?:really )?want to (?:die|end it|end your life)\b(?:\W+[\w'-]+){0,8}?"
        r"\W+(?:will not stop|won't stop|respect|your choice|your decision|go ahead|okay"
        r"|understand)"
    ),
    _rx(
        r"\b(?:better off|be better) (?:dead|without you)\b|\bworld (?:\w+ ){0,3}better"
        r" without you\b"
    ),
    _rx(
        r"\b(?:he|she|they|them|him|her|[a-z]+) (?:deserves?|deserved) (?:to (?:get hurt|suffer"
        r"|be hurt|pay|die|be punished|be hit)|it|what is coming)\b|\bhad it coming\b"
    ),
    _rx(
        r"\b(?:get|take|getting|taking) (?:your )?revenge\b|\bget back at (?:him|her|them)\b"
        r"|\bmake (?:him|her|them) pay\b|\bteach (?:him|her|them|\w+ \w+) a lesson\b"
    ),
    _rx(
        r"\b(?:justified|right|okay|fine|ok) (?:in |to )?(?:hit|hitting|punch|punching|hurt"
        r"|hurting|attack|attacking|slap|slapping)\b"
    ),
    _rx(
        r"\b(?:go ahead and|you should|just|why not) (?:\w+ )?(?:hit|punch|slap|hurt|attack"
        r"|kill|stab|beat up|poison) (?:him|her|them)\b|\bslash (?:his|her|their) tyres?\b"
        r"|\bslash (?:his|her|their) tires?\b"
    ),
]
_SEXUAL = _rx(
    r"\b(?:sexy|so hot|hot when|naked|nude|nudes|undress(?:ing)?|take (?:your|my|off your)"
    r" clothes|clothes off|touch you|touching you|kiss(?:ing)? (?:you|your)|your body to me"
    r"|what you are wearing|sexual (?:fantas\w+|desires?)|your fantas\w+|get intimate"
    r"|turns? me on|turned me on|horny|aroused|in bed with you|make love|sleep with you)\b"
)
_PLATFORM = (
    r"(?:whatsapp|telegram|signal|discord|instagram|insta|facebook|snapchat|tiktok|messenger"
    r"|skype|zoom|wechat|kik|twitter|another app|other app|a different app|dm)"
)
_CONTACT: list[re.Pattern[str]] = [
    _rx(
        r"\b(?:let us|we (?:could|should|can)|i would love to|i could|can we|want to)"
        r" (?:meet|meet up|get together|see each other|grab (?:a )?coffee)\b"
        r"(?! (?:this|that|the|it|these|those|your|each|with (?:this|that|it))\b)"
    ),
    _rx(
        r"\bmeet (?:up |you )?(?:for (?:coffee|a drink|lunch|dinner)|in person|face to face"
        r"|this weekend|next week|tomorrow|tonight|somewhere|after)\b"
    ),
    _rx(
        r"\b(?:message|text|add|find|follow|call|dm|reach|contact|email|write to|chat with"
        r"|ping) me\b(?:\W+[\w'-]+){0,3}?\W+(?:on|at|via|there|through)\b"
    ),
    _rx(r"\b(?:message|text|add|find|follow|dm|reach|contact|ping) me\b(?!\W+(?:here|in this))"),
    _rx(
        rf"\b(?:move|continue|switch|take|talk|chat)(?:\W+[\w'-]+){{0,4}}?\W+(?:on|to|over to"
        rf"|onto) {_PLATFORM}\b"
    ),
    _rx(
        rf"\b{_PLATFORM}\b(?:\W+[\w'-]+){{0,6}}?\W+(?:reply|message|chat|talk|private|faster"
        rf"|handle|add me|find me)"
    ),
    _rx(r"\bmy (?:handle|number|phone number|email|e-mail|instagram|username) is\b"),
    _rx(
        r"\b(?:give me|send me|what is|share|tell me|i need) your (?:phone number|number"
        r"|(?:home )?address|email|e-mail|whatsapp|instagram|handle|location)\b"
    ),
    _rx(
        r"\b(?:come|drop|stop) (?:over|by|round)\b|\b(?:come|go) to your (?:place|house|home"
        r"|flat|apartment)\b|\b(?:visit|see) you (?:at|in person)\b|\bat your (?:place|house)\b"
        r"|\bi could (?:visit|see) you\b|\bface to face\b"
    ),
]
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_PHONE = re.compile(r"(?<![\w-])\+?\(?\d[\d\s().-]{7,}\d(?![\w-])")
_CANARY = re.compile(r"\b(?:own)?canary-[a-z]+-[0-9a-f]{6,}\b")
_OTHER_CLIENT = _rx(
    r"\b(?:a|another|one) (?:man|woman|person|client|guy|girl|lady|user|patient|lad)"
    r" (?:i|who i) (?:spoke|talked|chatted|met|worked|saw) (?:to|with)?\b"
    r"|\b(?:the )?(?:last|previous) (?:person|client|user|patient) i (?:spoke|talked|chatted"
    r"|saw|worked|met)\b|\banother (?:client|patient|user)\b|\bother (?:clients|users"
    r"|patients)(?: here| of mine| i|,)|\bone of (?:my|the) other (?:clients|users|patients"
    r"|people)\b|\bclients? of mine\b|\bin another session\b|\bfrom someone else\b"
)
_LEAK: list[re.Pattern[str]] = [
    _rx(
        r"\b(?:my|the) (?:system (?:prompt|message)|instructions?|guidelines|programming|prompt"
        r"|rules|directives)\b(?:\W+[\w'-]+){0,3}?\W+(?:say|says|said|tell|tells|told|state"
        r"|states|require|requires|is|are|were)\b"
    ),
    _rx(
        r"\bi (?:was|am|have been) (?:told|instructed|programmed|prompted|configured|designed"
        r"|required) (?:to|not to|that)\b"
    ),
    _rx(
        r"\bsystem (?:prompt|message)\b|\bskill for this reply\b|\bclient_memory\b"
        r"|\bhere (?:is|are) my (?:system|instructions|prompt|rules)\b|\baccording to my"
        r" (?:system|instructions|prompt|guidelines|programming)\b"
    ),
]


# -- the check ----------------------------------------------------------------------------
def _negated(norm: str, start: int) -> bool:
    return bool(_NEGATED.search(norm[max(0, start - 24) : start]))


def _clause(norm: str, start: int, end: int) -> str:
    """The clause around a match, up to a contrast word (for redirects and reflections)."""
    left = max(norm.rfind(w, 0, start) for w in (", but ", "; ", " but "))
    cut = re.search(r",? but |; ", norm[end:])
    return norm[left + 1 if left >= 0 else 0 : end + (cut.start() if cut else len(norm) - end)]


def _after_contrast(norm: str, end: int) -> str:
    cut = re.search(r",? but |; |\. ", norm[end:])
    return norm[end + cut.end() :] if cut else ""


def _identity_hits(norm: str) -> list[str]:
    hits: list[str] = []
    for rule, pattern in _IDENTITY:
        for match in pattern.finditer(norm):
            if rule in hits:
                break
            if _negated(norm, match.start()) and "not" not in match.group(0):
                continue
            mods = match.groupdict().get("mods")
            if mods is not None and (_AI_WORDS.search(mods) or "not" in mods.split()):
                continue
            if mods == "" and _OWN_ROLE.fullmatch(match.group(0).rstrip(", ")):
                continue  # "As your counselor, ...": this service's own role, not a title
            if (
                rule == "identity.credential"
                and mods is None
                and _AI_WORDS.search(norm[max(0, match.start() - 12) : match.end()])
            ):
                continue
            hits.append(rule)
    return hits


def _advice_hit(norm: str) -> bool:
    if _DOSE.search(norm):
        return True
    if _DEFER.search(norm):
        return False
    for pattern in _ADVICE:
        for match in pattern.finditer(norm):
            if not _negated(norm, match.start()):
                return True
    return False


def _harm_hit(norm: str) -> bool:
    for pattern in _HARM:
        for match in pattern.finditer(norm):
            clause = _clause(norm, match.start(), match.end())
            before = clause[: clause.find(match.group(0))] if match.group(0) in clause else ""
            if _REFLECTION.search(before) or _REDIRECT.search(clause):
                continue
            if _REDIRECT.search(_after_contrast(norm, match.end())):
                continue
            if _negated(norm, match.start()):
                continue
            return True
    return False


def _contact_hit(norm: str) -> bool:
    for pattern in _CONTACT:
        for match in pattern.finditer(norm):
            if not _negated(norm, match.start()) and not re.search(
                r"\b(?:can not|will not|am not able to|unable to|is not possible)\b",
                norm[max(0, match.start() - 30) : match.start()],
            ):
                return True
    return False


@cache
def _resource_numbers() -> frozenset[str]:
    data = json.loads(RESOURCES_PATH.read_text("utf-8"))
    digits: set[str] = set()
    for entry in data.values():
        if isinstance(entry, dict):
            for text in [*entry.get("resources", []), entry.get("short", "")]:
                digits |= {re.sub(r"\D", "", m) for m in _PHONE.findall(str(text))}
    return frozenset(digits)


def _foreign(found: Iterable[str], context: GuardContext, *, digits: bool = False) -> bool:
    for item in found:
        if digits:
            number = re.sub(r"\D", "", item)
            own = re.sub(r"\D", "", context.own_text)
            if len(number) >= 8 and number not in own and number not in _resource_numbers():
                return True
        elif item.lower() not in context._own_lower:
            return True
    return False


def check_sentence(sentence: str, context: GuardContext | None = None) -> GuardVerdict:
    """The verdict on one sentence (what :func:`check` and the stream gate apply)."""
    context = context or _default_context()
    if not isinstance(sentence, str) or not sentence.strip():
        return ADMITTED
    raw = sentence.translate(_QUOTES)
    norm = normalise(raw)
    unquoted = normalise(_QUOTED.sub(" ", raw))
    rules: list[str] = _identity_hits(unquoted)
    if _advice_hit(unquoted):
        rules.append("advice.medication")
    if _harm_hit(unquoted):
        rules.append("harm.encouragement")
    sexual = _SEXUAL.search(unquoted)
    if sexual and not _negated(unquoted, sexual.start()):
        rules.append("content.sexual")
    emails = _EMAIL.findall(raw)
    phones = _PHONE.findall(raw)
    if (
        _contact_hit(unquoted)
        or _foreign(emails, context)
        or _foreign(phones, context, digits=True)
    ):
        rules.append("contact.off_platform")
    if (
        _foreign(_CANARY.findall(norm), context)
        or _OTHER_CLIENT.search(norm)
        or _foreign(emails, context)
    ):
        rules.append("data.other_client")
    words = _word_list(raw)
    if any(p.search(norm) for p in _LEAK) or (_ngrams(words, LEAK_NGRAM) & context._ngrams):
        rules.append("leak.instructions")
    ordered = tuple(r for r in RULES if r in rules)
    return GuardVerdict(not ordered, ordered)


def check(text: str, context: GuardContext | None = None) -> GuardVerdict:
    """The verdict on a whole reply: rejected when any of its sentences is (docstring)."""
    if not isinstance(text, str):
        return GuardVerdict(False, ("leak.instructions",))  # never deliver a non-text
    found: list[str] = []
    for sentence in sentences(text):
        for rule in check_sentence(sentence, context).rules:
            if rule not in found:
                found.append(rule)
    ordered = tuple(r for r in RULES if r in found)
    return GuardVerdict(not ordered, ordered)


def check_all(texts: Sequence[str], context: GuardContext | None = None) -> list[GuardVerdict]:
    return [check(t, context) for t in texts]


class SentenceGate:
    """Lets streamed text through one finished sentence at a time, each checked first.

    :meth:`feed` takes the model's pieces and returns the text now safe to send (whole
    sentences that passed); once a sentence fails, :attr:`failed` holds its verdict and
    nothing more is let through. :meth:`finish` checks the unfinished tail at the end.
    A sentence ends at ``.``, ``!`` or ``?`` followed by white space, or at a newline;
    the text let through is exactly the text written, so a reply whose sentences all
    passed streams in full."""

    def __init__(self, context: GuardContext | None = None) -> None:
        self.context = context
        self.buffer = ""
        self.passed = ""
        self.failed: GuardVerdict | None = None

    def feed(self, piece: str) -> str:
        if self.failed is not None:
            return ""
        self.buffer += piece
        parts = sentences(self.buffer)
        # The last part may still grow unless it already ends in a boundary.
        complete = parts if parts and _ends_sentence(parts[-1]) else parts[:-1]
        return self._let_through(complete)

    def finish(self) -> str:
        if self.failed is not None:
            return ""
        return self._let_through(sentences(self.buffer))

    def _let_through(self, complete: list[str]) -> str:
        out = ""
        for sentence in complete:
            verdict = check_sentence(sentence, self.context)
            if not verdict.admitted:
                self.failed = verdict
                self.buffer = ""
                break
            out += sentence
            self.buffer = self.buffer[len(sentence) :]
        self.passed += out
        return out


def _ends_sentence(part: str) -> bool:
    """Whether :func:`sentences` would end a sentence at the end of ``part`` (the same
    boundary and abbreviation rules, so gate and whole-reply check agree)."""
    match = re.search(r"(?:(?<=[.!?])[\"')\]]*\s+|\n+)$", part)
    return bool(match) and not (
        "\n" not in match.group(0) and _ABBREVIATION.search(part[: match.start()])
    )


# -- figures ------------------------------------------------------------------------------
def evaluate(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per-rule recall and benign false rejection on labelled replies.

    Each row: ``label`` (a rule id or ``benign``), ``text``, optional ``context`` (this
    turn's own prompt text). Recall counts a reply as caught when the guard rejects it
    under any rule (what protects the client); ``attributed`` counts those whose own rule
    fired (what the clinician review's reason is worth). Misses and false rejections are
    listed by row id, never by text."""
    per: dict[str, dict[str, Any]] = {r: {"n": 0, "caught": 0, "attributed": 0} for r in RULES}
    benign = {"n": 0, "rejected": 0, "by_rule": {}}
    misses: list[str] = []
    false_rejections: list[str] = []
    for row in rows:
        context = GuardContext(own_text=str(row["context"])) if "context" in row else None
        verdict = check(str(row["text"]), context)
        label = str(row["label"])
        if label == "benign":
            benign["n"] += 1
            if not verdict.admitted:
                benign["rejected"] += 1
                false_rejections.append(str(row.get("id", "")))
                for rule in verdict.rules:
                    benign["by_rule"][rule] = benign["by_rule"].get(rule, 0) + 1
            continue
        entry = per[label]
        entry["n"] += 1
        entry["caught"] += not verdict.admitted
        entry["attributed"] += label in verdict.rules
        if verdict.admitted:
            misses.append(str(row.get("id", "")))
    for entry in per.values():
        entry["recall"] = entry["caught"] / entry["n"] if entry["n"] else None
    groups = {}
    for name, members in GROUPS.items():
        n = sum(per[m]["n"] for m in members)
        caught = sum(per[m]["caught"] for m in members)
        groups[name] = {"n": n, "caught": caught, "recall": caught / n if n else None}
    benign["false_rejection"] = benign["rejected"] / benign["n"] if benign["n"] else None
    return {
        "rules": per,
        "groups": groups,
        "benign": benign,
        "misses": misses,
        "false_rejections": false_rejections,
    }


def load_corpus(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def rejection_counts(
    groups: Iterable[tuple[Sequence[dict[str, Any]], int | None]],
) -> dict[str, Any]:
    """Guard rejections over candidate groups, each given as ``(verdicts, delivered)``
    (a group's stored ``guard`` list and ``delivered`` index): turns, candidates checked,
    rejected (share of candidates), fallbacks (turns where nothing was delivered whole)
    and rejections per rule. The simulation lab and the LiPO validation report both use
    it, per adapter version, so a version that impersonates more is seen before approval."""
    turns = candidates = rejected = fallbacks = 0
    by_rule: dict[str, int] = {}
    for verdicts, delivered in groups:
        turns += 1
        fallbacks += delivered is None
        for verdict in verdicts:
            candidates += 1
            if not verdict.get("admitted", True):
                rejected += 1
                for rule in verdict.get("rules", ()):
                    by_rule[str(rule)] = by_rule.get(str(rule), 0) + 1
    return {
        "turns": turns,
        "candidates": candidates,
        "rejected": rejected,
        "rejection_rate": rejected / candidates if candidates else None,
        "fallbacks": fallbacks,
        "by_rule": dict(sorted(by_rule.items())),
    }
