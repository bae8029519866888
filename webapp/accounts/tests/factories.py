"""Typed factory-boy factories for accounts."""

from __future__ import annotations

import factory

from webapp.accounts.models import ClientProfile, ConsentPurpose, ConsentRecord, Role, User

PASSWORD = "correct horse battery staple"


class UserFactory(factory.django.DjangoModelFactory[User]):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    role = Role.CLIENT
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def _save(obj, create, extracted, **kwargs):  # type: ignore[no-untyped-def]
        if create:
            obj.save()


class ClinicianFactory(UserFactory):
    role = Role.CLINICIAN


class AdminFactory(UserFactory):
    role = Role.ADMIN


class ClientProfileFactory(factory.django.DjangoModelFactory[ClientProfile]):
    class Meta:
        model = ClientProfile

    user = factory.SubFactory(UserFactory)
    modality = "cbt"
    clinician = factory.SubFactory(ClinicianFactory)


def grant_all_consents(profile: ClientProfile) -> None:
    for purpose in ConsentPurpose:
        ConsentRecord.objects.create(profile=profile, purpose=purpose, granted=True)
