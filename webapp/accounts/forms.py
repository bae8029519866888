from __future__ import annotations

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from webapp.accounts.models import ConsentPurpose


class LoginForm(AuthenticationForm):
    """Django's form with the labels our pages promise ("Username", "Password"), refusing
    a username longer than any account can have."""

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.fields["username"].label = "Username"
        self.fields["password"].label = "Password"

    def clean(self):  # type: ignore[no-untyped-def]
        # AuthenticationForm sets only the widget's maxlength, so an overlong username went
        # on to authenticate(), and django-axes failed to record the failure in its
        # varchar(255) column: a 500. No account has such a name: it is a wrong log-in.
        username = self.cleaned_data.get("username")
        if username is not None and len(username) > self.fields["username"].max_length:
            raise self.get_invalid_login_error()
        return super().clean()


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
