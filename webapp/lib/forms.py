"""Forms that pages of more than one app use: the client's memory page and the
clinician's memory console both correct a memory item."""

from __future__ import annotations

from django import forms


class MemoryCorrectionForm(forms.Form):
    """A corrected memory (client's or clinician's). CharField refuses NUL already; text
    with lone surrogates can be neither stored as UTF-8 nor shown, so it is refused too."""

    text = forms.CharField(
        label="Corrected text", max_length=2000, widget=forms.Textarea(attrs={"rows": 2})
    )

    def clean_text(self) -> str:
        value: str = self.cleaned_data["text"]
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise forms.ValidationError(
                "The text contains characters that cannot be read."
            ) from None
        return value
