"""The database refuses turn text that is not a Fernet token, so plaintext written past
the ORM (raw SQL, a bulk tool) cannot land at rest. A separate migration from the data
migration: PostgreSQL cannot ALTER a table with pending trigger events in one transaction.
"""

from django.db import migrations

SQL = """
ALTER TABLE counseling_turn ADD CONSTRAINT counseling_turn_text_encrypted
    CHECK (left(text, 6) = 'gAAAAA');
"""
REVERSE = "ALTER TABLE counseling_turn DROP CONSTRAINT IF EXISTS counseling_turn_text_encrypted;"


class Migration(migrations.Migration):
    dependencies = [("counseling", "0005_encrypt_turn_text")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
