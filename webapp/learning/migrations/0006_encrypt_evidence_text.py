"""Encrypt in place the evidence and validation-report JSON stored before 0005 (and back
to plaintext JSON on reverse, before 0005 turns the columns back into jsonb)."""

from django.db import migrations

import webapp.lib.crypto

COLUMNS = [
    ("learning_candidategroup", "prompt"),
    ("learning_candidategroup", "candidates"),
    ("learning_candidategroup", "search"),
    ("learning_adapterversion", "validation_report"),
]


def encrypt_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    for table, column in COLUMNS:
        webapp.lib.crypto.rotate_table(schema_editor.connection, table, column, encrypt_plaintext=True)


def decrypt_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    for table, column in COLUMNS:
        webapp.lib.crypto.decrypt_table(schema_editor.connection, table, column)


class Migration(migrations.Migration):
    dependencies = [("learning", "0005_evidence_json_columns_to_text")]
    operations = [migrations.RunPython(encrypt_existing, decrypt_existing)]
