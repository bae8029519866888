"""Memory text is encrypted at rest (webapp/lib/crypto.py): encrypt the rows stored before.

The old CHECK (text <> '') cannot hold on ciphertext (never empty); MemoryItem.save()
refuses empty text instead, and 0003 makes the database refuse plaintext.
"""

from django.db import migrations

import webapp.lib.crypto


def encrypt_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    webapp.lib.crypto.rotate_table(
        schema_editor.connection, "memory_memoryitem", "text", encrypt_plaintext=True
    )


def decrypt_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    webapp.lib.crypto.decrypt_table(schema_editor.connection, "memory_memoryitem", "text")


class Migration(migrations.Migration):
    dependencies = [("memory", "0001_initial")]
    operations = [
        migrations.RemoveConstraint(model_name="memoryitem", name="memory_text_not_empty"),
        migrations.AlterField(
            model_name="memoryitem",
            name="text",
            field=webapp.lib.crypto.EncryptedTextField(),
        ),
        migrations.RunPython(encrypt_existing, decrypt_existing),
    ]
