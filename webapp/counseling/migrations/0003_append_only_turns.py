"""Turns are append-only in the database itself, not just in Python: an UPDATE fails.

Deleting stays possible (erasure of a client's data, cascades from a session).
"""

from django.db import migrations

SQL = """
CREATE OR REPLACE FUNCTION psyevo_refuse_update() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% rows are append-only', TG_TABLE_NAME USING ERRCODE = 'check_violation';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER counseling_turn_append_only
    BEFORE UPDATE ON counseling_turn
    FOR EACH ROW EXECUTE FUNCTION psyevo_refuse_update();
"""

REVERSE = """
DROP TRIGGER IF EXISTS counseling_turn_append_only ON counseling_turn;
"""


class Migration(migrations.Migration):
    dependencies = [("counseling", "0002_initial")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
