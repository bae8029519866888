"""HTTP as a browser speaks it, for tests that drive real server processes on loopback.

Cookies (session, CSRF) are kept in one jar, as one browser keeps them, also across
servers behind one proxy; forms are posted with the CSRF token from the cookie.
"""

from __future__ import annotations

import http.cookiejar
import urllib.parse
import urllib.request


class Web:
    """One browser's cookies and the GET/POST it makes."""

    def __init__(self) -> None:
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def cookie(self, name: str) -> str:
        return next((c.value or "" for c in self.jar if c.name == name), "")

    @property
    def header(self) -> str:
        return "; ".join(f"{c.name}={c.value}" for c in self.jar)

    def get(self, url: str) -> tuple[str, str]:
        """The final URL (after redirects) and the page."""
        with self.opener.open(url, timeout=60) as resp:
            return resp.geturl(), resp.read().decode()

    def post(self, url: str, data: dict[str, str]) -> tuple[str, str]:
        """POST a form with the CSRF token from the cookie (GET ``url``'s page first)."""
        if not self.cookie("csrftoken"):
            self.get(url if "login" in url else url.rsplit("/", 2)[0] + "/")
        body = urllib.parse.urlencode({**data, "csrfmiddlewaretoken": self.cookie("csrftoken")})
        request = urllib.request.Request(url, data=body.encode(), method="POST")
        with self.opener.open(request, timeout=240) as resp:
            return resp.geturl(), resp.read().decode()

    def log_in(self, base: str, username: str, password: str) -> str:
        """Log in through the login form; returns the page the browser lands on."""
        self.get(f"{base}/login/")
        landed, _ = self.post(f"{base}/login/", {"username": username, "password": password})
        assert self.cookie("sessionid"), f"{username} could not log in"
        return landed
