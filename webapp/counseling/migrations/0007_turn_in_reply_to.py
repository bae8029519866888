"""A reply names the client turn it answers (messages sent while busy are stored first)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("counseling", "0006_turn_text_must_be_ciphertext")]
    operations = [
        migrations.AddField(
            model_name="turn",
            name="in_reply_to",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
