"""Crisis detection that needs no model, and the fixed safe response.

``assess(text)`` runs before anything else on every client message (docs/architecture.md,
"One turn"),
so it must work whatever state the model backend is in: it is pure Python, uses only
pre-compiled regular expressions and never raises on odd input.

Levels and what the engine does with them:

- ``crisis``: the model is not called. The client gets :func:`safe_response` (warm, plain,
  with the locale's hotline and emergency number) and a clinician is alerted at once.
- ``concern``: the model still replies, with :func:`concern_guidance` added to its system
  prompt (gently check on safety), and the clinician sees a flag on the turn.
- ``none``: nothing changes.

Rules (``data/safety/rules.toml``, read by :mod:`.rules`) are written from clinical
categories (after the structure of the Columbia scale: wish to be dead -> active ideation
-> method -> intent -> plan/preparation), never from the labelled test sentences. Each
rule has an id ``category.name`` and a clinical signal; what each signal maps to:

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

Modifiers (applied by :mod:`.matcher` with :mod:`.modifiers`, each leaves a line in ``reasons``):

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

So :func:`assess` adds a learned second layer (:mod:`.crisis_model`, :mod:`.tuned_model`, no
LLM call): a small logistic model over MiniLM sentence embeddings and hashed n-grams that
can only raise the rules' level. On held-out statements (``tests/data/crisis_eval_v2.jsonl``,
``tests/test_safety_model.py``) it took indirect crisis recall from 22% to 83% and flagged
90-100% of positives at some level, at the price of more false positives on hard negatives
(about 3% -> 16%). Treat ``none`` as "nothing fired", not as "safe", and keep the
clinician in the loop.

The package, one job per module (imports point down this list, never up):

- :mod:`.assessment`: levels and :class:`SafetyAssessment`.
- :mod:`.text`: :func:`normalise`. :mod:`.gating`: the substring pre-test for regexes.
- :mod:`.rules`: the rules as data, checked at import. :mod:`.modifiers`: the modifiers'
  vocabulary and tests. :mod:`.matcher`: :func:`rules_assess`.
- :mod:`.crisis_model`, :mod:`.tuned_model`: the learned readers; :mod:`.artifacts`: their
  shipped files and manifest; :mod:`.registry`: which reader serves, and its verdicts.
- :mod:`.fusion`: :func:`assess` and :func:`model_may_raise`.
- :mod:`.responses`: :func:`safe_response`, :func:`concern_guidance`, per locale.
- :mod:`.evaluation`: held-out splits and figures on the labelled files.
"""

from __future__ import annotations

from counselor_engine.safety.assessment import LEVELS, Category, Level, SafetyAssessment
from counselor_engine.safety.fusion import assess, model_may_raise
from counselor_engine.safety.matcher import rules_assess
from counselor_engine.safety.responses import (
    DEFAULT_LOCALE,
    RESOURCES_PATH,
    concern_guidance,
    locales,
    safe_response,
)
from counselor_engine.safety.rules import RULES
from counselor_engine.safety.text import normalise

__all__: list[str] = [
    "DEFAULT_LOCALE",
    "LEVELS",
    "RESOURCES_PATH",
    "RULES",
    "Category",
    "Level",
    "SafetyAssessment",
    "assess",
    "concern_guidance",
    "locales",
    "model_may_raise",
    "normalise",
    "rules_assess",
    "safe_response",
]
