"""Text normalisation: the canonical lower-case text the rules and the models read.

Leetspeak, censoring, spaced letters, repeated letters, chat shorthand, contractions and
known misspellings of risk words are folded here, once, so no rule has to spell them out.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache

from counselor_engine.safety.gating import may_match, required_literals


def words(text: str) -> list[str]:
    """Whitespace-separated words: word lists written as one string stay readable."""
    return text.split()


_ZERO_WIDTH = re.compile("[\u200b-\u200f\u2060\ufeff\u00ad]")
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u02bc": "'", "`": "'", "\u00b4": "'"})
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
    words(
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
        if may_match(_sub_needles(pattern), text):
            text = pattern.sub(repl, text)
    return text


@cache
def _sub_needles(pattern: re.Pattern[str]) -> frozenset[str] | None:
    return required_literals(pattern)


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
