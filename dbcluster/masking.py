"""Secrets kept out of what dbcluster prints, logs and renders.

:func:`safe_url` is how a database URL is shown anywhere (messages, logs, pages, JSON):
the password of ``user:password@host`` and every password-like value of its query string
(``?password=...``, ``odbc_connect=...PWD=...;``) become ``***``, whether or not the text
parses as a URL. :func:`mask_secrets` does the same to free text that may hold one (a driver's
error message, a job's exit message, a log line), and :class:`SecretsFilter` applies it to
every record of a logging handler.

Masking errs on the side of hiding: a value is masked when it follows a password-like key
(``password``, ``passwd``, ``pwd``, ``pass``, ``secret``, ``token``, ``api_key``...) or sits
between ``:`` and ``@`` after a user name, percent-encoded or not.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from sqlalchemy.engine import URL, make_url

#: What a secret is replaced with (SQLAlchemy's own choice for a hidden password).
MASK = "***"

# user:password@ in a URL, with or without a scheme ('postgres:s3cret@dbhost/db'). The password
# runs to the last '@' of the word, so one holding an unencoded '@' is masked whole.
_USERINFO = re.compile(
    r"(?P<lead>(?:[A-Za-z][\w+.-]*://)?[^\s:/@'\"<>(),;=]*):(?P<secret>(?!/)[^\s'\"<>]+)@"
)
# key=value where the key names a secret: libpq keywords (password=...), query strings
# (?password=...), ODBC connection strings (PWD=...; PWD={...}), percent-encoded ones inside a
# URL's query (PWD%3D...%3B), and "password": "..." as a dict or JSON shows it.
_KEY = (
    r"(?:(?<![\w.%-])|(?<=%3[Bb])|(?<=%26)|(?<=%3[Ff]))"
    r"(?P<key>[\w.-]*(?:password|passwd|secret|token|api[_-]?key|passphrase)|pwd|pass)"
)
_VALUE = (
    r"(?P<secret>\{[^}]*\}?|'[^']*'?|\"[^\"]*\"?"
    r"|(?:(?!%3[Bb]|%26)[^;&\s'\",)}\]])+)"
)
_KEY_VALUE = re.compile(
    _KEY + r"(?P<sep>['\"]?\s*(?:=|%3[Dd]|:)\s*)" + _VALUE,
    re.IGNORECASE,
)
#: Text without any of these holds nothing _USERINFO or _KEY_VALUE could match.
_MARKS = ("@", "=", ":", "%3")
#: ASCII text whose lower case holds none of these has no key _KEY_VALUE could match (each of
#: its keys contains one). Text beyond ASCII always goes through it: under IGNORECASE a few
#: other letters match ASCII ones (the long s, the Kelvin sign).
_KEY_WORDS = ("pass", "pwd", "secret", "token", "api")


def mask_secrets(text: str) -> str:
    """``text`` with every password it shows replaced by ``***`` (see the module's doc).

    Each pattern runs only where it could match: every log line passes here, and a line with
    a ``:`` cost ~70 µs through both (a grouped drain's worker spent 7% of its Python there)."""
    if not any(mark in text for mark in _MARKS):
        return text
    if "@" in text:
        text = _USERINFO.sub(lambda m: f"{m.group('lead')}:{MASK}@", text)
    if not text.isascii() or _has_key_word(text.lower()):
        text = _KEY_VALUE.sub(_mask_value, text)
    return text


def _has_key_word(lowered: str) -> bool:
    return any(word in lowered for word in _KEY_WORDS)


def _mask_value(found: re.Match[str]) -> str:
    secret = found.group("secret")
    if secret == MASK or secret.strip("'\"{}") == MASK:
        return found.group(0)
    quote = secret[0] if secret[0] in "'\"{" else ""
    close = {"{": "}"}.get(quote, quote)
    masked = f"{quote}{MASK}{close if secret.endswith(close) and len(secret) > 1 else ''}"
    return f"{found.group('key')}{found.group('sep')}{masked}"


def safe_url(url: str | URL) -> str:
    """A database URL fit to print: its query string shown unencoded, every password
    ``***`` (one that does not parse as a URL is masked as text)."""
    try:
        parsed = url if isinstance(url, URL) else make_url(url)
    except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: mask it as text
        return mask_secrets(str(url))
    shown = parsed.set(query={}).render_as_string(hide_password=True)
    query = [
        f"{key}={item}"
        for key, value in parsed.query.items()
        for item in (value if isinstance(value, tuple) else (value,))
    ]
    if query:
        shown += "?" + "&".join(query)
    return mask_secrets(shown)


class SecretsFilter(logging.Filter):
    """Masks the secrets of every record that passes (its message with its arguments, and
    its exception's text): install it on a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            formatter = logging.Formatter()
            record.exc_text = mask_secrets(formatter.formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = mask_secrets(record.exc_text)
        return True


def masked(value: Any) -> Any:
    """``value`` with :func:`mask_secrets` applied to its text: a string, or every string in
    a JSON-like structure of dicts and lists (templates, JSON outputs)."""
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, dict):
        return {k: masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [masked(v) for v in value]
    return value
