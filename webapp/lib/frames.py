"""HTML frames for the chat socket (htmx ws extension swaps them out-of-band by id).

Every frame carries a sequence number (``data-seq``): the transcript seq of the turn it
shows or builds. Model output is untrusted text: everything is escaped here.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.template.loader import render_to_string
from django.utils.html import escape

from webapp.counseling.models import Turn


def clear_pending_frame() -> str:
    """Empties the bubble of the reply being written."""
    return '<div id="pending" hx-swap-oob="innerHTML"></div>'


def turn_frame(turn: Turn) -> str:
    body = render_to_string("counseling/_turn.html", {"turn": turn})
    clear = clear_pending_frame() if turn.role != Turn.Role.CLIENT else ""
    return f'<div id="transcript" hx-swap-oob="beforeend" data-seq="{turn.seq}">{body}</div>{clear}'


def pending_frame(seq: int) -> str:
    return (
        f'<div id="pending" hx-swap-oob="innerHTML" data-seq="{seq}">'
        f'<article class="turn turn-counselor pending" aria-busy="true">'
        f'<h3 class="speaker">Counselor (AI)</h3><p id="pending-text" data-seq="{seq}"></p></article></div>'
    )


def token_frame(seq: int, index: int, text: str) -> str:
    stamp = ""
    if settings.WS_TIMESTAMP_FRAMES:
        # bench/bench_ws.py: engine token -> frame received, from this send time.
        stamp = f' data-t="{time.time():.6f}"'
    return (
        f'<span id="pending-text" hx-swap-oob="beforeend" data-seq="{seq}" data-frame="{index}"'
        f"{stamp}>{escape(text)}</span>"
    )


def status_frame(seq: int, text: str, *, busy: bool = False) -> str:
    return (
        f'<div id="status" hx-swap-oob="innerHTML" data-seq="{seq}">'
        f'<p class="status{" busy" if busy else ""}">{escape(text)}</p></div>'
    )


def progress_frame(seq: int, stage: str, done: int, total: int) -> str:
    """The engine's own progress on a judged reply, in words and as a bar (busy: the page
    shows the counselor at work)."""
    if stage == "drafting" and done < total:
        text = f"The counselor is writing {total} possible replies…"
    elif stage == "drafting":
        text = f"{done} possible replies written; comparing them to choose the best…"
    else:
        text = f"Comparing the possible replies: {done} of {total} comparisons done…"
    # While the drafts are written (one batched call with no steps to count) the bar is
    # indeterminate: it moves, and claims no fraction it cannot know.
    value = "" if stage == "drafting" and done < total else f' value="{int(done)}"'
    return (
        f'<div id="status" hx-swap-oob="innerHTML" data-seq="{seq}">'
        f'<p class="status busy" data-stage="{escape(stage)}" data-done="{int(done)}"'
        f' data-total="{int(total)}">{escape(text)}</p>'
        f'<progress max="{int(total)}"{value} aria-hidden="true"></progress></div>'
    )


def queued_frame(seq: int) -> str:
    """For the tab that sent a message while a reply was being written: it is stored and
    will be answered next (``busy``: the page keeps its "writing" state)."""
    return status_frame(
        seq,
        "Your message is saved. The counselor will answer it after the current reply.",
        busy=True,
    )


def error_frame(
    seq: int, code: str, message: str, *, retry_msg_id: str = "", resend_text: str = ""
) -> str:
    """An error in the status area. ``retry_msg_id``: a "Try again" button that asks for a
    new reply to the stored message. ``resend_text`` (with ``retry_msg_id``): a "Send
    again" button carrying the text itself, for a message that may not have been stored
    (the same id makes a resend of one that was stored harmless)."""
    retry = ""
    if resend_text and retry_msg_id:
        retry = (
            f'<form ws-send class="retry"><input type="hidden" name="type" value="message">'
            f'<input type="hidden" name="client_msg_id" value="{escape(retry_msg_id)}">'
            f'<input type="hidden" name="text" value="{escape(resend_text)}">'
            f'<button type="submit">Send again</button></form>'
        )
    elif retry_msg_id:
        retry = (
            f'<form ws-send class="retry"><input type="hidden" name="type" value="retry">'
            f'<input type="hidden" name="client_msg_id" value="{escape(retry_msg_id)}">'
            f'<button type="submit">Try again</button></form>'
        )
    return (
        f'<div id="status" hx-swap-oob="innerHTML" data-seq="{seq}">'
        f'<p class="error" role="alert" data-code="{escape(code)}">{escape(message)}</p>{retry}</div>'
    )


def control_frame(seq: int, *, paused: bool, clinician_present: bool) -> str:
    if paused:
        text = "Your clinician has paused the AI counselor and will reply to you here."
    elif clinician_present:
        text = "Your clinician has joined this session."
    else:
        text = ""
    return f'<div id="control" hx-swap-oob="innerHTML" data-seq="{seq}">{escape(text)}</div>'
