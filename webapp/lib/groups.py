"""Channel-layer group names, in one place for the sockets that join them and the
services that send to them (group names from ids, never from user input)."""

from __future__ import annotations


def user_group(user_id: int) -> str:
    """Every open page of one user (the notification socket)."""
    return f"user.{user_id}"


def session_group(session_id: int) -> str:
    """Every socket open on one counseling session: the client's and the clinicians'."""
    return f"session.{session_id}"
