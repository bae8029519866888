"""Reproducible seeds, shared by the counselor, MCTSr, the simulation lab and the web app.

Its own module because everything that seeds a run needs it and it needs nothing: kept in
counselor.py it tied mctsr.py and counselor.py into an import circle.
"""

from __future__ import annotations

import hashlib


def stable_seed(*parts: object) -> int:
    """A reproducible 63-bit seed from any parts (never Python's salted hash())."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
