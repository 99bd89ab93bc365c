"""Notifications when a job ends (the spec's ``notify:``), delivered once.

``submit`` starts ``python -m launcher.service.notifywatch HOME JOB_ID`` in a session of its own:
it asks the target for the job's state (the service's ``wait``, backing off to one query every
5 s; Slurm's and Kubernetes's own polling limits apply) until the job ends, then runs the command
and POSTs to the URL. The notify settings reach it in its environment (``DDPJOB_NOTIFY``), never a
file: a webhook URL is often a secret. So it works on every target and after the submitting
shell is gone; it does not survive the submitting machine's restart (then nothing is sent, and
``status`` says the watcher is gone). Its record, ``<run dir>/notified.json``, is created
exclusively: a notification is sent at most once. The watcher's own messages go to
``<run dir>/notifier.log``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from launcher.targets.shared.runfolder import NOTIFIER_LOG, RunFolder

if TYPE_CHECKING:
    from launcher.service.registry import JobRecord
    from launcher.spec.notify import NotifyOptions

NOTIFY_ENV = "DDPJOB_NOTIFY"
COMMAND_TIMEOUT_S = 60
URL_TIMEOUT_S = 10


def start(home: str, job_id: str, run_dir: str, options: NotifyOptions) -> int:
    """Start the watcher of ``job_id``; its pid."""
    os.makedirs(run_dir, exist_ok=True)
    env = {**os.environ, NOTIFY_ENV: options.model_dump_json()}
    env.pop("DDPJOB_JOB_ID", None)  # the watcher is not one of the job's processes (cancel's marker)
    with open(RunFolder(run_dir).notifier_log, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "launcher.service.notifywatch", home, job_id],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True, cwd=run_dir)
    with open(RunFolder(run_dir).notifier_pid, "w") as f:
        f.write(str(proc.pid))
    return proc.pid


def payload(rec: JobRecord) -> dict[str, str]:
    """What the URL receives (and, as DDPJOB_* variables, the command)."""
    return {"job_id": rec.id, "name": rec.name, "target": rec.target, "state": rec.state.value,
            "message": rec.message, "run_dir": rec.run_dir}


def deliver(rec: JobRecord, options: NotifyOptions) -> dict[str, object] | None:
    """Send the notification of the ended job ``rec`` unless it was sent already (None then);
    the record written to ``notified.json``."""
    if rec.state.value.lower() not in options.when:
        return _claim(rec.run_dir, {"skipped": f"state {rec.state.value} is not in notify.when"})
    claimed = _claim(rec.run_dir, {"state": rec.state.value, "started": time.time()})
    if claimed is None:
        return None
    data = payload(rec)
    if options.command:
        env = {**os.environ, **{f"DDPJOB_{k.upper()}": str(v) for k, v in data.items()
                                if k not in ("name", "job_id")},
               "DDPJOB_JOB_ID": rec.id, "DDPJOB_JOB_NAME": rec.name}
        env.pop(NOTIFY_ENV, None)
        try:
            done = subprocess.run(options.command, env=env, cwd=rec.run_dir, stdin=subprocess.DEVNULL,
                                  timeout=COMMAND_TIMEOUT_S, check=False)
            claimed["command"] = f"exit {done.returncode}"
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            claimed["command"] = f"failed: {e}"
    if options.url:
        claimed["url"] = _post(options.url, data)
    claimed["ended"] = time.time()
    _write(rec.run_dir, claimed)
    return claimed


def _post(url: str, data: dict[str, str]) -> str:
    """POST ``data`` to ``url``; what happened, in words that never hold the URL's path."""
    import urllib.error
    import urllib.request

    from launcher.spec.secrets import shown_url

    try:
        target, headers = _credentials(url)
        request = urllib.request.Request(target, data=json.dumps(data).encode(), method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "ddpjob", **headers})
        with urllib.request.urlopen(request, timeout=URL_TIMEOUT_S) as response:
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code} from {shown_url(url)}"
    except Exception as e:  # noqa: BLE001 - unreachable, refused, timed out, a URL http.client refuses: said, never raised
        reason = getattr(e, "reason", None) or e  # URLError's: the OSError underneath
        said = str(reason) if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
        return f"not delivered to {shown_url(url)}: {scrub(said, url)}"


def _credentials(url: str) -> tuple[str, dict[str, str]]:
    """A URL with ``user:password@`` is sent as the web does: without them in the URL (where urllib
    would take them for the host), as HTTP basic authentication (percent-decoded)."""
    import base64
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, {}
    user, _, password = parts.netloc.rpartition("@")[0].partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])), {"Authorization": f"Basic {token}"}


def scrub(text: str, url: str) -> str:
    """``text`` (an exception's words) without ``url``, its path or its query: each becomes ***."""
    from urllib.parse import urlsplit

    from launcher.spec.secrets import MASK

    pieces = [url]
    try:
        parts = urlsplit(url)
        pieces += [parts.path + (f"?{parts.query}" if parts.query else ""), parts.path, parts.query, parts.fragment,
                   parts.netloc.rpartition("@")[0]]
    except ValueError:
        pass
    pieces += [repr(p)[1:-1] for p in pieces]  # as an exception's repr() of it writes it
    for piece in sorted((p for p in set(pieces) if p and p != "/"), key=len, reverse=True):
        text = text.replace(piece, MASK)
    return text


def _claim(run_dir: str, record: dict[str, object]) -> dict[str, object] | None:
    try:
        fd = os.open(RunFolder(run_dir).notified, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return None
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    return record


def _write(run_dir: str, record: dict[str, object]) -> None:
    from launcher.targets.shared.files import atomic_write

    atomic_write(RunFolder(run_dir).notified, json.dumps(record))


def read(run_dir: str) -> dict[str, object] | None:
    """``notified.json``, or None before the job ended (or without notify, or not a record)."""
    try:
        with open(RunFolder(run_dir).notified) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def watcher_alive(run_dir: str) -> bool:
    """Whether this job's watcher still runs (its pid file names a live process)."""
    try:
        with open(RunFolder(run_dir).notifier_pid) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def state_of(rec: JobRecord) -> dict[str, object] | None:
    """For ``status``: the notification's record once sent, else whether its watcher still waits
    (None for a job without notify)."""
    if not rec.summary.notify:
        return None
    sent = read(rec.run_dir)
    if sent is not None:
        if "started" in sent and "ended" not in sent and not watcher_alive(rec.run_dir):
            return {**sent, "stopped": f"the watcher stopped while sending (its {NOTIFIER_LOG} says why)"}
        return sent
    return {"waiting": watcher_alive(rec.run_dir) or (not rec.state.terminal and "watcher gone: nothing will be sent")}


def describe(state: dict[str, object]) -> str:
    """One line of ``state_of``."""
    if "skipped" in state:
        return f"not sent: {state['skipped']}"
    if "waiting" in state:
        return "waiting for the job's end" if state["waiting"] is True else "the watcher is gone: nothing will be sent"
    if "stopped" in state:
        return f"not sent: {state['stopped']}"
    if "ended" not in state:
        return "being sent"
    parts = [f"command {state['command']}" if "command" in state else "", f"url {state['url']}" if "url" in state else ""]
    return ("sent: " if delivered(state) else "FAILED: ") + "; ".join(p for p in parts if p)


def delivered(state: dict[str, object]) -> bool:
    """Whether every part of an ended notification went through: the command exited 0, the URL
    answered 2xx."""
    import re

    return state.get("command", "exit 0") == "exit 0" and bool(re.fullmatch(r"HTTP 2\d\d", str(state.get("url", "HTTP 200"))))
