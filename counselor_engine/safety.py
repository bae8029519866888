"""Crisis detection that needs no model, and the fixed safe response.

``assess(text)`` runs before anything else on every client message (DESIGN.md, "One turn"),
so it must work whatever state the model backend is in: it is pure Python, uses only
pre-compiled regular expressions and never raises on odd input.

Levels and what the engine does with them:

- ``crisis``: the model is not called. The client gets :func:`safe_response` (warm, plain,
  with the locale's hotline and emergency number) and a clinician is alerted at once.
- ``concern``: the model still replies, with :func:`concern_guidance` added to its system
  prompt (gently check on safety), and the clinician sees a flag on the turn.
- ``none``: nothing changes.

Rules are written from clinical categories (after the structure of the Columbia scale:
wish to be dead -> active ideation -> method -> intent -> plan/preparation), never from
the labelled test sentences. Each rule has an id ``category.name`` and a clinical signal;
what each signal maps to:

==================  ==============================================================  =======
signal              what it covers                                                  level
==================  ==============================================================  =======
intent              first-person wish/intent to kill oneself or end one's life,     crisis
                    "suicidal", considering or attempting suicide, "kms"
death_wish          wish to be dead, not to live, not to wake up; "no reason to      crisis
                    live", "better off dead", "tired of being alive" (a softer
                    "I'd rather be dead" is concern)
method              a method with first-person intent (overdose, jumping, hanging,  crisis
                    firearm, wrists); lethality research ("how many pills would
                    it take")
plan, preparation   a plan or chosen place; stockpiling pills; suicide notes or      crisis
                    letters to family; giving away belongings (rehoming a pet or
                    putting affairs in order alone: concern)
goodbye             finality: "this is goodbye", "won't be around much longer",     crisis
                    "can't see myself alive next year" ("when I'm gone": concern)
burden              "everyone would be better off without me" (crisis); "I'm a      both
                    burden", "no one would miss me" (concern)
act, urge           self-harm done, intended or urged (cutting, burning, hitting     crisis
                    oneself; self-harm as the way to cope)
harm_intent         first-person intent to kill/hurt/stab/shoot a person; a mass    crisis
                    threat; ideation naming a lethal method ("thinking about
                    poisoning my stepdad")
hopelessness        hopeless, trapped, no way out, "can't go on", "nothing will     concern
                    ever change", wanting to disappear, thinking about death
history             past attempts or self-harm, scars, recovery ("clean 2 years")   concern
third_party         someone else is at risk ("my friend said she wants to die")     concern
harm_anger          anger without intent ("I could kill him"), hostile wishes,      concern
                    intrusive thoughts of harming someone, revenge talk
threat_received     the client is threatened or hit by someone                      concern
inquiry             ambiguous method questions ("what if you take too many")        concern
means, timeline,    access to means, "doing it tonight", farewells ("tell my mum    none
farewell, armed,    I'm sorry"), a weapon being readied, knowing where someone
targeting           lives: no level alone; they escalate other evidence (below)
==================  ==============================================================  =======

Modifiers (applied in :func:`assess`, each leaves a line in ``reasons``):

1. Negation: a negator that governs the matched phrase ("I would never kill myself",
   "I'm not going to hurt anyone", "no intention of ...") drops the hit; hedges are not
   negations ("I'm not sure I won't", "I can't stop thinking about ...", "not gonna lie").
   Rules whose wording is itself negative ("I don't want to live") cannot be negated.
2. Figures of speech are removed before matching ("this deadline is killing me",
   "dying to", "to die for", "my boss is going to kill me", "shot myself in the foot").
   Harm-to-others rules need a person as the object, so "kill it at the gym" or "murder a
   pizza" never match.
3. Subject: a hit whose nearest subject is someone else ("my friend said she wants to
   die") becomes ``third_party`` at concern, since a person is still at risk; unless the
   message is about fiction, news or study ("the character killed himself"), which is
   none. A hit with no subject at all is read as first person (chat fragments).
4. History: a crisis hit in a clause about the past ("used to", "when I was 16", "years
   ago", "clean for two years") with no sign of now ("again", "lately", "tonight") is
   concern: a past attempt or self-harm is a risk factor the clinician should see, and a
   gentle safety check is the right reply, but it is not an emergency.
5. Stated safety: ideation with an explicit denial of intent ("... but I would never do
   it") is concern; self-harm urges the client says they resisted are concern.
6. Humour markers ("lol", "lmao", crying-laughing emoji) lower a hit one level unless it
   names a method, plan, preparation or act, or the client says they are serious:
   sarcastic "lol gonna kms if this exam has integrals" is flagged, not escalated.
7. Escalation (risk accumulates): access to means, a timeline ("I'm doing it tonight")
   or a farewell beyond thanks ("tell my parents I'm sorry") together with any other
   suicide or self-harm concern is crisis; preparation or finality with another warning
   sign is crisis; two farewells of which one is heavy are crisis; a weapon with a target
   or revenge talk, or two harm-to-others warning signs, are crisis.

``assess`` looks at one message. The caller may pass a short window of recent client
turns joined together when it wants context across messages.

Measured limits (``tests/data/crisis_eval.jsonl``, see ``tests/test_safety.py``): on
statements written after the rules and scored once before any fix, explicit statements
were caught 91% of the time but indirect ones only about 45% (false-positive rate about
4%). Rules catch what they were written for; phrasing nobody anticipated slips through.

So :func:`assess` adds a learned second layer (:mod:`counselor_engine.safety_model`, no
LLM call): a small logistic model over MiniLM sentence embeddings and hashed n-grams that
can only raise the rules' level. On held-out statements (``tests/data/crisis_eval_v2.jsonl``,
``tests/test_safety_model.py``) it took indirect crisis recall from 22% to 83% and flagged
90-100% of positives at some level, at the price of more false positives on hard negatives
(about 3% -> 16%). Treat ``none`` as "nothing fired", not as "safe", and keep the
clinician in the loop.
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Literal

Level = Literal["none", "concern", "crisis"]
Category = Literal["suicide", "self_harm", "harm_to_others"]

LEVELS: tuple[Level, ...] = ("none", "concern", "crisis")
_RANK = {level: i for i, level in enumerate(LEVELS)}
RESOURCES_PATH = Path(__file__).resolve().parent / "data" / "safety" / "resources.json"
DEFAULT_LOCALE = "en-US"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SafetyAssessment:
    """The verdict on one message.

    ``matched`` holds rule ids for the clinician's alert (never shown to the client);
    ``reasons`` says in words what matched and which modifiers applied.
    """

    level: Level
    categories: tuple[str, ...] = ()
    matched: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def is_crisis(self) -> bool:
        return self.level == "crisis"

    @property
    def needs_flag(self) -> bool:
        """True at concern and crisis: the clinician sees this turn."""
        return self.level != "none"


def _words(text: str) -> list[str]:
    return text.split()


# -- normalisation -------------------------------------------------------------------------

_ZERO_WIDTH = re.compile("[\u200b-\u200f\u2060\ufeff\u00ad]")
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'", "`": "'", "\u00b4": "'"})
_HUMOUR = re.compile(
    r"\b(?:lol+|lmf?ao+|rofl|(?:ha){2,}h?|(?:he){2,}|jk|just kidding|xd)\b|/s\b"
    r"|[\U0001f602\U0001f923\U0001f606\U0001f605\U0001f480\U0001f643]"
)
_SERIOUS = re.compile(
    r"\b(?:not (?:joking|kidding)|i am (?:dead )?serious|i mean it|for real this time)\b"
)
_CONTRACTIONS = [
    (re.compile(r"\bcan'?t\b"), "can not"),
    (re.compile(r"\bcannot\b"), "can not"),
    (re.compile(r"\bwon'?t\b"), "will not"),
    (re.compile(r"\bain'?t\b"), "is not"),
    (re.compile(r"\bshan'?t\b"), "shall not"),
    (re.compile(r"n't\b"), " not"),
    (re.compile(r"'m\b"), " am"),
    (re.compile(r"'re\b"), " are"),
    (re.compile(r"'ve\b"), " have"),
    (re.compile(r"'ll\b"), " will"),
    (re.compile(r"'d\b"), " would"),
    (re.compile(r"\blet's\b"), "let us"),
    (re.compile(r"\b(it|that|what|there|he|she|who|here|where|everything|nothing|life|this)'s\b"),
     r"\1 is"),
]  # fmt: skip
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a",
                       "$": "s", "!": "i", "|": "l", "8": "b"})  # fmt: skip
_LEET_TOKEN = re.compile(r"[^\s0134578@$!|]*[0134578@$!|]\S*")
_LEET_CHARS = re.compile(r"[0134578@$!|]")
_SPACED = re.compile(r"\b(?:[a-z][ .\-_*]){2,}[a-z]\b")
_REPEATS = re.compile(r"([a-z])\1{2,}")
_NON_TEXT = re.compile(r"[^a-z0-9.!?;\n ]+")
_WS = re.compile(r"[ \t\r\f\v]+")

# Whole tokens (after punctuation is gone) rewritten to one canonical spelling. Chat
# shorthand, apostrophe-less contractions and known euphemisms for suicide.
_TOKENS: dict[str, str] = {
    "im": "i am", "ive": "i have", "dont": "do not", "doesnt": "does not", "didnt": "did not",
    "cant": "can not", "wont": "will not", "wouldnt": "would not", "couldnt": "could not",
    "shouldnt": "should not", "isnt": "is not", "arent": "are not", "wasnt": "was not",
    "werent": "were not", "havent": "have not", "hasnt": "has not", "hadnt": "had not",
    "aint": "is not", "thats": "that is", "theres": "there is", "whats": "what is",
    "youre": "you are", "theyre": "they are", "theyll": "they will", "theyd": "they would",
    "hes": "he is", "shes": "she is", "wanna": "want to", "gonna": "going to", "gotta": "got to",
    "imma": "i am going to", "ima": "i am going to", "tryna": "trying to", "finna": "going to",
    "u": "you", "ur": "your", "ya": "you", "abt": "about", "bc": "because", "cuz": "because",
    "coz": "because", "cos": "because", "rn": "right now", "tmrw": "tomorrow", "tmr": "tomorrow",
    "tomoz": "tomorrow", "2morrow": "tomorrow", "tonite": "tonight", "2nite": "tonight",
    "2night": "tonight", "nite": "night", "2day": "today", "b4": "before", "4ever": "forever",
    "ppl": "people", "pls": "please", "plz": "please", "bf": "boyfriend", "gf": "girlfriend",
    "ngl": "not going to lie", "idk": "i do not know", "idc": "i do not care",
    "tbh": "to be honest", "smth": "something", "wnat": "want", "wan": "want",
    "whant": "want", "wnt": "want",
    "kms": "kill myself", "kys": "kill yourself", "kml": "kill my life", "lif": "life",
    "sewerslide": "suicide", "suicided": "suicide",
    "selfharm": "self harm", "selfharming": "self harming", "od": "overdose", "oding": "overdosing",
    "kll": "kill", "lyf": "life", "mysef": "myself", "meself": "myself", "myslf": "myself",
    "ded": "dead", "dye": "die", "cutt": "cut", "cuttin": "cutting", "stabb": "stab",
    "hurtt": "hurt", "dieing": "dying", "wana": "want to", "wanan": "want to", "dnt": "do not",
    "dosnt": "does not",
    "gona": "going to", "wud": "would", "bein": "being", "lyfe": "life", "pils": "pills",
    "jmp": "jump", "brige": "bridge", "suiside": "suicide", "overdoze": "overdose",
    "anymor": "anymore", "agen": "again", "tak": "take",
}  # fmt: skip
_PHRASES = [
    (re.compile(r"\bsewer slide\b"), "suicide"),
    (re.compile(r"\bself delet(?:e|ing)\b|\bdelete myself\b"), "kill myself"),
    (re.compile(r"\bmy self\b"), "myself"),
    (re.compile(r"\b(end|ending) it al\b"), r"\1 it all"),
    # Dropped g: "thinkin", "cuttin", "killin".
    (re.compile(r"\b(think|feel|cutt|kill|hurt|try|go|want|plann|dy|liv|noth|someth|end|tak|"
                r"hang|jump|harm|burn|start|bleed|cry)in\b"), r"\1ing"),
    (re.compile(r"\boverdoes (?=on|with)"), "overdose "),
    (re.compile(r"\bcommit die\b"), "commit suicide"),
    (re.compile(r"\bill (?=(?:kill|hurt|end|do|just|never|be|make|jump|take|cut|shoot|stab|go|"
                r"probably|definitely|try|not|die|overdose|hang)\b)"), "i will "),
    (re.compile(r"\bid (?=(?:rather|be|never|kill|hurt|love|like|just|want|die|do|end)\b)"),
     "i would "),
    (re.compile(r"\b(want|wanna|going|need|have|got|how|ready|try|trying|able) (?:2|too)\b"),
     r"\1 to"),
    (re.compile(r"\bdie (?=(?:my|her|his|your|their|the) (?:hair|clothes|shirt|jeans|beard)\b)"),
     "dye "),
]  # fmt: skip

# "unalive" is a verb with or without an object: "unalive myself", "unalive him", and
# plain "i want to unalive" (= die).
_PRE_TOKENS = [
    (
        re.compile(
            r"\bunaliv(?:e|ing|ed) (?=(?:myself|me|my self|him|her|them|you|someone|"
            r"somebody|people|everyone|my|his|her|their|that|this|the)\b)"
        ),
        "kill ",
    ),
    (re.compile(r"\bunaliv(?:e|ing)\b"), "die"),
    (re.compile(r"\bunalived\b"), "died"),
    (
        re.compile(r"\b(hurt|kill|stab|shoot|beat|punch|hit|strangle|choke) (?:hm|hem|hin)\b"),
        r"\1 him",
    ),
]

# Edit-distance-1 spellings of words that carry risk, mapped back to the word. Real words
# at distance 1 are excluded so an ordinary word is never rewritten into a risk word.
_FUZZY_WORDS = (
    "suicidal", "suicide", "myself", "himself", "herself", "yourself", "themselves",
    "overdose", "overdosing", "overdosed", "tonight", "tomorrow", "anymore", "goodbye",
    "hopeless", "killing", "cutting", "strangle", "stabbing", "poison", "wrists", "alive",
    "burden", "living", "harming", "hurting",
)  # fmt: skip
_FUZZY_REAL = frozenset(
    _words(
        "overdoes alike olive aline alive living loving giving diving hiving jiving "
        "hurtling hurting kilning killing billing filling willing milling tilling pilling "
        "gutting putting jutting butting rutting nutting tutting cutting harping carting "
        "warming farming charming burdens burden myself wrist rists poisons goodbyes "
        # Names and words one letter from a risk word ("about alice" read as "about alive").
        "alice clive hurling"
    )
)


def _edits1(word: str) -> set[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    out = {a + b[1:] for a, b in splits if b}
    out |= {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
    out |= {a + c + b[1:] for a, b in splits if b for c in letters}
    out |= {a + c + b for a, b in splits for c in letters}
    return out


@cache
def _fuzzy_map() -> dict[str, str]:
    table: dict[str, str] = {}
    for word in _FUZZY_WORDS:
        for variant in _edits1(word):
            if len(variant) >= 5 and variant not in _FUZZY_REAL and variant != word:
                table.setdefault(variant, word)
    for word in _FUZZY_WORDS:
        table.pop(word, None)
    # Spellings seen in the wild that sit two edits away.
    table.update({"sucidal": "suicidal", "suicdal": "suicidal", "suacidal": "suicidal",
                  "suiside": "suicide", "sueside": "suicide", "suiscide": "suicide",
                  "sooicide": "suicide", "suiciide": "suicide", "myslef": "myself",
                  "mysefl": "myself", "suicidle": "suicidal", "sucidle": "suicidal",
                  "suicidial": "suicidal", "suicudal": "suicidal"})  # fmt: skip
    return table


_SPLIT = re.compile(r"([^a-z0-9]+)")


def _leet_token(match: re.Match[str]) -> str:
    token = match.group()
    if not _LEET_CHARS.search(token):
        return token
    core = token.rstrip(".!?,;:")
    tail = token[len(core) :]
    if not re.search(r"[a-z]", core) or re.fullmatch(r"[a-z]+[.!?]*", core):
        return token
    return core.translate(_LEET) + tail


def _gated_subs(subs: list[tuple[re.Pattern[str], str]], text: str) -> str:
    for pattern, repl in subs:
        if _may_match(_sub_needles(pattern), text):
            text = pattern.sub(repl, text)
    return text


@cache
def _sub_needles(pattern: re.Pattern[str]) -> frozenset[str] | None:
    return _required_literals(pattern)


def normalise(text: str) -> str:
    """Canonical lower-case text the rules are written against.

    NFKC, lower case, apostrophes and contractions expanded, leetspeak inside words
    ("k1ll", "su1c1de"), censoring stars and spaced letters joined ("k*ll", "d i e"), runs
    of three or more letters collapsed ("dieeee" -> "die"), chat shorthand and known
    misspellings rewritten ("kms", "suicde", "myslef", "unalive"). Sentence punctuation is
    kept as clause boundaries; everything else becomes a space.
    """
    t = unicodedata.normalize("NFKC", text).lower().translate(_QUOTES)
    t = _ZERO_WIDTH.sub("", t)
    if "'" in t:
        # Possessive "boss's" must not become "bosss" (collapsed below to "bos").
        t = _gated_subs(_CONTRACTIONS, t).replace("s's", "s").replace("'", "")
    elif "cannot" in t:
        t = t.replace("cannot", "can not")
    if _LEET_CHARS.search(t):
        t = _LEET_TOKEN.sub(_leet_token, t)
    t = re.sub(r"(?<=[a-z])\*+(?=[a-z])", "", t)
    t = _SPACED.sub(lambda m: re.sub(r"[ .\-_*]", "", m.group()), t)
    t = _REPEATS.sub(r"\1", t)
    t = re.sub(r"\b(lif|di|liv|aliv)e{2,}\b", r"\1e", t)
    t = _NON_TEXT.sub(" ", t)
    t = _WS.sub(" ", t)
    fuzzy = _fuzzy_map()
    parts = _SPLIT.split(t)
    parts[::2] = [fuzzy.get(w, w) for w in parts[::2]]
    t = "".join(parts)
    t = _gated_subs(_PRE_TOKENS, t)
    parts = _SPLIT.split(t)
    parts[::2] = [_TOKENS.get(w, w) for w in parts[::2]]
    t = "".join(parts)
    t = _gated_subs(_PHRASES, t)
    return _WS.sub(" ", t).strip()


# -- vocabulary ----------------------------------------------------------------------------

SELF = r"(?:myself|me self)"
KILL = r"(?:k(?:i|y|e)?l+(?:ing|ed|s)?|murder(?:ing|ed)?)"
PILLS = (
    r"(?:pills|meds|medication|medications|medicine|tablets|sleeping pills|sleeping tablets|"
    r"painkillers|pain killers|tylenol|paracetamol|acetaminophen|ibuprofen|insulin|"
    r"antidepressants|xanax|heroin|fentanyl|opioids|oxy|oxycodone|lithium|aspirin|sleeping meds|"
    r"benzos|prescription|prescriptions)"
)
PLACE = (
    r"(?:bridge|building|roof|rooftop|balcony|cliff|overpass|tower|train|tracks|bus|truck|lorry|"
    r"car|cars|traffic|window|parking garage|car park|motorway|highway|freeway|platform)"
)
RELATION = (
    r"(?:boss|manager|supervisor|wife|husband|ex|ex wife|ex husband|dad|father|mom|mum|mother|"
    r"stepdad|stepfather|stepmom|stepmother|brother|sister|son|daughter|kid|kids|baby|babies|"
    r"child|children|roommate|flatmate|neighbou?r|neighbou?rs|coworker|coworkers|colleague|"
    r"colleagues|teacher|teachers|professor|partner|girlfriend|boyfriend|friend|friends|family|"
    r"parents|classmate|classmates|bully|bullies|guy|guys|man|men|woman|women|girl|boy|lady|"
    r"dude|bitch|bastard|asshole|jerk|idiot|landlord|cousin|uncle|aunt|nephew|niece|grandpa|"
    r"grandma|father in law|mother in law|in laws|doctor|therapist|cop|cops|police|officer|"
    r"student|students|customer|customers|pastor|coach|abuser|rapist|twin|stepson|stepdaughter|"
    r"bf|gf|ex boyfriend|ex girlfriend|husbands|wifes)"
)
PERSON = (
    rf"(?:him|her(?! (?:feelings|record|chances|career|reputation|pride|ego|vibe|mood|score|"
    rf"time|game|business|plans|plan|hair|dog|cat|car|phone|joke|jokes)\b)|them|you|someone|"
    rf"somebody|anyone|anybody|everyone|everybody|people|a person|each of them|them all|"
    rf"(?:my|his|her|their|that|this|the|those|these|your|our) (?:\w+ )?{RELATION})"
)
HARM = (
    r"(?:beat the (?:hell|crap|shit|life|living daylights|snot) out of|k(?:i|y)?l+|murder|hurt|harm"
    r"|stab|shoot|strangle|choke|beat up|beat|punch|attack|"
    r"poison|smother|run over|torture|maim|slap|hit|bash|kick|drown|suffocate|burn|"
    r"shoot up|knife|cut)"
)
HARMING = (
    r"(?:k(?:i|y)?l+ing|killed|murdering|murdered|hurting|hurt|harming|harmed|stabbing|stabbed|"
    r"shooting|shot|strangling|strangled|choking|choked|beating|punching|punched|attacking|"
    r"attacked|poisoning|poisoned|smothering|torturing|slapping|hitting|bashing|kicking|"
    r"drowning|burning)"
)
# "I hurt him by forgetting", "hurt her emotionally": hurt feelings, not violence.
EMOTIONAL = (
    r"(?! (?:by|emotionally|feelings|when i said|with (?:my |what i )?(?:words|said)|so bad "
    r"by|a (?:message|text|email|look|glance|smile|dm|line|note)|an email))"
)
STRONG_INTENT = (
    r"(?:want to|going to|will|plan to|planning to|planning on|intend to|ready to|decided to|"
    r"swear i will|about to|need to|have to|got to|would love to|gonna|wish i could|"
    r"determined to|finally going to|fully intend to|really want to|seriously want to|"
    r"really going to)"
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
_CLAUSE_BREAK = re.compile(r"[.!?;\n]+|\b(?:but|though|although|however|except|whereas)\b")
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
    _words(
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
    _words(
        "he she they his her their him them hers theirs himself herself themselves friend friends "
        "sister brother mom mum dad mother father son daughter cousin aunt uncle grandma grandpa "
        "grandmother grandfather roommate flatmate boyfriend girlfriend partner husband wife ex "
        "kid kids child children classmate coworker colleague neighbor neighbour student someone "
        "somebody people character guy girl man woman person boy lady teen teenager who niece "
        "nephew patient client stepdad stepmom bestie bff"
    )
)
NEUTRAL_SUBJECT = frozenset({"we", "us", "our", "ours"})


# -- gating --------------------------------------------------------------------------------
# Running ~90 regexes over a long message costs milliseconds; most rules cannot match most
# text. Each pattern's parse tree gives a set of literal strings one of which every match
# must contain; a rule whose strings are all absent is skipped (a substring test is cheap).
# A test checks that gated and ungated matching agree on the whole labelled set.


def _required_seq(items: list[tuple[object, object]]) -> frozenset[str] | None:
    from re import _constants as sre  # type: ignore[attr-defined]

    candidates: list[frozenset[str]] = []
    run: list[str] = []
    for op, av in items:
        if op is sre.LITERAL:
            run.append(chr(av))  # type: ignore[arg-type]
            continue
        if run:
            candidates.append(frozenset({"".join(run)}))
            run = []
        req: frozenset[str] | None = None
        if op is sre.SUBPATTERN:
            req = _required_seq(list(av[-1]))  # type: ignore[index]
        elif op is sre.BRANCH:
            parts = [_required_seq(list(b)) for b in av[1]]  # type: ignore[index]
            if all(part is not None for part in parts):
                req = frozenset().union(*parts)  # type: ignore[arg-type]
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            low, _high, sub = av  # type: ignore[misc]
            if low >= 1:
                req = _required_seq(list(sub))
        if req is not None:
            candidates.append(req)
    if run:
        candidates.append(frozenset({"".join(run)}))

    def strength(c: frozenset[str]) -> int:
        return min(len(x.strip()) for x in c)

    candidates = [c for c in candidates if c and strength(c) >= 2]
    if not candidates:
        return None
    return max(candidates, key=lambda c: (strength(c), -len(c)))


def _required_literals(pattern: re.Pattern[str]) -> frozenset[str] | None:
    try:
        from re import _parser as sre_parse  # type: ignore[attr-defined]

        return _required_seq(list(sre_parse.parse(pattern.pattern)))
    except Exception:  # a future re module: fall back to always running the rule
        return None


def _may_match(needles: frozenset[str] | None, text: str) -> bool:
    return needles is None or any(map(text.__contains__, needles))


# -- rules ---------------------------------------------------------------------------------

Signal = str


@dataclass(frozen=True)
class _Rule:
    id: str
    category: Category
    level: Level
    signal: Signal
    pattern: re.Pattern[str]
    negatable: bool = True
    subject: bool = True  # nearest subject decides first person vs third party
    topic: bool = False  # drop when the message is about media/study and no "i" is the subject
    needles: frozenset[str] | None = None  # any match contains one of these (None: always run)


def _rule(
    id: str, category: Category, level: Level, signal: Signal, pattern: str, **kw: object
) -> _Rule:
    compiled = re.compile(pattern)
    return _Rule(id, category, level, signal, compiled, needles=_required_literals(compiled), **kw)  # type: ignore[arg-type]


_SUICIDE_NOUN_OK = (
    r"(?! (?:prevention|rates?|hotline|line|lines|awareness|statistics|research|risk|squad|"
    r"bombers?|bombing|mission|doors|watch|survivors?|loss|crisis|helpline|training|forest|"
    r"note in the))"
)

RULES: tuple[_Rule, ...] = (
    # Suicide: intent and ideation (C-SSRS 2-4).
    _rule("suicide.self_kill", "suicide", "crisis", "intent",
          rf"\b(?:{KILL}|off|offing|hang|hanging|hanged|hung|shoot|shooting|shot|drown|drowning|"
          rf"poison|poisoning|suffocate|suffocating|gas|gassing|electrocute|stab|stabbing|"
          rf"throw|throwing|end|ending|finish|finishing) {SELF}\b"),
    _rule("suicide.end_life", "suicide", "crisis", "intent",
          r"\b(?:end|ending|ended|take|taking|took|finish|finishing|terminate) (?:my|me) (?:own )?"
          r"(?:life|lyf)\b|\bend(?:ing)? (?:it all|everything|all of this|it for good|it forever|"
          r"my existence|my suffering for good)\b(?! (?:with|between))"),
    _rule("suicide.commit", "suicide", "crisis", "intent",
          rf"\b(?:commit|committing|attempt|attempting|attempted|tried|try|trying|consider|"
          rf"considering|contemplate|contemplating|thinking about|think about|thought about|"
          rf"thoughts of|thoughts about|plan|planning|want|wanted|ready for|decided on|obsessed "
          rf"with|fantasi[sz]e about|fantasi[sz]ing about|researching|googling|into|do|doing|"
          rf"go through with|prepare|preparing|rehearse|rehearsing) (?:about |of |to )?"
          rf"(?:committing "
          rf"|commit |my |my own )?suicide\b{_SUICIDE_NOUN_OK}|\b(?:i|i have|i had) attempted "
          rf"(?:twice|once|before|again|\w+ times|several times|a few times|multiple times|in|when|"
          rf"last|as|at)\b",
          topic=True),
    _rule("suicide.own_attempt", "suicide", "crisis", "intent",
          r"\bmy (?:\w+ )?suicide (?:attempt|attempts|note|plan|plans|letter)\b"),
    _rule("suicide.suicidal", "suicide", "crisis", "intent",
          r"\b(?:feel|feeling|felt|am|so|very|really|been|getting|get) suicide\b|\bsuicidal\b(?! "
          r"(?:people|person|patients?|clients?|callers?|characters?|friend|"
          r"friends|teens?|behaviou?r in))", topic=True),
    _rule("suicide.soft_end", "suicide", "concern", "hopelessness",
          r"\b(?:want to|going to|ready to|plan to|decided to|just|finally|should|could) (?:just )?"
          r"end it\b(?! (?:with|between|all))"),
    # Wish to be dead (C-SSRS 1), stated directly: crisis by our policy (see module doc).
    _rule("suicide.death_wish", "suicide", "crisis", "death_wish",
          r"\b(?:want|wanted|wants|wish|wishing|wished|would like|ready|need|needs|hope|hoping|"
          r"pray|praying|long|longing|deserve|deserves|just want|desperately want) (?:to )?(?:just"
          r" )?"
          r"(?:die|be dead|not exist|stop existing|cease to exist|not be alive|be gone forever|"
          r"not wake up|never wake up|sleep forever|fall asleep forever|disappear forever|go to "
          r"sleep forever|"
          r"be with (?:\w+ )?in heaven)\b"),
    _rule("suicide.wish_dead", "suicide", "crisis", "death_wish",
          r"\bwish (?:i|that i) (?:was|were|had been|would be|could be|was just|were just) "
          r"(?:dead|never born|not born|not alive|not here|gone)\b|\bwish (?:i|that i) (?:\w+"
          r" ){0,2}"
          r"(?:never been born|not been born|was never born|were never born|was not born|never "
          r"existed|did not exist)\b|\bwish (?:i|that i) (?:could|"
          r"would|will|can|did) (?:just )?(?:die|not wake up|never wake up|fall asleep forever|go"
          r" to "
          r"sleep forever|fall asleep and (?:not|"
          r"never) wake up|go to sleep and (?:not|never) wake up|sleep forever|disappear forever|"
          r"stop existing|not exist|drop dead)\b|\bwish (?:someone|somebody|something) would "
          r"(?:just )?(?:kill me|end me|end it for me)\b", negatable=False),
    _rule("suicide.never_wake", "suicide", "crisis", "death_wish",
          r"\b(?:sleep|fall asleep|go to sleep|close my eyes) and (?:not|never) (?:wake|open)|"
          r"\bhope (?:i|that i) (?:do not|never|will not) wake up\b|\bhope (?:i|that i) (?:die|"
          r"get hit by|crash|do not make it|never come back)\b|\b(?:would not|will not|wouldnt) "
          r"mind (?:if i )?(?:dying|not waking up|if i died|being dead|never waking up|if i did "
          r"not wake up)", negatable=False),
    _rule("suicide.better_dead", "suicide", "crisis", "death_wish",
          r"\b(?:better off dead|be better dead|rather be dead than alive|better if i (?:was|were) "
          r"dead|better if i died)\b", negatable=False),
    _rule("suicide.rather_dead", "suicide", "concern", "death_wish",
          r"\brather (?:be dead|die|not exist|not be alive|not wake up)\b"),
    _rule("suicide.not_live", "suicide", "crisis", "death_wish",
          r"\b(?:do not|does not|no longer|not|never)(?: (?:really|even|truly|think|know if|know "
          r"whether|feel like|i|that|sure|if|even|honestly))* (?:want|wanna|wish|"
          r"care|feel like i want|feel like|see (?:a|any) reason|have (?:a|any) reason) (?:to )?"
          r"(?:live|be alive|exist|be here anymore|wake up|keep living|go on living|go on|stay "
          r"alive|continue living|survive|keep going|be on this earth)\b(?! (?:like this|this way|"
          r"in this|with this|like that|with|without|in|there|at|here))", negatable=False),
    _rule("suicide.not_live_like_this", "suicide", "concern", "hopelessness",
          r"\b(?:do not|no longer|not) (?:really )?(?:want|wanna|wish) to (?:live|go on|keep "
          r"living|keep going|be here|be here anymore|exist) (?:like this|this way|in this|with"
          r" this|like that)\b",
          negatable=False),
    _rule("suicide.no_reason", "suicide", "crisis", "death_wish",
          r"\b(?:no|not (?:see|have|find) (?:a|any|the)|what is the|lost (?:my|the|all|any)|without"
          r" "
          r"(?:a|any)|cannot find a|there is no) (?:point|reason|purpose|will)(?: (?:in|of|for"
          r"|to))?"
          r"(?: me)?(?: to)? (?:living|live|being alive|stay alive|staying alive|existing|exist|"
          r"go on|going on|keep living|wake up|waking up|be here|being here|continue)\b|"
          r"\b(?:nothing|no one|nobody|none) (?:left )?to live for\b|\bnot (?:have )?anything "
          r"(?:left )?to live for\b", negatable=False),
    _rule("suicide.tired_of_living", "suicide", "crisis", "death_wish",
          r"\b(?:tired|sick|weary|exhausted) of (?:living|being alive|existing|life itself|"
          r"waking up|being here|this life)\b|\b(?:life|living|my life) (?:is not|is no longer|"
          r"not|no longer) worth (?:living|it anymore|it at all|anything)\b|\blife (?:is not|"
          r"isnt) worth it\b|\bdone with (?:life|living|being alive|existing)\b",
          negatable=False),
    _rule("suicide.do_not_care_live", "suicide", "crisis", "death_wish",
          r"\b(?:do not|does not|no longer) care (?:if|whether) i (?:live|die|wake up|make it|"
          r"survive|get hit|am alive|am dead|live or die)\b", negatable=False),
    _rule("suicide.not_deserve_live", "suicide", "crisis", "death_wish",
          r"\b(?:do not|does not|not) deserve to (?:live|be alive|exist|be here|breathe|be on "
          r"this earth)\b|\bshould (?:not|never have) (?:be alive|exist|have been born|been born|"
          r"be on this earth)\b", negatable=False),
    _rule("suicide.want_end", "suicide", "crisis", "death_wish",
          r"\bwant (?:it|everything|this|it all|all of this|all of it|my life) (?:all )?to "
          r"(?:end|stop|be over) (?:forever|for good|permanently)\b|\bwant to stop existing\b"),
    _rule("suicide.pain_for_good", "suicide", "crisis", "death_wish",
          r"\b(?:make|making|end|ending|stop|stopping) (?:the|this|my|all the|all this) (?:pain|"
          r"hurt|suffering|misery) (?:stop |end |go away )?(?:for good|forever|permanently|once "
          r"and for all)\b"),
    _rule("suicide.want_stop", "suicide", "concern", "hopelessness",
          r"\bwant (?:it|everything|this|it all|all of this|all of it|the pain|this pain|the "
          r"hurt|the suffering|my pain) (?:all )?to (?:just )?(?:end|stop|be over|go away)\b"),
    # Burdensomeness (Joiner): "better off without me" implies the client's absence.
    _rule("suicide.burden_absence", "suicide", "crisis", "burden",
          r"\b(?:everyone|everybody|they|people|my (?:\w+ )?(?:family|kids|children|parents|mom|"
          r"mum|dad|wife|husband|partner|friends|boyfriend|girlfriend|sister|brother)|the world|"
          r"you all|you guys|it|things|life|everything) (?:would|will|could|might) (?:all )?be "
          r"(?:so |much |a lot |way )?(?:better|happier|easier|fine|okay|ok|lighter|calmer)"
          r"(?: off)?(?: for (?:everyone|everybody|them|all|my \w+|you))? (?:without me|if i "
          r"(?:was|were|am|was just|were just) (?:gone|dead|not here|not around|never born|not "
          r"alive)|if i (?:just )?(?:died|disappeared|did not exist|was not here|were not here|was"
          r" not "
          r"around|were not around|killed myself))\b|\bif i (?:died|was gone|were gone|was dead|"
          r"were dead|killed myself|disappeared) (?:no one|nobody|everyone|they|people|my "
          r"\w+) (?:would|will) (?:even )?(?:care|notice|miss me|be happier|be better|be fine|"
          r"be relieved)|\b(?:no one|nobody|noone) (?:would|will) (?:even |really )?(?:care|"
          r"notice|miss me|cry) if i (?:died|was gone|were gone|was dead|were dead|killed myself|"
          r"disappeared|did not wake up)\b", negatable=False),
    _rule("suicide.burden_parent", "suicide", "crisis", "burden",
          r"\b(?:my )?(?:kids|children|son|daughter|baby|family|boys|girls) (?:would|will|could) "
          r"(?:all )?be (?:so |much |a lot )?(?:better|happier)(?: off)? without (?:their|his|her) "
          r"(?:mother|mum|mom|mummy|mommy|father|dad|daddy)\b", negatable=False),
    _rule("suicide.burden_soon", "suicide", "crisis", "burden",
          r"\b(?:soon|shortly|after (?:tonight|today)).{0,20}\b(?:will not|not going to) be (?:a"
          r"|an) "
          r"(?:problem|burden|bother|issue) (?:for|to) (?:anyone|anybody|you|them|everyone)|\b"
          r"(?:will "
          r"not|not going to) be (?:a|an) (?:problem|burden|bother|issue) (?:for|to) (?:anyone|"
          r"anybody|you|them|everyone) (?:much longer|for long|anymore|soon|after (?:tonight|"
          r"today))\b|\b(?:will not|not going to) be (?:a|an) (?:problem|burden|bother) (?:much "
          r"longer|for (?:much )?long|after (?:tonight|today|this week))\b", negatable=False),
    _rule("suicide.burden", "suicide", "concern", "burden",
          r"\b(?:a|such a|just a|nothing but a|only a) (?:burden|waste of (?:space|air|oxygen|"
          r"life|skin))\b|\bburden (?:to|on|for) (?:everyone|everybody|my \w+|them|people|you|"
          r"my family|others)\b|\b(?:no one|nobody|noone|anyone|anybody|people|they) (?:would|"
          r"will) (?:even |really |actually )?(?:care|notice|miss me)\b|\b(?:everyone|everybody|"
          r"they|people|my (?:\w+ )?(?:family|kids|children|parents|friends)) (?:would|will) be "
          r"(?:\w+ )?(?:better|happier|easier)(?: off)? (?:without (?:me|their \w+|his \w+|her "
          r"\w+)|if i (?:just )?(?:left|went away|was not in their lives|moved away))\b"),
    # Method (C-SSRS 3) and lethality research.
    _rule("suicide.overdose", "suicide", "crisis", "method",
          rf"\b(?:overdose|overdosing|overdosed|od) (?:on|with) (?:my |all my |all of my |all the |"
          rf"a bottle of |a whole bottle of |the |some |those |these |a bunch of |enough"
          rf" )?{PILLS}\b|"
          rf"\b(?:want|wanted|going|plan|planning|thinking about|think about|thought about|tempted|"
          rf"ready|decided|could|might|will|should|urge|tried) (?:to )?(?:just )?(?:overdose|"
          rf"overdosing)\b|\b(?:i|i have|i had) (?:overdosed|taken an overdose|took an "
          rf"overdose)\b(?! on (?!(?:my |all my |the |some |those |a bottle of )?{PILLS}))"),
    _rule("suicide.take_all_pills", "suicide", "crisis", "method",
          rf"\b(?:take|taking|took|swallow|swallowing|swallowed|down|downing|downed|eat|empty) "
          rf"(?:all|every|every single|the whole|a whole|the rest of|a bottle of|a handful of|"
          rf"handfuls of|a bunch of|as many|all of|every last|enough|a box of|two boxes of|a "
          rf"month of|a pack of|packs of)(?: \w+){{0,3}} (?:{PILLS}|pill|tablet|capsule)\b(?! "
          rf"(?:this morning|today|on time|as prescribed|like (?:the|my) doctor|every day|with|in "
          rf"the morning|at night|daily|as|before|after|on an empty|in one go with|each day))"),
    _rule("suicide.jump", "suicide", "crisis", "method",
          rf"\b(?:jump|jumping|jumped|throw myself|step|stepping|walk|walking|lie down|lay down|"
          rf"lying down) (?:off|from|in front of|onto|under|into) (?:a |the |my |that |this |"
          rf"some |our )?(?:\w+ )?{PLACE}\b|\b(?:drive|driving|crash|crashing|swerve|swerving) "
          rf"(?:my car |the car )?(?:into|off) (?:a |the |that |some )?(?:wall|tree|river|lake|"
          rf"oncoming traffic|traffic|cliff|bridge|truck|pole)\b|\bwalk(?:ing)? into (?:the )?"
          rf"(?:sea|ocean|river|lake|traffic)\b"),
    _rule("suicide.height", "suicide", "crisis", "method",
          rf"\b(?:looking for|look for|find|found|searching for|scouting|picked) (?:a |the )?"
          rf"(?:high|"
          rf"tall) enough (?:\w+ )?(?:{PLACE}|place|spot|ledge)\b|\b(?:{PLACE}|ledge) (?:high|tall)"
          rf" "
          rf"enough to (?:die|kill|do it|not survive|end it)\b"),
    _rule("suicide.jump_intent", "suicide", "concern", "method",
          r"\b(?:going to|want to|ready to|about to|will|could just|should just|gonna) (?:just )?"
          r"jump\b(?! (?:in|into|on|onto|at|rope|start|the queue|ship|to conclusions|out|up|around|"
          r"over|through|for|back|ahead|off (?:the|a) (?:diving|high) board))"),
    _rule("suicide.at_height", "suicide", "none", "means",
          r"\b(?:standing|sitting|am|i am|stood|climbed|climbing) (?:on|at|onto|over|up) (?:the |a "
          r"|"
          r"this |that )?(?:edge of (?:the |a |this )?)?(?:bridge|ledge|roof|rooftop|cliff|balcony|"
          r"railing|railings|tracks|parapet|top of (?:the |a )?(?:building|car park|multi storey))"
          r"\b", negatable=False, subject=False),
    _rule("suicide.wrists", "suicide", "crisis", "method",
          r"\b(?:slit|slice|slash|cut|open|slitting|slicing|cutting) (?:open )?(?:my |both )?"
          r"(?:wrists?|throat|veins)\b"),
    _rule("suicide.hanging", "suicide", "crisis", "method",
          r"\b(?:noose|tie a rope|tied a rope|tying a rope|rope around my neck|belt around my "
          r"neck|tie the rope|rope to hang)\b"),
    _rule("suicide.firearm", "suicide", "crisis", "method",
          r"\b(?:gun|pistol|rifle|shotgun|barrel) (?:to|in|against|into) my (?:head|mouth|temple|"
          r"chin)\b|\b(?:put|putting) a bullet (?:in|through) my (?:head|brain|skull)\b|\bblow "
          r"my (?:brains|head) (?:out|off)\b"),
    _rule("suicide.other_method", "suicide", "crisis", "method",
          r"\b(?:carbon monoxide|gas myself|with the (?:car|engine) running in the garage|"
          r"exhaust pipe|(?:bought|buy|buying|got|found|measured) (?:\w+ ){0,4}hose (?:\w+ ){0,4}"
          r"exhaust|helium bag|bag over my head|drink (?:bleach|antifreeze)|drinking "
          r"(?:bleach|antifreeze))\b"),
    _rule("suicide.lethality", "suicide", "crisis", "method",
          r"\bhow (?:many|much) (?:\w+ ){0,4}(?:would it take|does it take|it would take|would "
          r"kill|will kill|to kill (?:you|a person|me|myself|someone)|is lethal|is fatal|to die|to "
          r"overdose|is an overdose|to be fatal|to not wake up|would be (?:fatal|lethal|deadly|"
          r"enough to (?:die|kill))|is (?:fatal|lethal|deadly))\b|\b(?:painless|easiest|quickest|"
          r"fastest|best|surest|least painful|quick|easy|reliable|peaceful) (?:way|ways|method|"
          r"methods) to (?:die|kill myself|end it|end my life|go|commit suicide|do it|overdose|"
          r"not wake up)\b|\b(?:lethal|fatal|deadly) (?:dose|amount|dosage|height)\b|\bhow (?:high|"
          r"tall|far) (?:\w+ ){0,4}(?:to die|to kill|would kill|to be fatal|to not survive)\b|"
          r"\bwhat height (?:\w+ ){0,10}(?:not survive|do not survive|die|kill|fatal)\b|"
          r"\b(?:mix|mixing|combine|combining) (?:\w+ ){0,6}(?:gas|fumes) (?:\w+ ){0,3}(?:kills?|"
          r"stops? (?:you|me|a person|someone) breathing)\b|"
          r"\b(?:looking up|looked up|researching|researched|googling|googled|searching|searched|"
          r"reading about) (?:\w+ ){0,3}(?:how to (?:die|kill myself|overdose|hang|end it)|ways "
          r"to (?:die|kill myself|end it)|suicide methods|overdose amounts)\b", negatable=False),
    _rule("suicide.pill_inquiry", "suicide", "concern", "inquiry",
          rf"\bwhat (?:happens|would happen|will happen) if (?:you|i|someone|a person|somebody) "
          rf"(?:take|took|swallow|swallowed|overdose|overdosed|ate|mix|mixed|drank) (?:too many|too"
          rf" "
          rf"much|a lot of|all|a bottle|a whole|the whole)|\btoo many {PILLS}\b", negatable=False),
    # Plan and preparation (C-SSRS 5).
    _rule("suicide.plan", "suicide", "crisis", "plan",
          r"\b(?:have|got|made|making|make|working on|came up with|figured out|written) (?:a |the "
          r"|my |out )?(?:plan|plans) (?:to|for how to|on how to|for how i will|for) (?:die|kill "
          r"myself|end (?:it|my life|everything|it all)|do it|commit suicide|overdose|jump|hang "
          r"myself|my suicide|my death)\b|\bi know (?:exactly )?(?:how|when|where) (?:i (?:would|"
          r"will|am going to|want to|could)|to) (?:do it|end it|kill myself|die|end my life)\b|"
          r"\b(?:picked|chose|chosen|found|decided on|scouted|checked out) (?:a |the |my |out "
          r"the )?(?:bridge|building|spot to jump|method|rope|tree|place to do it|spot to do "
          r"it|date to do it|day to do it|way to do it)\b|\bsuicide is (?:my|the) plan\b|\bmy "
          r"plan is (?:suicide|to (?:die|kill myself|end it|end my life))\b"),
    _rule("suicide.preparation", "suicide", "crisis", "preparation",
          rf"\b(?:saving|saved|stockpiling|stockpiled|hoarding|hoarded|collecting|collected|"
          rf"stashing|stashed|storing up|sneaking|pocketing|stealing|stole) (?:up )?(?:my |all my |"
          rf"some |a bunch of |extra |enough |all of |the )?(?:\w+s )?{PILLS}\b|\b(?:giving|gave"
          rf"|given|give) away (?:all )?(?:of )?(?:my|all my) (?:things|"
          rf"stuff|belongings|possessions|pets?|dog|cat|most prized|favorite things|valuables)"
          rf"\b(?!.{{0,40}}\b(?:move|moving|declutter|charity|garage sale|donat|clear out|new "
          rf"place))|\b(?:wrote|written|writing|write|left|leave|leaving|drafted|finished) (?:a |"
          rf"my |some )?(?:suicide note|goodbye (?:note|letter|letters|notes|message|video))|\b"
          rf"(?:wrote|written|writing|write|left|leaving) (?:a |my |some )?(?:notes?|letters?) "
          rf"(?:\w+ ){{0,4}}(?:after i am gone|when i am gone|for after|to read after|for when i "
          rf"am gone|explaining why|once i am gone)\b|\b(?:updated|wrote|making|made|sorted) (?:my "
          rf")?will (?:and|so) (?:\w+ ){{0,4}}(?:gone|goodbye|not around)|\b(?:got|have) "
          rf"everything (?:ready|planned|in order|sorted) for (?:when|after) i (?:am )?(?:go|gone|"
          rf"die)", negatable=False),
    # Finality and goodbye.
    _rule("suicide.rehoming", "suicide", "concern", "preparation",
          r"\b(?:gave|given|giving|give|rehomed|rehoming|rehome) (?:away )?my (?:\w+ )?(?:cat|dog|"
          r"pets?|rabbit|bird|things|stuff|belongings|possessions|savings) (?:away |to )\b"
          r"(?!.{0,40}\b(?:move|moving|allerg|"
          r"declutter|charity|garage sale|donat|new place|holiday|vacation|trip))",
          negatable=False),
    # A note or letter to family with no stated everyday purpose: in this setting, read as a
    # possible suicide note (missing one costs far more than an unneeded hotline message).
    _rule("suicide.note_to_family", "suicide", "crisis", "preparation",
          r"\b(?:wrote|written|writing|left|leaving|finished) (?:(?:a|my|some) )?(?:note|notes"
          r"|letter|"
          r"letters) (?:for|to) (?:my |each of my )?(?:family|mum|mom|dad|parents|kids|children|"
          r"wife|husband|partner|everyone|sister|brother|friends|boyfriend|girlfriend|son|"
          r"daughter)\b(?! (?:about|asking|saying|to say|for (?:school|work)|reminding|with|on|"
          r"because|so|telling|letting|that))(?!.{0,60}\b(?:birthday|christmas|anniversary|"
          r"shopping|dinner|late|school|thank|sorry i missed))", negatable=False),
    _rule("suicide.affairs", "suicide", "concern", "preparation",
          r"\b(?:put|putting|got|getting|sorting|sorted|have) (?:all )?my affairs in order\b|"
          r"\b(?:updated|updating|wrote|writing|made|making) my will\b", negatable=False),
    _rule("suicide.goodbye", "suicide", "crisis", "goodbye",
          r"\bthis is (?:my )?(?:goodbye|the end for me|my last (?:message|day|night|goodbye|"
          r"post))\b|\b(?:said|saying|made|make) my (?:final )?goodbyes\b|\b(?:saying|say|said) "
          r"(?:my )?(?:goodbyes?|final goodbye) (?:to everyone|for "
          r"good|forever|to you all|to the world|before i go)\b|\b(?:goodbye|bye) (?:everyone|"
          r"forever|world|cruel world|for good|for the last time)\b|\bmy final goodbye\b|\b(?:will "
          r"not|not going to|not) be (?:around|here|alive) (?:much |any )?(?:longer|for long|to "
          r"see (?:it|next|the|christmas|my|another))\b|\b(?:you|they|nobody|no one) (?:will "
          r"not|will never|are not going to|will) (?:hear from|see|have to deal with|have to "
          r"worry about|need to worry about) me (?:again|anymore|ever again|after tonight)\b|"
          r"\b(?:when|after|once) i am (?:dead|gone for good|no longer alive|not alive)\b|\b"
          r"(?:after"
          r"|once) i am gone\b(?! (?:for|on|to|next|this|at|until|over|from))|\btake care of "
          r"(?:my|the) (?:\w+ )?(?:for me )?(?:when|after|once) i am gone\b", negatable=False),
    _rule("suicide.last_time", "suicide", "crisis", "goodbye",
          r"\b(?:the )?last time (?:we|you|i) (?:will |are going to |am going to |ever )?(?:talk|"
          r"speak|chat|see each other|hear from me|message|write to you)\b|\b(?:can not|do not|"
          r"could not) (?:see|imagine|picture) (?:myself )?(?:being |still )?(?:alive|living|here "
          r"alive) (?:\w+ ){0,2}(?:next|in a|in|by|at|past|after|for)\b|\b(?:not (?:planning|"
          r"going|expecting) (?:on|to) (?:be|being)|will not be) alive (?:\w+ ){0,2}(?:next|in|"
          r"by|for|at)\b|\b(?:do not|not|no longer) (?:plan|planning|intend|intending|expect|"
          r"expecting) (?:on |to )(?:be|being|still be|stay) alive\b", negatable=False),
    _rule("suicide.not_here_future", "suicide", "crisis", "goodbye",
          r"\bnot (?:planning|going|expecting|intending) (?:on|to) (?:be|being) (?:here|around) "
          r"(?:next|by|for|in|at|much|after)\b(?!.{0,80}\b(?:mov(?:e|ing)|holiday|vacation|trip|"
          r"travel|abroad|new job|visit|away for|leaving for|relocat|flight|university|college))",
          negatable=False),
    _rule("suicide.not_around_soon", "suicide", "concern", "goodbye",
          r"\b(?:will not|not going to) be (?:around|here|alive) (?:tomorrow|after tonight|by "
          r"(?:tomorrow|morning|monday|the weekend))\b|\b(?:will "
          r"not|not going to) need (?:\w+ ){0,4}(?:anymore|any more|where i am going|after "
          r"(?:tonight|this week|today))\b|\bwhen i am gone\b(?! (?:for|on|to|next|"
          r"this|at|until|over|from))|\bit will (?:all )?be over (?:soon|tonight|tomorrow)\b|"
          r"\b(?:because|since|as|when|once|and) i (?:will not|am not going to) be (?:here|around)"
          r"(?: anymore)?(?= ?(?:[.!?;]|$))", negatable=False),
    _rule("suicide.nothing_matters", "suicide", "concern", "hopelessness",
          r"\bnone of (?:this|it) (?:will|is going to) matter\b|\bnothing (?:will|is going to) "
          r"(?:ever )?change\b",
          negatable=False),
    # Hopelessness, entrapment, escape (risk factors; concern).
    _rule("suicide.hopeless", "suicide", "concern", "hopelessness",
          r"\bhopeless(?:ness)?\b|\bno (?:hope|future|way out|way forward|escape)\b(?! (?:room|"
          r"game))|\bnothing (?:left )?for me (?:here|anymore|in this world|now)\b|\bnothing "
          r"left to (?:lose|hope for|fight for)\b|"
          r"\b(?:trapped|stuck) (?:\w+ ){0,3}(?:forever|with no way out|no escape)\b|\b(?:give|"
          r"giving|given|gave) up on (?:life|everything|myself|living|the future|ever getting "
          r"better)\b"),
    _rule("suicide.never_better", "suicide", "concern", "hopelessness",
          r"\bnothing (?:\w+ ){0,4}(?:get|gets|be|feel|feels|going to be|change|changes) (?:better|"
          r"okay|ok|good|right|any better)\b|\b(?:will|is|are|it is|things are|things will|life "
          r"will|it will|life is|my life is)(?: \w+){0,2} (?:never|not|no longer) (?:\w+ ){0,3}"
          r"(?:get|be|feel|going to get|going to be) (?:better|okay|ok|good|any better|any easier)"
          r"\b|\bnever (?:going to )?(?:get|be|feel) (?:better|okay|happy|normal) again\b|"
          r"\bnothing (?:ever )?(?:changes|improves|works|helps)\b|\b(?:do not|can not|could "
          r"not) (?:see|imagine) how (?:things|it|life|anything|my life) (?:will|could|can|are "
          r"going to|is going to|would) (?:ever )?(?:get|be|feel) (?:better|okay|ok|good)\b|"
          r"\b(?:tired|sick|exhausted|weary) of (?:everything|it all|all of it|fighting|trying|"
          r"struggling|being me|feeling this way|feeling like this)\b|\b(?:life|everything|it "
          r"all|my life|living|existence) (?:is|feels|seems) (?:so |completely |totally )?"
          r"(?:pointless|meaningless|empty|hopeless|futile)\b",
          negatable=False),
    _rule("suicide.what_point", "suicide", "concern", "hopelessness",
          r"\b(?:what is|whats|what) the (?:point|use) (?:of|in) (?:anything|everything|trying"
          r"|going "
          r"on|carrying on|it all|any of (?:this|it)|even trying|life|me|my life)\b|\bno point in "
          r"(?:anything|trying|anything anymore)\b|\bnothing matters anymore\b"),
    _rule("suicide.cannot_go_on", "suicide", "concern", "hopelessness",
          r"\bcan not (?:go on|keep going|do this|take (?:it|this|any more|anymore)|carry on|"
          r"handle (?:it|this|life)|cope|live like this|keep doing this|keep living like this|"
          r"face (?:another day|tomorrow))(?: (?:anymore|any longer|like this|much longer|"
          r"anymore|another day))\b|\bcan not (?:go on|carry on|keep going)\b(?! (?:with|about|a"
          r"|the|"
          r"to|and))|\b(?:done with|so done with) (?:everything|it all|all of (?:this|it)|this "
          r"world|this life|people|fighting|trying)\b(?! (?:at|in|for) )", negatable=False),
    _rule("suicide.disappear", "suicide", "concern", "hopelessness",
          r"\b(?:wish i could|want to|wanted to|just want to|would like to|wish i would|i could) "
          r"(?:just )?(?:disappear|vanish|not be here|fade away)\b(?! (?:under|into|to|for|from|"
          r"with|on|in|off|somewhere|behind|for a))"),
    _rule("suicide.death_thoughts", "suicide", "concern", "hopelessness",
          r"\b(?:think|thinking|thought|thoughts|obsess|obsessing|fantasi[sz]e|fantasi[sz]ing|"
          r"dream|dreaming|daydream|daydreaming) (?:a lot |so much |constantly |all the time )?"
          r"(?:about|of) (?:death|dying|being dead|my death|my own death|not being here|not "
          r"existing|not waking up|my funeral|how i would die)\b"),
    _rule("suicide.means", "suicide", "none", "means",
          r"\b(?:bought|buying|got|have|own|found|hid|hidden|hiding|keep|kept|get|getting|borrowed|"
          r"ordered) (?:a |the |some |my |dads |a new |a length of |access to )?(?:rope|gun|pistol|"
          r"rifle|shotgun|razor blades?|blades|bullets|ammo|charcoal|pills|sleeping pills|"
          r"painkillers)\b|\b(?:the|my) (?:pills|rope|gun|blade|blades) (?:is|are) (?:ready|"
          r"right here|next to me|in front of me|in my hand)\b", negatable=False, subject=False),
    _rule("suicide.timeline", "suicide", "none", "timeline",
          r"\b(?:going to|will|ready to|want to|plan to|planning to|decided to|finally going to|"
          r"tempted to|about to) (?:finally |just )?(?:do it|end it|go through with it) (?:tonight|"
          r"today|tomorrow|this weekend|soon|now|after|when|before)|\btonight is the night\b"
          r"|\btoday is the day\b|"
          r"\bit (?:is|will be) (?:my last|the last) (?:night|day)\b", negatable=False,
          subject=False),
    _rule("suicide.farewell", "suicide", "none", "farewell",
          r"\b(?:thank you|thanks) for everything\b|\bsorry for everything\b|\btell (?:them|my "
          r"\w+|everyone) (?:that )?i (?:love|am sorry)\b|\bi love you all\b|\bplease take care of "
          r"(?:my|the)\b|\bforgive me\b|(?:^|[.!?;] ?)(?:goodbye|bye|farewell)(?: (?:everyone"
          r"|all))?"
          r" ?(?:[.!?;]|$)|\bi am ready to go\b ?(?:[.!?;]|$)|\bi am at peace with (?:it|my "
          r"decision)\b", negatable=False, subject=False),
    # Someone else at risk, named by a reflexive or possessive ("kill herself", "his life").
    _rule("suicide.third_party", "suicide", "concern", "third_party",
          r"\b(?:k(?:i|y)?l+(?:s|ed|ing)?|hang|hanged|hanging|hung|shot|shoot|shoots|shooting|"
          r"drown|drowned|overdosed|poisoned|end|ended|ending|off|offed) (?:himself|herself|"
          r"themselves|themself)\b|\b(?:took|take|takes|taking|end|ended|ending|ends) (?:his|her|"
          r"their) (?:own )?life\b|\b(?:died by|committed|commits|commit|attempted|attempt|"
          r"attempts) suicide\b(?= |$)", subject=False, topic=True, negatable=False),
    _rule("self_harm.third_party", "self_harm", "concern", "third_party",
          r"\b(?:cut|cuts|cutting|burn|burns|burning|burned|hurt|hurts|hurting|harm|harms|"
          r"harming|harmed|starve|starves|starving) (?:himself|herself|themselves|themself)\b|"
          r"\b(?:he|she|they) (?:self harms|self harm|has been self harming|is self harming)\b",
          subject=False, topic=True, negatable=False),
    # Self-harm.
    _rule("self_harm.act", "self_harm", "crisis", "act",
          rf"\b(?:cut|cutting|cuts|burn|burning|burned|burnt|hurt|hurting|hurts|harm|harming|"
          rf"harmed|punish|punishing|scratch|scratching|scratched|hit|hitting|punch|punching|bite|"
          rf"biting|carve|carving|carved|bruise|bruising|beat|beating|mutilate|mutilating|injure|"
          rf"injuring|bang|banging|slap|slapping) {SELF}\b"),
    _rule("self_harm.body", "self_harm", "crisis", "act",
          r"\b(?:cut|cutting|cuts|burn|burning|burned|burnt|scratch|scratching|scratched|carve|"
          r"carving|carved|slice|slicing|sliced|slash|slashing|slashed) (?:into )?(?:my|both my|"
          r"both of my) (?:arm|arms|wrist|wrists|thigh|thighs|leg|legs|skin|stomach|belly|hip|hips|"
          r"chest|ankle|ankles|body|forearm|forearms|upper arm|shoulder|shoulders)\b|"
          r"\b(?:hold|holding|held|press|pressing|pressed|put|putting) (?:a |the |my )?(?:lighter|"
          r"lit cigarette|cigarette|flame|blade|razor|hot \w+) (?:to|against|on|into) (?:my|both my) "
          r"(?:arm|arms|wrist|wrists|thigh|thighs|leg|legs|skin|stomach|hand|hands|forearm)\b"),
    _rule("self_harm.term", "self_harm", "crisis", "act",
          r"\bself (?:harm|harming|harmed|harms|injury|injure|injuring|injured|mutilation|"
          r"mutilate|mutilating|destruct|destructing)\b(?! (?:awareness|prevention|research|"
          r"statistics|rates?|in (?:teens|young|adolescents)|among))", topic=True),
    _rule("self_harm.bare_cut", "self_harm", "crisis", "act",
          r"\b(?:i|been|(?<!urge )(?<!urges )(?<!tempted )(?<!craving )(?<!itching )to|started|"
          r"start|stop|stopped|keep|kept|still|need to|want to|going to|about|of|"
          r"relapsed and) (?:cut|cutting|"
          r"cuts|burn|burning)\b(?=$| (?:again|tonight|today|now|more|deeper|anymore|every|when|"
          r"because|to feel|so|but|and|until|since|a lot|badly|harder|myself|my (?:arm|arms|wrist|"
          r"wrists|thigh|thighs|leg|legs|skin|stomach|hip|hips)|on my|for (?:\d+|a|years|months|"
          r"weeks)|or|[.!?;]))"),
    _rule("self_harm.pain_seeking", "self_harm", "crisis", "act",
          r"\b(?:razor|razors|blade|blades|cutting|lighter|scissors|compass|hurting myself|burning "
          r"myself)\b(?: \w+){0,6} (?:only (?:thing|way)|helps|calms|relief|release|numbs|makes "
          r"me feel|makes it stop|how i cope)\b|\b(?:only (?:thing|way)|helps me|calms me|calm "
          r"down|relief|release|numbs|cope|coping)(?: \w+){0,6} (?:razor|razors|blade|blades|"
          r"cutting|hurting myself|burning myself)\b|\bdeserve to (?:bleed|be cut|be hurt|feel pain"
          r"|suffer|be punished)"
          r"\b|\b(?:need|needs|want|crave|craving|miss) (?:to )?(?:see )?(?:blood|the blood|to "
          r"bleed|the sting|the pain of cutting)\b"),
    # Injury by blunt force, stated with its aim ("until the bones break"): punching a wall
    # in anger alone is not this.
    _rule("self_harm.break", "self_harm", "crisis", "act",
          r"\b(?:smash|smashing|punch|punching|hit|hitting|bang|banging|slam|slamming|break|"
          r"breaking) my (?:own )?(?:hand|hands|fist|fists|knuckles|fingers|arm|arms|wrist|wrists|"
          r"head) (?:\w+ ){0,5}(?:until|till|so|and) (?:\w+ ){0,3}(?:break|breaks|broken|bleed|"
          r"bleeds|bleeding|cracks?|shatters?|snaps?)\b|\bbreak my own (?:bones|hand|fingers|arm|"
          r"wrist)\b"),
    _rule("self_harm.need_pain", "self_harm", "concern", "urge",
          r"\b(?:need|want|crave|craving) to feel (?:pain|physical pain|something physical)\b"),
    _rule("self_harm.urge", "self_harm", "crisis", "urge",
          r"\b(?:urge|urges|craving|cravings|tempted|itching|itch|impulse|impulses) (?:\w+ ){0,2}"
          r"(?:to )?(?:cut|self harm|hurt myself|burn myself|relapse|harm myself)\b"),
    _rule("self_harm.marks", "self_harm", "concern", "history",
          r"\b(?:my |the |fresh |new )?(?:scars|cuts|marks|wounds|burns) (?:on|from|up|along) (?:my"
          r" "
          r")?(?:arms?|wrists?|thighs?|legs?|stomach|skin|hips?)\b|\bhid(?:e|ing) (?:the |my )?"
          r"(?:marks|scars|cuts|burns)\b|\b(?:long sleeves|wristbands?) (?:\w+ ){0,4}(?:scars|"
          r"marks|cuts)\b|\bself harm scars\b"),
    _rule("self_harm.since_last", "self_harm", "concern", "history",
          r"\bsince i (?:last )?(?:cut|self harmed|hurt myself|harmed myself|burned myself|"
          r"relapsed)\b|\b(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|a|few|"
          r"several|many) (?:days|weeks|months|years?) (?:clean|free|without (?:cutting|self "
          r"harm|self harming|hurting myself))\b", negatable=False),
    _rule("self_harm.starve", "self_harm", "concern", "act",
          r"\b(?:starve|starving|starved|purge|purging|purged) (?:myself)?\b(?=$| (?:myself|"
          r"again|so|because|until|to|after|every|for|[.!?;]))"),
    _rule("self_harm.means", "self_harm", "none", "means",
          r"\b(?:bought|got|have|hid|hidden|hiding|keep|kept|found|buying) (?:a |the |some |new |"
          r"my )?(?:razor blades?|blades|box cutter|scalpel)\b", negatable=False, subject=False),
    # Harm to others.
    _rule("others.intent", "harm_to_others", "crisis", "harm_intent",
          rf"\b{STRONG_INTENT} (?:(?:just|really|fucking|finally|go|actually|seriously) )?"
          rf"(?:{HARM}|{HARMING})(?: up)? {PERSON}\b"),
    # Ideation with a lethal method named is crisis; general aggression ideation is concern.
    _rule("others.lethal_ideation", "harm_to_others", "crisis", "harm_intent",
          rf"\b(?:thinking (?:about|of)|think about|thought about|fantasi[sz]e about|fantasi[sz]ing"
          rf" "
          rf"about|dream about|dreaming about|obsessed with|planning) (?:(?:just|really|actually|"
          rf"seriously) )?(?:killing|murdering|poisoning|stabbing|shooting|strangling|choking|"
          rf"smothering|drowning|running over) {PERSON}\b"),
    _rule("others.will", "harm_to_others", "crisis", "harm_intent",
          rf"\b(?:i will|i am going to|i am gonna|i swear i will|i am about to) (?:\w+ )?{HARM}"
          rf"(?: up)? {PERSON}\b"),
    # Blunt force at a named person's head ("smash my boss's head in", "use the hammer on
    # his skull"); the possessive survives normalisation as a trailing "s".
    _rule("others.head", "harm_to_others", "crisis", "harm_intent",
          rf"\b{STRONG_INTENT} (?:(?:just|really|actually|finally) )?(?:(?:smash|cave|bash|kick|"
          rf"stove|split|crack) (?:in )?(?:his|their|your|{PERSON}s?) (?:head|skull|face) (?:in|open)|"
          rf"(?:use|swing|take) (?:it|this|that|the \w+|my \w+|a \w+) (?:on|to|at) (?:his|"
          rf"their|your|{PERSON}s?) (?:head|skull|"
          rf"face|throat|neck))\b"),
    _rule("others.mass", "harm_to_others", "crisis", "harm_intent",
          r"\bshoot(?:ing)? up (?:the |my |a |this |that |our )?(?:school|class|office|work|"
          r"workplace|mall|church|mosque|synagogue|temple|place|party|concert|building|campus|"
          r"store)\b|\b(?:shoot|kill|stab|bomb|blow up) (?:everyone|everybody|all of them|them all|"
          r"as many (?:people )?as)\b|\b(?:bring|bringing|brought|take|taking) (?:a |my |dads |the "
          r")?(?:gun|knife|rifle|pistol|weapon|bomb) (?:to|into) (?:school|work|class|the office|"
          r"his|her|their|church|the party)\b"),
    _rule("others.anger", "harm_to_others", "concern", "harm_anger",
          rf"\b(?:could|would|might|feel like|felt like|wanted to|urge to|tempted to|close to|"
          rf"thinking about|think about|thought about|thinking of|fantasi[sz]e about|dream about) "
          rf"(?:just |literally |easily )?{HARM}(?: up)? {PERSON}\b{EMOTIONAL}|\b{HARMING}(?: up)? "
          rf"{PERSON}\b{EMOTIONAL}"),
    _rule("others.hostile_wish", "harm_to_others", "concern", "harm_anger",
          r"\b(?:hope|wish|pray) (?:that )?(?:he|she|they|him|her|them|my \w+|that \w+|the "
          r"\w+) (?:\w+ )?(?:dies|die|would die|gets killed|get killed|get hit|gets hit|drops "
          r"dead|drop dead|burns|suffers|suffer|rots|rot in hell|were dead|was dead)\b|\b(?:he|"
          r"she|they|that \w+|my \w+) (?:deserves|deserve) to (?:die|suffer|be hurt|be killed)\b"),
    _rule("others.intrusive", "harm_to_others", "concern", "harm_anger",
          rf"\b(?:thoughts?|images?|urges?|impulses?|visions?) (?:\w+ )?(?:of|about) "
          rf"{HARMING} (?:my |the |a |him|her|them|someone|people|\w+)"),
    _rule("others.revenge", "harm_to_others", "concern", "revenge",
          r"\b(?:make (?:them|him|her|everyone|you|them all|all of them|those people|every one "
          r"of them) (?:all )?pay|get (?:back at|revenge on|even with) (?:him|her|them|everyone|"
          r"my \w+|that \w+)|(?:he|she|they) (?:is|are) (?:going to|gonna) (?:get|regret) what|get "
          r"what is coming to (?:him|her|them)|(?:they|he|she|you) (?:will|are going to|is going "
          r"to|are all going to|will all) (?:all )?(?:regret|be sorry|pay for)|they will all "
          r"regret|going to regret (?:it|this|what))\b", negatable=False),
    _rule("others.targeting", "harm_to_others", "none", "targeting",
          r"\b(?:i know|found out|figured out) where (?:he|she|they) (?:lives?|works?|sleeps?|"
          r"parks?|goes to school)\b|\b(?:waiting|wait) for (?:him|her|them) (?:outside|after|at)"
          r"\b|\b(?:follow|followed|following) (?:him|her|them) home\b|\bwaiting for (?:him|her|"
          r"them|my \w+) to (?:come home|get home|come back|arrive|leave|get out|walk)\b",
          negatable=False,
          subject=False),
    _rule("others.ready", "harm_to_others", "none", "plan",
          r"\b(?:i have|got|i have got|i have) everything (?:ready|planned|set up|in place)\b|"
          r"\beverything is (?:ready|set|planned|in place)\b|\bit is all planned\b",
          negatable=False, subject=False),
    _rule("others.weapon", "harm_to_others", "none", "means",
          r"\b(?:bought|buying|got|have|own|found|took|grabbed|carry|carrying|borrowed|taken) "
          r"(?:(?:a|the|my|dads|moms|his|her|a new|some|new|loaded|\w+s) ){0,2}(?:gun|pistol|"
          r"rifle|shotgun|knife|machete|bat|bullets|ammo|handgun)\b",
          negatable=False, subject=False),
    _rule("others.armed", "harm_to_others", "none", "armed",
          r"\b(?:sharpen|sharpening|sharpened|load|loading|loaded|clean|cleaning|hid|hiding|hidden)"
          r" "
          r"(?:(?:the|a|my|dads|his) ){0,2}(?:knife|knives|blade|axe|machete|gun|rifle|pistol|"
          r"shotgun)\b", negatable=False, subject=False),
    _rule("others.threat_received", "harm_to_others", "concern", "threat_received",
          r"\b(?:threatened|threatens|threatening|keeps threatening|said (?:he|she|they) (?:would|"
          r"will|is going to|was going to|were going to)|says (?:he|she|they) (?:will|would|is "
          r"going to)|tried to|swore (?:he|she|they) would) (?:to )?(?:kill|hurt|beat|stab|shoot|"
          r"strangle|choke) (?:me|us|my (?:kids|children|son|daughter|baby|family|mom|dad))\b|"
          r"\b(?:he|she|they|my \w+) (?:hits|hit|beats|beat|chokes|choked|strangled|punched|kicked|"
          r"hurts|slaps|slapped|pushed|shoved|strangles) me\b(?! (?:at|in|to|back|with a pillow))",
          negatable=False, subject=False),
)  # fmt: skip

# Figures of speech removed before matching. Each is a ready idiom that never signals risk
# to the speaker or a threat by them.
_IDIOMS: tuple[tuple[str, re.Pattern[str], frozenset[str] | None], ...] = tuple(
    (name, re.compile(pattern), _required_literals(re.compile(pattern)))
    for name, pattern in (
        (
            "killing_me",
            r"\b(?:is|are|was|were|it is|keeps|keep|been|that|this|these|those|\w+s) "
            r"(?:\w+ )?(?:killing|murdering|k(?:i|y)?l+ing) me\b|\bkilling me\b",
        ),
        ("kill_me_now", r"\b(?:just |please )?(?:kill|shoot) me now\b"),
        (
            "x_will_kill_me",
            r"\b(?:you|he|she|they|it|this|that|mom|mum|dad|\w+) (?:will|would|is "
            r"going to|are going to|going to|is gonna|might|could|is|are|gonna) "
            r"(?:literally |actually |totally |so )?(?:kill|murder|k(?:i|y)?l+) "
            r"(?:me|us)\b",
        ),
        (
            "dying_to",
            r"\bdying (?:to|for|of (?:laughter|boredom|embarrassment|shame|curiosity|"
            r"hunger|thirst|heat|cringe|jealousy))\b",
        ),
        ("to_die_for", r"\bto die for\b|\bwould die for (?:you|him|her|them|my \w+)\b"),
        (
            "die_of",
            r"\b(?:die|died|dying|dead) (?:of|from) (?:embarrassment|shame|laughter|"
            r"laughing|boredom|cringe|cuteness|happiness|jealousy|envy|hunger|thirst|"
            r"curiosity|old age|heat|exhaustion|excitement|the cringe|secondhand)\b",
        ),
        ("die_laughing", r"\b(?:died|die|dying|dead) (?:laughing|of laughter|from laughing)\b"),
        (
            "nearly_died",
            r"\b(?:nearly|almost|could have|could of|practically|literally|basically|"
            r"thought i would|i would have|might have) (?:died|die)\b",
        ),
        ("die_young", r"\bdie (?:young|happy|trying|hard|a little inside|on this hill)\b"),
        ("going_to_die_if", r"\b(?:going to|will|gonna) die (?:if|when|of|without|from)\b"),
        (
            "embarrassed_die",
            r"\b(?:embarrassed|ashamed|mortified|awkward|cringe|cringed|"
            r"cringing|humiliated) (?:that )?(?:i )?(?:could have|could|wanted "
            r"to|want to|thought i would|was going to) (?:just )?(?:die|died)\b",
        ),
        ("shot_foot", r"\bshot myself in the foot\b"),
        (
            "shoot_a_message",
            r"\b(?:shoot|shot|shooting) (?:him|her|them|you|me|us|my \w+) (?:a|an|over a) "
            r"(?:message|text|email|look|glance|smile|dm|line|note|quick)\b",
        ),
        (
            "killing_myself_work",
            r"\bk(?:i|y)?l+ing myself (?:at|with|over|for|working|trying|to "
            r"(?:finish|get|make|meet|pay|keep|study|pass))\b",
        ),
        (
            "killed_laughing",
            r"\bk(?:i|y)?l+(?:ed|ing|s)? (?:myself|me|himself|herself|themselves) laughing\b",
        ),
        ("could_kill_myself_for", r"\bcould (?:kill|k(?:i|y)?l+) myself for\b"),
        ("hopeless_at", r"\bhopeless (?:at|with|romantic|romantics|case lol)\b"),
        (
            "beat_at",
            r"\bbeat (?:him|her|them|me|you|everyone|my \w+) (?:at|in|to)\b"
            r"(?! (?:death|a pulp|within an inch))",
        ),
        (
            "kill_it",
            r"\bk(?:i|y)?l+(?:ing|ed)? (?:it|time|the (?:lights|mood|vibe|process|game|"
            r"music|engine))\b",
        ),
    )
)


@dataclass
class _Hit:
    rule: _Rule
    level: Level
    signal: Signal
    notes: list[str]
    history: bool = False
    heavy: bool = False  # a farewell beyond thanks/bye: apology, love, "take care of my ..."


def _clause_start(text: str, pos: int) -> int:
    start = 0
    for m in _CLAUSE_BREAK.finditer(text, 0, pos):
        start = m.end()
    return start


def _negated(before: str) -> bool:
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


def _subject(before: str) -> str:
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


def _post_negated(after: str) -> bool:
    """A negation after the phrase: "suicide is not an option", "killing myself is not
    something i would do"."""
    return bool(_POST_NEGATION.match(after.strip()))


_ACCIDENT = re.compile(
    r"\b(?:accident|accidentally|by mistake|shaving|cooking|chopping|slicing|while|paper cut|"
    r"tripped|slipped|fell|sunburn|on (?:a|the|some|my) (?:\w+ )?(?:stove|oven|pan|iron|kettle|"
    r"knife|glass|door|table|corner|cupboard|nail|fence|rock|can|tin|edge|mirror|window|bottle|"
    r"plate|hob|grill|radiator)|at the gym|playing|lifting|running|skiing|football|soccer|practice|"
    r"training|workout|making|baking|ironing|straightener|curling iron|"
    r"(?:a|another) (?:slice|piece|portion|bit|helping|serving))\b"
)


_HEAVY_FAREWELL = re.compile(r"sorry|love|forgive|take care|peace|ready to go")
_URGE_BEFORE = re.compile(
    r"\b(?:thinking about|thought about|think about|thinking of|urge to|urges to|tempted to|"
    r"want to|feel like|craving|itching to|about|of)\s*$"
)


def _hits(norm: str, *, gate: bool = True) -> tuple[list[_Hit], list[str]]:
    reasons: list[str] = []
    media = bool(MEDIA.search(norm))
    text = norm
    for name, pattern, needles in _IDIOMS:
        if gate and not _may_match(needles, text):
            continue

        def _sub(m: re.Match[str], name: str = name, text: str = text) -> str:
            head = text[max(0, m.start() - 40) : m.start()]
            if name == "x_will_kill_me" and re.search(
                r"(?:said|says|told me|threatened|swore|"
                r"promised|keeps saying)\b[^.!?;]*$",
                head,
            ):
                return m.group()
            reasons.append(f"figure of speech ignored: {name}")
            return " _ " * (1 + m.group().count(" "))

        text = pattern.sub(_sub, text)
    hits: list[_Hit] = []
    for rule in RULES:
        if gate and not _may_match(rule.needles, text):
            continue
        for m in rule.pattern.finditer(text):
            start = _clause_start(text, m.start())
            before = text[start : m.start()]
            after = text[m.end() :]
            notes: list[str] = []
            level, signal = rule.level, rule.signal
            if (
                rule.category == "self_harm"
                and signal == "act"
                and (
                    _URGE_BEFORE.search(before)
                    or _URGE_BEFORE.search((before + m.group()).rsplit(" ", 1)[0])
                )
            ):
                signal = "urge"
            if re.search(r"\basked (?:me )?(?:if|whether|about)\b", before) and not re.search(
                r"\b(?:said|told (?:him|her|them)) yes\b", after
            ):
                reasons.append(f"reported question: {rule.id}")
                continue
            if rule.negatable and (_negated(before) or _post_negated(after)):
                # Said of someone else ("my stepdad won't be hurting anyone after tonight"),
                # the negation is no statement of the client's own intent: the hit goes, but
                # the learned layer may still read the message (model_may_raise).
                said_of = "negated of someone else" if _subject(before) == "third" else "negated"
                reasons.append(f"{said_of}: {rule.id}")
                continue
            clause_end = _CLAUSE_BREAK.search(text, m.end())
            clause = text[start : clause_end.start() if clause_end else len(text)]
            if rule.category == "self_harm" and signal == "act" and _ACCIDENT.search(clause):
                reasons.append(f"accident, not self-harm: {rule.id}")
                continue
            # A first-person pronoun inside the match ("after i am gone") settles it.
            subject = "first" if FIRST & set(m.group().split()) else _subject(before)
            if rule.topic and media and subject != "first":
                reasons.append(f"about fiction, news or study: {rule.id}")
                continue
            if rule.subject:
                if subject == "neutral":
                    reasons.append(f"group subject, not a personal statement: {rule.id}")
                    continue
                if subject == "third":
                    if media:
                        reasons.append(f"about fiction, news or study: {rule.id}")
                        continue
                    if level != "none":
                        level, signal = "concern", "third_party"
                        notes.append("someone else is at risk")
            history = False
            if (
                level == "crisis"
                and PAST.search(clause)
                and not CURRENT.search(
                    re.sub(r"\b(?:used to|am better now|i am better)\b", "", clause)
                )
            ):
                level, history = "concern", True
                notes.append("about the past")
            heavy = signal == "farewell" and bool(_HEAVY_FAREWELL.search(m.group()))
            hits.append(_Hit(rule, level, signal, notes, history, heavy))
    return hits, reasons


_HARD_SIGNALS = frozenset({"method", "plan", "preparation", "goodbye", "act", "means"})


def assess(text: str) -> SafetyAssessment:
    """Assess one client message: the rules, then the learned layer. Never calls the LLM
    backend, never raises (a non-string or blank message is ``none``: the caller
    validates messages).

    The rules (:func:`rules_assess`) answer first. The crisis model
    (:mod:`counselor_engine.safety_model`) can only raise their level: a message the rules
    missed that the model scores above a threshold becomes concern or crisis with the
    category ``unspecified`` and the rule id ``model.concern`` / ``model.crisis``. When no
    model artifact loads, or the model fails on this message, the rules answer alone and the
    failure is logged.
    """
    ruled = rules_assess(text)
    if not model_may_raise(ruled) or not isinstance(text, str) or not text.strip():
        return ruled
    try:
        learned = _learned(normalise(text))
    except Exception:
        log.exception("crisis model failed on a message; the rules answer alone")
        return ruled
    if learned is None or _RANK[learned[0]] <= _RANK[ruled.level]:
        return ruled
    level, risk, crisis = learned
    reason = f"{level}: model.{level} (P(risk)={risk:.2f}, P(crisis)={crisis:.2f})"
    categories = ruled.categories or ("unspecified",)
    return SafetyAssessment(
        level, categories, (*ruled.matched, f"model.{level}"), (*ruled.reasons, reason)
    )


_STATED_READING = (
    "negated:",
    "about fiction, news or study:",
    "figure of speech ignored:",
    "reassurance to someone else:",
)
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


def _reassurance_only(norm: str) -> bool:
    """True when ``norm`` is comfort to someone else and nothing more: at least one
    reassurance phrase, no farewell cue, and at most three other words once the phrases
    and filler are removed (a sentence of distress beside the comfort keeps the model)."""
    if not _REASSURANCE.search(norm) or _FAREWELL_CUE.search(norm):
        return False
    rest = [w for w in re.findall(r"[a-z]+", _REASSURANCE.sub(" ", norm)) if w not in _FILLER]
    return len(rest) <= 3


def model_may_raise(ruled: SafetyAssessment) -> bool:
    """Whether the learned layer may raise the rules' verdict.

    Not above crisis, and not where the rules read a risk phrase as negated ("i have no
    wish to die"), as fiction/news/study, or as a figure of speech ("i shot him a message"),
    or read the whole message as comfort to someone else ("you're safe, i'll always be
    there for you"; :func:`_reassurance_only`) with nothing else found: the client's stated
    meaning beats a bag-of-words guess, which cannot see negation scope or idiom.
    """
    if ruled.level == "crisis":
        return False
    return ruled.level != "none" or not any(r.startswith(_STATED_READING) for r in ruled.reasons)


@lru_cache(maxsize=512)
def _learned(norm: str) -> tuple[Level, float, float] | None:
    """The model's verdict on a normalised text (cached: the consumer and the engine
    both assess each message)."""
    from counselor_engine import safety_model

    model = safety_model.get_model()
    if model is None:
        return None
    level, risk, crisis = model.level(norm)
    return level, risk, crisis  # type: ignore[return-value]


def rules_assess(text: str) -> SafetyAssessment:
    """The rule layer alone. Pure and fast; never raises.

    1. Normalise (:func:`normalise`) and remove figures of speech.
    2. Match the rules; drop negated hits, accidents and media/study mentions; turn
       someone-else hits into ``third_party`` concern; past-only crisis hits into concern.
    3. Apply stated safety (denial of intent, resisted urges) and humour downgrades.
    4. Escalate accumulated risk (means/timeline/farewell + other evidence; two
       harm-to-others warning signs).
    5. The level is the highest remaining hit.
    """
    return _assess(text, gate=True)


def _assess(text: str, *, gate: bool) -> SafetyAssessment:
    """:func:`rules_assess`; ``gate=False`` runs every rule (tests prove gating changes nothing)."""
    if not isinstance(text, str) or not text.strip():
        return SafetyAssessment("none")
    norm = normalise(text)
    hits, reasons = _hits(norm, gate=gate)
    raw_lower = unicodedata.normalize("NFKC", text).lower()
    humour = bool(_HUMOUR.search(raw_lower)) and not _SERIOUS.search(norm)
    denial = bool(DENIAL.search(norm))
    resisted = bool(RESISTED.search(norm))
    signals = {h.signal for h in hits}

    for h in hits:
        if (
            h.level == "crisis"
            and denial
            and h.signal in {"intent", "death_wish"}
            and not (signals & _HARD_SIGNALS)
        ):
            h.level = "concern"
            h.notes.append("client states they would not act on it")
        if h.level == "crisis" and resisted and h.signal == "urge":
            h.level = "concern"
            h.notes.append("client says they resisted the urge")
        if humour and h.signal not in _HARD_SIGNALS and h.level != "none":
            h.level = "concern" if h.level == "crisis" else "none"
            h.notes.append("humour marker")

    current = [h for h in hits if h.level != "none" and not h.history]
    self_risk = [h for h in current if h.rule.category in ("suicide", "self_harm")
                 and h.signal != "third_party"]  # fmt: skip
    # Means or a timeline escalate any other self-risk; a farewell only when it is more than
    # thanks and bye (session ends often say "thank you for everything").
    weak = {h.signal for h in hits if h.level == "none" and h.rule.category != "harm_to_others"
            and (h.signal != "farewell" or h.heavy)}  # fmt: skip
    if weak and self_risk and any(h.level == "concern" for h in self_risk):
        for h in self_risk:
            if h.level == "concern":
                h.level = "crisis"
                h.notes.append("escalated: " + ", ".join(sorted(weak)) + " with other risk")
    farewells = [h for h in hits if h.signal == "farewell"]
    heavy = [h for h in farewells if h.heavy]
    if len(farewells) >= 2 and heavy:
        hits.append(_Hit(farewells[0].rule, "crisis", "goodbye", ["escalated: farewell message"]))
    # Co-occurring warning signs: preparation or finality with any other suicide sign.
    kinds = {h.signal for h in self_risk if h.level == "concern"}
    if kinds & {"preparation", "goodbye"} and len(kinds) >= 2:
        for h in self_risk:
            if h.level == "concern":
                h.level = "crisis"
                h.notes.append("escalated: " + ", ".join(sorted(kinds)))
    others = [h for h in hits if h.rule.category == "harm_to_others" and not h.history
              and h.signal != "threat_received" and h.signal != "third_party"]  # fmt: skip
    other_signals = {h.signal for h in others}
    if other_signals & {"armed", "means"} and other_signals & {
        "targeting",
        "revenge",
        "harm_anger",
    }:
        # A weapon with a named target or revenge talk: a threat even if never said aloud.
        others.append(_Hit(others[0].rule, "concern", "armed", []))
        hits.append(others[-1])
    if len(other_signals) >= 2 and any(h.level == "concern" for h in others):
        for h in others:
            if h.level == "concern":
                h.level = "crisis"
                h.notes.append("escalated: " + ", ".join(sorted(other_signals)))

    level: Level = "none"
    categories: list[str] = []
    matched: list[str] = []
    for h in hits:
        if h.level == "none":
            continue
        if _RANK[h.level] > _RANK[level]:
            level = h.level
        if h.rule.category not in categories:
            categories.append(h.rule.category)
        if h.rule.id not in matched:
            matched.append(h.rule.id)
            note = f" ({'; '.join(h.notes)})" if h.notes else ""
            reasons.append(f"{h.level}: {h.rule.id} [{h.signal}]{note}")
    if level == "none" and _reassurance_only(norm):
        reasons.append("reassurance to someone else: the message comforts another person")
    if level != "none":
        # Categories of the hits that set the level come first.
        top = [h.rule.category for h in hits if h.level == level]
        order = list(categories)
        categories.sort(key=lambda c: (c not in top, order.index(c)))
    return SafetyAssessment(level, tuple(categories), tuple(matched), tuple(reasons))


# -- responses -----------------------------------------------------------------------------


@cache
def _resources() -> dict[str, dict[str, object]]:
    data = json.loads(RESOURCES_PATH.read_text(encoding="utf-8"))
    return {k.lower(): v for k, v in data.items() if not k.startswith("_")}


def _locale_entry(locale: str) -> dict[str, object]:
    """Exact match on the normalised tag, else the fallback: hotlines are national, so a
    language alone ("en") or an unlisted country never borrows another country's number."""
    key = str(locale or "").strip().replace("_", "-").lower()
    table = _resources()
    return table.get(key) or table["fallback"]


def locales() -> tuple[str, ...]:
    """Locales with their own resources (the fallback excluded)."""
    return tuple(k for k in _resources() if k != "fallback")


def safe_response(locale: str = DEFAULT_LOCALE) -> str:
    """The fixed reply sent instead of a generated one at ``crisis`` level.

    Unknown locales get the generic fallback (contact local emergency services).
    """
    entry = _locale_entry(locale)
    lines = [str(entry["opening"]), ""]
    lines += [f"- {line}" for line in entry["resources"]]  # type: ignore[attr-defined]
    lines += ["", str(entry["closing"])]
    return "\n".join(lines)


_GUIDANCE = (
    "Safety note for this reply: something the client said may mean they, or someone near "
    "them, are at risk of harm. Respond warmly to what they shared, then gently and directly "
    "check on their safety: ask, in plain words, whether they are having thoughts of harming "
    "themselves or anyone else and whether they are safe right now. Do not lecture, do not "
    "diagnose, do not promise to keep secrets, and do not describe any method of harm. If they "
    "are in danger, encourage them to contact a crisis line or emergency services. {short}"
)


def concern_guidance(locale: str = DEFAULT_LOCALE) -> str:
    """System-prompt addition at ``concern`` level: the model replies, but checks safety."""
    return _GUIDANCE.format(short=str(_locale_entry(locale)["short"]))


__all__: list[str] = [
    "LEVELS",
    "RULES",
    "SafetyAssessment",
    "assess",
    "concern_guidance",
    "locales",
    "normalise",
    "safe_response",
]
