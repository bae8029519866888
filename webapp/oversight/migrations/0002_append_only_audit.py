"""Audit events cannot be changed once written (the function comes from counseling)."""

from django.db import migrations

SQL = """
CREATE TRIGGER oversight_auditevent_append_only
    BEFORE UPDATE ON oversight_auditevent
    FOR EACH ROW EXECUTE FUNCTION psyevo_refuse_update();
"""

REVERSE = "DROP TRIGGER IF EXISTS oversight_auditevent_append_only ON oversight_auditevent;"


class Migration(migrations.Migration):
    dependencies = [("oversight", "0001_initial"), ("counseling", "0003_append_only_turns")]
    operations = [migrations.RunSQL(SQL, REVERSE)]
