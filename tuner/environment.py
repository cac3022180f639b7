"""What a trial inherits of tuner's environment: everything but the store's secrets.

Withheld from every trial (command and local runners, and the environment sbatch exports to a job):
- TUNER_DB, PGPASSWORD, PGPASSFILE and DATABASE_URL, whatever their values;
- every variable whose value contains a password of the store. The passwords are those in the URLs
  of TUNER_DB and DATABASE_URL (`user:password@` or a `password=` parameter), PGPASSWORD's value, and
  those of every URL given to `withhold_url` (the CLI gives it each `--db`). Matching is a plain
  substring test, so a password that is also, say, a directory name on PATH withholds PATH too.

Pure apart from a process-wide set of withheld passwords; a runner pickled for a Ray worker carries
them with it (`withheld()` / `withhold`).
"""

from __future__ import annotations

import os
import re
import threading
from typing import Iterable, Mapping
from urllib.parse import unquote, urlsplit

PRIVATE_NAMES = ("TUNER_DB", "PGPASSWORD", "PGPASSFILE", "DATABASE_URL")
URL_NAMES = ("TUNER_DB", "DATABASE_URL")
_PASSWORD_PARAM = re.compile(r"\bpassword=([^&\s]+)", re.IGNORECASE)

_withheld: set[str] = set()
_lock = threading.Lock()


def url_passwords(url: str | None) -> set[str]:
    """The passwords inside a database URL, as written and percent-decoded; empty when none."""
    if not url:
        return set()
    found = set(_PASSWORD_PARAM.findall(url))
    netloc = urlsplit(url).netloc if "://" in url else ""
    if "@" in netloc:
        userinfo = netloc.rsplit("@", 1)[0]
        if ":" in userinfo:
            found.add(userinfo.split(":", 1)[1])
    return {p for raw in found for p in (raw, unquote(raw)) if p}


def withhold(*passwords: str) -> None:
    """Withhold every variable containing one of `passwords` from trials started from now on."""
    with _lock:
        _withheld.update(p for p in passwords if p)


def withhold_url(url: str | None) -> None:
    """Withhold the passwords of a store URL (the CLI calls this with every --db)."""
    withhold(*url_passwords(url))


def withheld() -> list[str]:
    with _lock:
        return sorted(_withheld)


def secrets_of(environ: Mapping[str, str]) -> set[str]:
    """Every password a trial must not see, given tuner's environment."""
    found = set(withheld())
    for name in URL_NAMES:
        found |= url_passwords(environ.get(name))
    if environ.get("PGPASSWORD"):
        found.add(environ["PGPASSWORD"])
    return found


def is_private(name: str, value: str, secrets: Iterable[str]) -> bool:
    return name in PRIVATE_NAMES or any(s in value for s in secrets)


def public_env(variables: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`variables` without the private ones (secrets judged from `environ`, default os.environ)."""
    secrets = secrets_of(os.environ if environ is None else environ)
    return {k: v for k, v in variables.items() if not is_private(k, v, secrets)}


def inherited_env() -> dict[str, str]:
    """This process's environment as a trial inherits it."""
    return public_env(os.environ)
