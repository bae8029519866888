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


def cpu_model() -> str:
    """The CPU's model name (Linux), else the machine type: machines lent here differ
    from day to day (an AMD EPYC one day, an Intel Xeon the next), and absolute times and
    even which precision is faster change with them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {platform.machine()}"
    except OSError:
        pass
    return platform.machine()


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section ``## name`` with ``body``."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (
        f"## {name}\n\n_Run {stamp} on {cpu_model()}, Python "
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
