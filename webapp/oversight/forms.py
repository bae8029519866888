"""Forms of the clinician and admin consoles."""

from __future__ import annotations

from typing import Any, cast

from django import forms

from counselor_engine.skills import skills_for
from webapp.accounts.models import Modality
from webapp.oversight import console


class SkillControlForm(forms.Form):
    """Pin or exclude skills of ONE modality (the client's); the rules live in
    ``console.validate_controls`` so the service enforces them too."""

    pinned = forms.ChoiceField(label="Pinned skill", required=False)
    excluded = forms.MultipleChoiceField(
        label="Excluded skills", required=False, widget=forms.CheckboxSelectMultiple
    )

    def __init__(self, modality: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.modality = modality
        choices = [(s.id, f"{s.id} · {s.name}") for s in skills_for(modality)]
        cast(forms.ChoiceField, self.fields["pinned"]).choices = [
            ("", "No pin: HBSP chooses"),
            *choices,
        ]
        cast(forms.ChoiceField, self.fields["excluded"]).choices = choices

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors:
            try:
                console.validate_controls(
                    self.modality, data.get("pinned", ""), data.get("excluded", [])
                )
            except console.ControlError as exc:
                raise forms.ValidationError(str(exc)) from None
        return data


class CheckpointForm(forms.Form):
    before = forms.CharField(required=False)
    after = forms.CharField(required=False)


class AuditFilterForm(forms.Form):
    action = forms.CharField(label="Action starts with", required=False, max_length=64)
    actor = forms.CharField(label="Actor username", required=False, max_length=150)
    subject = forms.CharField(label="Client username or id", required=False, max_length=150)
    since = forms.DateField(
        label="From", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )
    until = forms.DateField(
        label="To", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )


class PopulationForm(forms.Form):
    modality = forms.ChoiceField(choices=Modality.choices, required=False)


class EraseForm(forms.Form):
    confirm = forms.CharField(label="Type the client's username to confirm", max_length=150)

    def __init__(self, username: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.username = username

    def clean_confirm(self) -> str:
        value = self.cleaned_data["confirm"].strip()
        if value != self.username:
            raise forms.ValidationError("That is not this client's username.")
        return value
