"""Evidence prompts, candidate replies, search trees and validation reports move from jsonb
to text columns read through ``EncryptedJSONField`` (webapp/lib/crypto.py); 0006 then encrypts
the JSON text of the rows stored before. Two migrations, so two transactions: PostgreSQL
cannot ALTER a table that has pending (deferred foreign-key) trigger events, which the
row updates of 0006's reverse leave behind.
"""

from django.db import migrations

import webapp.lib.crypto


class Migration(migrations.Migration):
    dependencies = [("learning", "0004_candidategroup_search")]
    operations = [
        migrations.AlterField(
            model_name="adapterversion",
            name="validation_report",
            field=webapp.lib.crypto.EncryptedJSONField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="candidategroup",
            name="prompt",
            field=webapp.lib.crypto.EncryptedJSONField(),
        ),
        migrations.AlterField(
            model_name="candidategroup",
            name="candidates",
            field=webapp.lib.crypto.EncryptedJSONField(),
        ),
        migrations.AlterField(
            model_name="candidategroup",
            name="search",
            field=webapp.lib.crypto.EncryptedJSONField(blank=True, null=True),
        ),
    ]
