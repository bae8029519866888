"""``SafetyFlag.matched`` keeps the ids of the safety rules that fired (``self_harm.plan``,
``model.crisis``), never words from the client's message, so it stays unencrypted. The
database holds it to that: a JSON array of short identifiers, nothing with a space or
punctuation that a copied phrase would carry. A change that starts copying phrases into it
fails here loudly instead of leaving client words in plaintext at rest.
"""

from django.db import migrations

SQL = r"""
ALTER TABLE oversight_safetyflag ADD CONSTRAINT oversight_safetyflag_matched_rule_ids
    CHECK (
        jsonb_typeof(matched) = 'array'
        AND NOT jsonb_path_exists(
            matched, '$[*] ? (@.type() != "string" || !(@ like_regex "^[A-Za-z0-9_.:-]{1,64}$"))'
        )
    );
"""
REVERSE = (
    "ALTER TABLE oversight_safetyflag DROP CONSTRAINT IF EXISTS "
    "oversight_safetyflag_matched_rule_ids;"
)


class Migration(migrations.Migration):
    dependencies = [("oversight", "0002_append_only_audit")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
