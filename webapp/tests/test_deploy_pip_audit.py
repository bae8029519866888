"""No installed package has a known vulnerability (pip-audit against PyPI's advisories).

Slow and networked: `bin/test -m slow`. Without a route to the advisory service, or when
it cannot look a package up, the test FAILS saying so; it never passes without having looked.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_pip_audit_finds_no_known_vulnerability(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = tmp_path / "audit.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "pip_audit",
            "--progress-spinner", "off",
            "--skip-editable",  # this project itself is not on PyPI
            "--format", "json", "--output", str(report),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    if not report.exists():
        pytest.fail(
            "pip-audit could not produce a report (no network to the PyPI advisory service?)."
            f" Nothing was checked.\n{result.stderr[-2000:]}"
        )
    dependencies = json.loads(report.read_text())["dependencies"]
    # pip-audit says "No known vulnerabilities found" even when it could look none up: a
    # package it skipped was not checked, and that is a failure, not a pass.
    unchecked = [
        dep["skip_reason"]
        for dep in dependencies
        if "skip_reason" in dep and dep["skip_reason"] != "distribution marked as editable"
    ]
    assert not unchecked, (
        f"pip-audit could not check {len(unchecked)} of {len(dependencies)} packages (is the"
        " PyPI advisory service reachable from here?); first: " + "; ".join(unchecked[:3])
    )
    found = [
        f"{dep['name']} {dep['version']}: {vuln['id']} (fixed in {vuln.get('fix_versions')})"
        for dep in dependencies
        for vuln in dep.get("vulns", [])
    ]
    assert not found, "known vulnerabilities:\n" + "\n".join(found)
    assert result.returncode == 0, result.stderr[-2000:]
