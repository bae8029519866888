from __future__ import annotations

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from webapp.accounts.models import ConsentPurpose


class LoginForm(AuthenticationForm):
    """Django's form with the labels our pages promise ("Username", "Password")."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.fields["username"].label = "Username"
        self.fields["password"].label = "Password"


class ConsentForm(forms.Form):
    """One checkbox per purpose; unchecked means withdrawn."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        for purpose in ConsentPurpose:
            self.fields[purpose.value] = forms.BooleanField(required=False, label=purpose.label)


class TokenForm(forms.Form):
    """The six-digit code an authenticator app shows."""

    token = forms.RegexField(
        regex=r"^\d{6}$",
        label="Code from your authenticator app",
        max_length=6,
        strip=True,
        error_messages={"invalid": "Enter the six digits your authenticator app shows."},
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "inputmode": "numeric", "autofocus": True}
        ),
    )
