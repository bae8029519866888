"""Text hygiene shared by every path that stores or shows text."""

from __future__ import annotations

import re

# C0 controls and DEL, except tab, newline and carriage return. PostgreSQL refuses NUL in
# text and JSON, and the rest render as garbage; model output and client input both can
# contain them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def strip_control(text: str) -> str:
    """``text`` without control characters (tab, newline and carriage return stay)."""
    return _CONTROL.sub("", text)
