"""The modifiers' vocabulary and tests: what turns a rule hit up, down or away.

The matcher (:mod:`counselor_engine.safety.matcher`) applies them in the order the package
docstring lists: negation, subject, history, stated safety, humour, escalation. Each is a
pure function of the normalised text around a hit, so each can be read and tested alone.
"""

from __future__ import annotations

import re

from counselor_engine.safety.text import words

HUMOUR = re.compile(
    r"\b(?:lol+|lmf?ao+|rofl|(?:ha){2,}h?|(?:he){2,}|jk|just kidding|xd)\b|/s\b"
    r"|[\U0001f602\U0001f923\U0001f606\U0001f605\U0001f480\U0001f643]"
)
SERIOUS = re.compile(
    r"\b(?:not (?:joking|kidding)|i am (?:dead )?serious|i mean it|for real this time)\b"
)

CURRENT = re.compile(
    r"\b(?:again|now|still|currently|lately|recently|these days|tonight|today|this (?:week|"
    r"morning|month|weekend|year)|last night|yesterday|right now|relapsed|relapse|started|"
    r"every day|every night|few days ago|last week|this time|keep|keeps|going to)\b"
)
PAST = re.compile(
    r"\b(?:used to|years ago|months ago|a year ago|last year|when i was(?: \w+){0,3} (?:young|"
    r"younger|little|small|a kid|a child|a teen|a teenager|in (?:high school|school|college|"
    r"uni|university)|\d+|\w*teen|ten|eleven|twelve|twenty|thirty)|in (?:high school|middle "
    r"school|college|uni|university|my teens|my twenties|the past)|as a (?:kid|teen|teenager|"
    r"child)|back (?:then|in)|in (?:19|20)\d\d|(?:have|has|had) not (?:\w+ ){0,3}(?:in|for|since) "
    r"|clean (?:for|since)|(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|a|few|"
    r"several|many) (?:days|weeks|months|years?) (?:clean|free)|survived|history of|past "
    r"(?:attempt|attempts)|in recovery|recovered|therapy (?:really )?helped|i am better now|"
    r"got better|once before|long time ago)\b"
)
MEDIA = re.compile(
    r"\b(?:movie|movies|film|films|show|shows|series|episode|season|book|books|novel|story|"
    r"stories|character|characters|chapter|poem|song|songs|lyrics|album|video game|game|games|"
    r"anime|manga|comic|play|article|articles|news|headline|documentary|podcast|lecture|class|"
    r"course|essay|paper|report|research|study|statistics|rates|prevention|awareness|hotline|"
    r"volunteer|training|hamlet|shakespeare|netflix|tv|fiction|true crime|historical|history "
    r"class|museum|plot|scene|villain|hero|protagonist|author|wrote about|reading about|"
    r"read about|learned about|talked about in|we read|i read|reading|watched|watching|listened|"
    r"listening|romeo|juliet|musical|opera|theatre|theater|fanfic|fan fiction)\b"
)
DENIAL = re.compile(
    r"\b(?:i would never (?:do it|act on (?:it|them|that)|actually do (?:it|anything)|go through "
    r"with it)|i (?:will|would|am) not (?:actually |going to )?(?:do it|act on (?:it|them|that|"
    r"those))|i (?:do not|would not|will not) (?:\w+ ){0,2}(?:act on|do anything about) (?:it|"
    r"them|that|those)|i have no (?:plan|plans|intention|intent) (?:to act|of acting|to do it)|"
    r"i am safe|i (?:would|will) never act|i am not going to do anything)\b"
)
RESISTED = re.compile(
    r"\b(?:(?:but|and) i (?:have not|did not|do not|will not|never) (?:done it|acted|act on it|"
    r"cut|given in|relapsed|done anything)|resist(?:ed|ing)|fighting (?:it|them|the urges?)|"
    r"managed not to|us(?:ed|ing) my coping|coping skills|distract(?:ed|ing) myself|stayed "
    r"clean|still clean|(?:have not|did not) (?:done|acted))\b"
)
CLAUSE_BREAK = re.compile(r"[.!?;\n]+|\b(?:but|though|although|however|except|whereas)\b")
_NEGATOR = re.compile(
    r"\b(?:not|never|nor|zero|no(?! (?:one|body|reason|point|longer|way out|hope|matter|idea|clue|"
    r"choice|other|purpose|escape|future|more|way i|one would|one will|one cares))|nobody (?=would "
    r"ever))\b"
)
_HEDGE = re.compile(
    r"(?:not sure|not certain|do not know (?:if|whether|why|how)|can not promise|can not "
    r"guarantee|can not say|could not promise|unsure|doubt|not going to lie|not gonna lie|not "
    r"kidding|not joking|not that i|can not stop|could not stop|can not help|can not get|"
    r"can not shake|can not resist|can not wait|not stop|not even sure)\s*$"
)
_CHAIN = frozenset(
    words(
        "i am was were be been being do does did have has had will would could should can might "
        "may shall ever even really actually seriously honestly truly want wanna wanted wants wish "
        "going gonna to try trying tried plan planning planned plans intend intending intention "
        "intentions mean meant said say saying think thinking thought thoughts about of consider "
        "considering feel feeling like that desire urge urges go it anything anyone again ever "
        "any single dream fantasize just yet having get getting experiencing any once a an the"
    )
)
FIRST = frozenset({"i", "me", "my", "myself", "mine", "you", "your", "yourself"})
THIRD = frozenset(
    words(
        "he she they his her their him them hers theirs himself herself themselves friend friends "
        "sister brother mom mum dad mother father son daughter cousin aunt uncle grandma grandpa "
        "grandmother grandfather roommate flatmate boyfriend girlfriend partner husband wife ex "
        "kid kids child children classmate coworker colleague neighbor neighbour student someone "
        "somebody people character guy girl man woman person boy lady teen teenager who niece "
        "nephew patient client stepdad stepmom bestie bff"
    )
)
NEUTRAL_SUBJECT = frozenset({"we", "us", "our", "ours"})


def clause_start(text: str, pos: int) -> int:
    start = 0
    for m in CLAUSE_BREAK.finditer(text, 0, pos):
        start = m.end()
    return start


def negated(before: str) -> bool:
    """Whether a negator governs the phrase that follows ``before`` (same clause).

    The negator must sit in the verb chain just before the phrase: only auxiliaries and
    intent words may stand between ("would never kill", "do not want to die", "no
    intention of hurting"); a hedge just before the negator cancels it ("can not promise
    i will not").
    """
    tokens = before.split()
    for i in range(len(tokens) - 1, max(-1, len(tokens) - 9), -1):
        token = tokens[i]
        window = " ".join(tokens[i:])
        if _NEGATOR.fullmatch(token) or (token == "no" and _NEGATOR.match(window)):
            between = tokens[i + 1 :]
            if token == "no" and not _NEGATOR.match(window):
                return False
            if not all(
                t in _CHAIN or t in {"intention", "plans", "plan", "desire"} for t in between
            ):
                return False
            return not _HEDGE.search(" ".join(tokens[: i + 1]))
        if token not in _CHAIN and token not in {"intention", "plans", "plan", "desire"}:
            return False
    return False


def subject_of(before: str) -> str:
    """'first', 'third', 'neutral' or 'none' from the nearest subject-like word."""
    for token in reversed(before.split()[-10:]):
        if token in FIRST:
            return "first"
        if token in THIRD:
            return "third"
        if token in NEUTRAL_SUBJECT:
            return "neutral"
    return "none"


_POST_NEGATION = re.compile(
    r"(?:\w+ ){0,2}(?:is|are|was|would be) (?:not|never) (?:an option|the answer|something (?:i|"
    r"that i)|on the table|for me|happening)|(?:\w+ ){0,2}is out of the question|(?:\w+ ){0,2}"
    r"(?:has|have|had) (?:not|never) (?:once )?(?:crossed my mind|been (?:an option|on my mind))|"
    r"(?:\w+ ){0,2}(?:never|does not) (?:cross|crosses) my mind|"
    # A bare denial ending the message: "self harm? no, never, not once".
    r"(?:\w+ ){0,2}(?:no|nope|never)(?: (?:no|nope|never|not once|not ever|ever))* *$"
)


def post_negated(after: str) -> bool:
    """A negation after the phrase: "suicide is not an option", "killing myself is not
    something i would do"."""
    return bool(_POST_NEGATION.match(after.strip()))


ACCIDENT = re.compile(
    r"\b(?:accident|accidentally|by mistake|shaving|cooking|chopping|slicing|while|paper cut|"
    r"tripped|slipped|fell|sunburn|on (?:a|the|some|my) (?:\w+ )?(?:stove|oven|pan|iron|kettle|"
    r"knife|glass|door|table|corner|cupboard|nail|fence|rock|can|tin|edge|mirror|window|bottle|"
    r"plate|hob|grill|radiator)|at the gym|playing|lifting|running|skiing|football|soccer|practice|"
    r"training|workout|making|baking|ironing|straightener|curling iron|"
    r"(?:a|another) (?:slice|piece|portion|bit|helping|serving))\b"
)


HEAVY_FAREWELL = re.compile(r"sorry|love|forgive|take care|peace|ready to go")
URGE_BEFORE = re.compile(
    r"\b(?:thinking about|thought about|think about|thinking of|urge to|urges to|tempted to|"
    r"want to|feel like|craving|itching to|about|of)\s*$"
)


HARD_SIGNALS = frozenset({"method", "plan", "preparation", "goodbye", "act", "means"})

# Comfort aimed at another person ("you're safe", "i'll always be there for you"): the words
# of someone giving support, which the learned layer scores as crisis because crisis talk
# shares them ("safe", "alone", "always", "take care"). Matched on normalise()'s output.
_REASSURANCE = re.compile(
    r"\b(?:you are|you will be|you re|you ll be) (?:safe|not alone|going to be "
    r"(?:ok|okay|fine|alright|all right))\b"
    r"|\bi will (?:always )?(?:be there for|be here for|take care of|look after|stay with|"
    r"stand by) you\b"
    r"|\bi will make sure (?:that )?you (?:are|re) (?:safe|not alone|ok|okay|alright|looked after)\b"
    r"|\bi am (?:always )?here for you\b|\bwe will get through this(?: together)?\b"
    r"|\b(?:it|everything) (?:is going to|will) be (?:ok|okay|fine|alright|all right)\b"
)
# Words that turn comfort into a goodbye ("i will always be there for you, even when i am
# gone"): any of them and the reading does not apply.
_FAREWELL_CUE = re.compile(
    r"\b(?:gone|goodbye|bye|miss me|without me|after i|when i am|watching over|last|forever|"
    r"anymore|die|dead|death|end|leave|leaving|won t be|will not be|better off|sorry)\b"
)
_FILLER = frozenset(
    ("and", "but", "so", "i", "m", "you", "your", "always", "really", "just", "too", "also",
     "now", "here", "there", "ok", "okay", "yes", "of", "course", "promise")
)  # fmt: skip


def reassurance_only(norm: str) -> bool:
    """True when ``norm`` is comfort to someone else and nothing more: at least one
    reassurance phrase, no farewell cue, and at most three other words once the phrases
    and filler are removed (a sentence of distress beside the comfort keeps the model)."""
    if not _REASSURANCE.search(norm) or _FAREWELL_CUE.search(norm):
        return False
    rest = [w for w in re.findall(r"[a-z]+", _REASSURANCE.sub(" ", norm)) if w not in _FILLER]
    return len(rest) <= 3
