"""The database refuses memory text that is not a Fernet token (see counseling 0006)."""

from django.db import migrations

SQL = """
ALTER TABLE memory_memoryitem ADD CONSTRAINT memory_memoryitem_text_encrypted
    CHECK (left(text, 6) = 'gAAAAA');
"""
REVERSE = (
    "ALTER TABLE memory_memoryitem DROP CONSTRAINT IF EXISTS memory_memoryitem_text_encrypted;"
)


class Migration(migrations.Migration):
    dependencies = [("memory", "0002_encrypt_memory_text")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
