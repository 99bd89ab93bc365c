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
    from launcher.service.jobs import Jobs
    from launcher.service.registry import Registry
    from launcher.spec.notify import NotifyOptions

    home, job_id = argv
    options = NotifyOptions.model_validate_json(os.environ.pop(notifier.NOTIFY_ENV))
    from launcher.core.errors import JobNotFound

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
