from __future__ import annotations

from django import forms

ITEMS = (
    ("relationship", "How well did you feel heard, understood and respected?"),
    ("goals_and_topics", "Did we work on and talk about what you wanted to?"),
    ("approach", "Was the counselor's approach a good fit for you?"),
    ("overall", "Overall, how was today's session for you?"),
)


class RatingForm(forms.Form):
    """SRS-style end-of-session rating: four sliders from 0 to 10."""

    skip = forms.BooleanField(required=False)

    def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        for name, label in ITEMS:
            self.fields[name] = forms.FloatField(
                label=label,
                min_value=0.0,
                max_value=10.0,
                required=False,
                widget=forms.NumberInput(attrs={"type": "range", "min": 0, "max": 10, "step": 0.5}),
            )

    def clean(self):  # type: ignore[no-untyped-def]
        data = super().clean()
        if not data.get("skip"):
            missing = [name for name, _ in ITEMS if data.get(name) is None]
            if missing:
                raise forms.ValidationError("Rate all four items, or choose to end without rating.")
        return data

    def rating(self) -> dict[str, float] | None:
        if self.cleaned_data.get("skip"):
            return None
        return {name: float(self.cleaned_data[name]) for name, _ in ITEMS}
