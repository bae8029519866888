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
