"""Validation reports written before issue 18 copied held-out clients' conversations
(prompt, and both versions' replies to it) into ``side_by_side``. Every entry not written
from a project or simulated prompt keeps its modality and is marked withheld; its group
key, prompt and replies go. Not reversible in content (the text is gone on purpose): the
reverse is a no-op.

Self-contained (no import of ``webapp.learning.reports``) so that later edits there cannot
change what this migration did.
"""

from django.db import migrations

SHOWABLE_SOURCES = {"project", "simulated"}


def drop_client_text(apps, schema_editor):  # type: ignore[no-untyped-def]
    AdapterVersion = apps.get_model("learning", "AdapterVersion")
    for version in AdapterVersion.objects.exclude(validation_report=None).iterator():
        report = version.validation_report
        entries = report.get("side_by_side") if isinstance(report, dict) else None
        if not isinstance(entries, list):
            continue
        cleaned, changed = [], False
        for entry in entries:
            if isinstance(entry, dict) and entry.get("source") in SHOWABLE_SOURCES:
                cleaned.append(entry)
                continue
            modality = entry.get("modality") if isinstance(entry, dict) else None
            cleaned.append(
                {"modality": modality if isinstance(modality, str) else "", "withheld": True}
            )
            changed = True
        if changed:
            report["side_by_side"] = cleaned
            AdapterVersion.objects.filter(pk=version.pk).update(validation_report=report)


class Migration(migrations.Migration):
    dependencies = [("learning", "0008_adapterversion_superseded")]
    operations = [migrations.RunPython(drop_client_text, migrations.RunPython.noop)]
