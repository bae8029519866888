"""Creating accounts: one place, so the admin commands and tests share the same rules."""

from __future__ import annotations

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction

from webapp.accounts.models import ClientProfile, Modality, Role, User


class AccountError(ValueError):
    """A request to create an account that cannot be honoured; the message says why."""


def create_account(
    username: str,
    *,
    role: str,
    password: str,
    modality: str | None = None,
    clinician: str | None = None,
    email: str = "",
    validate: bool = True,
) -> User:
    """Create a user (and, for a client, the profile) atomically, or nothing at all.

    ``email`` is where crisis alerts reach a clinician (and an escalated one); a clinician
    without one gets the alerts on the dashboard only, which it then says."""
    if role not in Role.values:
        raise AccountError(f"unknown role {role!r}; choose one of {', '.join(Role.values)}")
    if not username.strip():
        raise AccountError("username must not be empty")
    if role != Role.CLIENT and (modality or clinician):
        raise AccountError("--modality and --clinician apply to clients only")
    if role == Role.CLIENT:
        modality = modality or Modality.CBT
        if modality not in Modality.values:
            raise AccountError(
                f"unknown modality {modality!r}; choose one of {', '.join(Modality.values)}"
            )
    clinician_user = None
    if clinician:
        clinician_user = User.objects.filter(username=clinician, role=Role.CLINICIAN).first()
        if clinician_user is None:
            raise AccountError(f"no clinician named {clinician!r}")
    email = email.strip()
    if email:
        try:
            validate_email(email)
        except ValidationError:
            raise AccountError(f"not an e-mail address: {email!r}") from None
    if User.objects.filter(username=username).exists():
        raise AccountError(f"a user named {username!r} already exists")
    user = User(username=username, role=role, email=email)
    if validate:
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise AccountError("password rejected: " + " ".join(exc.messages)) from None
    with transaction.atomic():
        user.set_password(password)
        user.is_superuser = role == Role.ADMIN
        user.save()
        if role == Role.CLIENT:
            ClientProfile.objects.create(user=user, modality=modality, clinician=clinician_user)
    return user
