"""Turn text is encrypted at rest (webapp/lib/crypto.py): encrypt the rows stored before."""

from django.db import migrations

import webapp.lib.crypto


def encrypt_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    webapp.lib.crypto.rotate_table(
        schema_editor.connection, "counseling_turn", "text", encrypt_plaintext=True
    )


def decrypt_existing(apps, schema_editor):  # type: ignore[no-untyped-def]
    webapp.lib.crypto.decrypt_table(schema_editor.connection, "counseling_turn", "text")


class Migration(migrations.Migration):
    dependencies = [("counseling", "0004_turn_text_rotation_guard")]
    operations = [
        migrations.AlterField(
            model_name="turn",
            name="text",
            field=webapp.lib.crypto.EncryptedTextField(),
        ),
        migrations.RunPython(encrypt_existing, decrypt_existing),
    ]
