"""Write one benchmark's figures into its own section of bench/RESULTS.md.

Each benchmark owns a section headed ``## <name>``; rewriting it leaves the
other benchmarks' sections as they were, so benchmarks can run separately.
"""

from __future__ import annotations

import datetime as _dt
import platform
import re
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = "# Benchmark results\n\nEach section is rewritten by the benchmark that owns it.\n"


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section ``## name`` with ``body``."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (
        f"## {name}\n\n_Run {stamp} on {platform.machine()}, Python "
        f"{platform.python_version()}._\n\n{body.strip()}\n\n"
    )
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    pattern = re.compile(rf"^## {re.escape(name)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = (
        pattern.sub(lambda _m: section, text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + section
    )
    RESULTS.write_text(text)
