"""Per-client skill controls: the form's rules, the audit trail, and the engine honouring
them in the client's next session (real socket, tiny model)."""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import sync_to_async
from django.urls import reverse

from webapp.counseling import services
from webapp.counseling.models import Turn
from webapp.counseling.tests.helpers import connect, frames_until
from webapp.learning.models import SkillDecision
from webapp.oversight.models import AuditEvent, ClientControl
from webapp.oversight.tests.helpers import client_profile


@pytest.mark.django_db
def test_the_page_offers_only_the_clients_modality(client):  # type: ignore[no-untyped-def]
    profile = client_profile("het")
    client.force_login(profile.clinician)
    page = client.get(reverse("clinician_skills", args=[profile.user_id])).content.decode()
    assert 'value="HET1"' in page and 'value="HET6"' in page and "CBT1" not in page
    assert "<legend>Excluded skills</legend>" in page and "Pinned skill</label>" in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"excluded": ["CBT1", "CBT2", "CBT3", "CBT4", "CBT5", "CBT6"]}, "cannot exclude them all"),
        ({"excluded": ["CBT2"], "pinned": "CBT2"}, "cannot be pinned and excluded at once"),
        ({"excluded": ["HET1"]}, "Select a valid choice"),
        ({"pinned": "BT1"}, "Select a valid choice"),
    ],
)
def test_invalid_controls_are_refused(client, data, error):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    client.force_login(profile.clinician)
    response = client.post(reverse("clinician_skills", args=[profile.user_id]), data)
    assert response.status_code == 400 and error in response.content.decode()
    assert not ClientControl.objects.filter(client=profile.user).exists()
    assert not AuditEvent.objects.filter(action="skill_control.change").exists()


@pytest.mark.django_db
def test_saving_controls_is_audited_with_before_and_after(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    ClientControl.objects.create(client=profile.user, ai_paused=True, excluded_skills=["CBT6"])
    client.force_login(profile.clinician)
    url = reverse("clinician_skills", args=[profile.user_id])
    response = client.post(url, {"excluded": ["CBT4", "CBT5"], "pinned": "CBT1"})
    assert response.status_code == 302
    control = ClientControl.objects.get(client=profile.user)
    assert (control.pinned_skill, control.excluded_skills, control.ai_paused) == (
        "CBT1", ["CBT4", "CBT5"], True,
    )  # fmt: skip
    event = AuditEvent.objects.get(action="skill_control.change")
    assert event.actor == profile.clinician and event.subject == profile.user
    assert event.detail == {
        "before": {"pinned": "", "excluded": ["CBT6"]},
        "after": {"pinned": "CBT1", "excluded": ["CBT4", "CBT5"]},
    }
    page = client.get(url).content.decode()
    assert re.search(r'value="CBT4"[^>]*checked', page)
    assert not re.search(r'value="CBT6"[^>]*checked', page)
    assert re.search(r'<option value="CBT1" selected', page)


@pytest.mark.django_db
def test_htmx_saves_in_place(client):  # type: ignore[no-untyped-def]
    profile = client_profile("cbt")
    client.force_login(profile.clinician)
    url = reverse("clinician_skills", args=[profile.user_id])
    response = client.post(url, {"excluded": ["CBT3"]}, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 200 and body.startswith('<form method="post"')
    assert "Saved." in body and "<html" not in body
    bad = client.post(url, {"excluded": ["CBT3"], "pinned": "CBT3"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "cannot be pinned" in bad.content.decode()


async def _talk(session, user, texts):  # type: ignore[no-untyped-def]
    comm, connected, _, _ = await connect(f"/ws/sessions/{session.pk}/", user)
    assert connected
    for i, text in enumerate(texts):
        await comm.send_to(
            text_data=json.dumps({"type": "message", "text": text, "client_msg_id": f"m{i}"})
        )
        await frames_until(comm, r'class="turn turn-counselor"')
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_thread_db_connections")
async def test_excluded_skills_take_effect_in_the_next_session(tiny_engine, client):  # type: ignore[no-untyped-def]
    profile = await sync_to_async(client_profile)("cbt")
    await sync_to_async(client.force_login)(profile.clinician)
    excluded = ["CBT1", "CBT2", "CBT3", "CBT4", "CBT5"]
    response = await sync_to_async(client.post)(
        reverse("clinician_skills", args=[profile.user_id]), {"excluded": excluded}
    )
    assert response.status_code == 302
    session = await sync_to_async(services.start_session)(profile.user)
    await _talk(
        session, profile.user, ["I feel anxious about work", "I can't sleep before Mondays"]
    )
    skills = await sync_to_async(list)(
        Turn.objects.filter(session=session, role="counselor").values_list("skill", flat=True)
    )
    assert skills == ["CBT6", "CBT6"]
    records = await sync_to_async(list)(
        SkillDecision.objects.filter(turn__session=session).values_list("records", flat=True)
    )
    assert all(set(r) == {"CBT6"} for r in records)
    page = await sync_to_async(client.get)(reverse("session_review", args=[session.pk]))
    assert page.content.decode().count("excluded at the time") == 2 * len(excluded)
