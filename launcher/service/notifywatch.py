"""The watcher ``submit`` starts for a job with ``notify:`` (``service/notifier.py`` says how it
works): it waits for the job's end through the service, then has the notification sent. Apart
from ``notifier`` so that the service, which starts it, and the watcher, which uses the service,
import each other in one direction only."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from launcher.service import notifier


def main(argv: list[str]) -> int:
    """Never dies with a traceback: anything unforeseen is one line in the log, the URL's path
    scrubbed (the log is no place for a webhook's secret), and ``status`` tells of the stop
    (``notifier.state_of``)."""
    settings = os.environ.pop(notifier.NOTIFY_ENV, "")
    try:
        return watch(argv, settings)
    except Exception as e:  # noqa: BLE001 - the last line of defence: said, in one line
        url = ""
        try:
            from launcher.spec.notify import NotifyOptions

            url = NotifyOptions.model_validate_json(settings).url or ""
        except Exception:  # noqa: BLE001, S110 - the settings themselves are unreadable: no URL to scrub
            pass
        text = notifier.scrub(f"{type(e).__name__}: {e}", url) if url else type(e).__name__
        print(f"{time.strftime('%H:%M:%S')} notifier: stopped: {text}", flush=True)
        return 1


def watch(argv: list[str], settings: str) -> int:
    from launcher.core.errors import JobNotFound
    from launcher.service.jobs import Jobs
    from launcher.service.registry import Registry
    from launcher.spec.notify import NotifyOptions

    home, job_id = argv
    options = NotifyOptions.model_validate_json(settings)
    jobs = Jobs(Registry(Path(home)))
    while True:
        try:
            rec = jobs.wait(job_id)
            break
        except JobNotFound:  # removed (ddpjob rm): nothing to say
            return 0
        except Exception as e:  # noqa: BLE001 - a scheduler that is briefly unreachable: ask again later
            print(f"{time.strftime('%H:%M:%S')} notifier: cannot read the job's state yet: {e}", flush=True)
            time.sleep(30)
    result = notifier.deliver(rec, options)
    print(f"{time.strftime('%H:%M:%S')} notifier: {rec.id} {rec.state.value}: {result or 'already notified'}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
