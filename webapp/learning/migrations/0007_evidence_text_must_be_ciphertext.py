"""The database refuses evidence and validation-report JSON that is not a Fernet token
(as counseling 0006 does for turns); NULL stays allowed where the column is nullable."""

from django.db import migrations

CHECKS = [
    ("learning_candidategroup", "prompt"),
    ("learning_candidategroup", "candidates"),
    ("learning_candidategroup", "search"),
    ("learning_adapterversion", "validation_report"),
]

SQL = [
    f"ALTER TABLE {table} ADD CONSTRAINT {table}_{column}_encrypted"
    f" CHECK (left({column}, 6) = 'gAAAAA');"
    for table, column in CHECKS
]
REVERSE = [
    f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {table}_{column}_encrypted;"
    for table, column in CHECKS
]


class Migration(migrations.Migration):
    dependencies = [("learning", "0006_encrypt_evidence_text")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
