"""Turns stay append-only, with one narrow exception for re-encrypting their text.

``manage.py rotate_keys`` (and the data migration that introduced encryption) must rewrite
``text`` with the same message under a new key. The trigger lets an UPDATE through only
when the transaction-local setting ``psyevo.rotating`` is on AND no column other than
``text`` changes; every other UPDATE is refused as before. The setting is set with
``set_config(..., true)``, so it ends with the transaction that set it.
"""

from django.db import migrations

SQL = """
CREATE OR REPLACE FUNCTION psyevo_turn_refuse_update() RETURNS trigger AS $$
BEGIN
    IF coalesce(current_setting('psyevo.rotating', true), '') = 'on'
       AND (to_jsonb(NEW) - 'text') = (to_jsonb(OLD) - 'text') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '% rows are append-only', TG_TABLE_NAME USING ERRCODE = 'check_violation';
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS counseling_turn_append_only ON counseling_turn;
CREATE TRIGGER counseling_turn_append_only
    BEFORE UPDATE ON counseling_turn
    FOR EACH ROW EXECUTE FUNCTION psyevo_turn_refuse_update();
"""

REVERSE = """
DROP TRIGGER IF EXISTS counseling_turn_append_only ON counseling_turn;
CREATE TRIGGER counseling_turn_append_only
    BEFORE UPDATE ON counseling_turn
    FOR EACH ROW EXECUTE FUNCTION psyevo_refuse_update();
DROP FUNCTION IF EXISTS psyevo_turn_refuse_update();
"""


class Migration(migrations.Migration):
    dependencies = [("counseling", "0003_append_only_turns")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
