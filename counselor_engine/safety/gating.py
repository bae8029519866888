"""Rule gating: a cheap substring pre-test that tells which regexes cannot match a text.

Running ~90 regexes over a long message costs milliseconds; most rules cannot match most
text. Each pattern's parse tree gives a set of literal strings one of which every match
must contain; a rule whose strings are all absent is skipped (a substring test is cheap).
A test checks that gated and ungated matching agree on the whole labelled set.
"""

from __future__ import annotations

import re


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


def required_literals(pattern: re.Pattern[str]) -> frozenset[str] | None:
    try:
        from re import _parser as sre_parse  # type: ignore[attr-defined]

        return _required_seq(list(sre_parse.parse(pattern.pattern)))
    except Exception:  # a future re module: fall back to always running the rule
        return None


def may_match(needles: frozenset[str] | None, text: str) -> bool:
    return needles is None or any(map(text.__contains__, needles))
