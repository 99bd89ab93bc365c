"""Where every rank of a Kubernetes run is (issue 44): each pod's runner (``podrun``) serves, on
``DDPJOB_WATCH_PORT`` (``serve``), GET ``/stacks.json``: its own ranks (the last vitals sample's)
read now by py-spy in the pod (``answer``), in the per-node form of Slurm's runners (``stackshare``):
``{"node", "host", "ranks": [RankStack...]}``. ``ddpjob stacks`` asks every pod through the API
server's pod proxy (``cluster/stacks.py``), as ``status`` reads the first pod's ``watch.json`` (served
here too); when the first pod's watch names a stall, it asks every pod once over the pod network
(``where``: each beacon's address as the watch heard it, and the port its runner serves, sent with its
vitals as ``PORT_KEY``) and the verdict says where the stuck rank stopped.

Standard library only, and no other module of ddpjob at the top: the pod runner's bundle
(``objects/runner.py``) carries it with ``shared/stacks.py`` and ``shared/stackshare.py``, which it finds
through the runner core's ``jobcore.Bundled``.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from launcher.core.jsondata import JSONObject
    from launcher.targets.shared import runfolder, stacks, stackshare, vitals
else:
    # The bundle's copies in a pod (``ddpjob_<name>``), else the package's: typed through the imports above, each
    # loaded at its first use (``jobcore.Bundled``; the bundle loads the core before this module).
    _core = sys.modules.get("ddpjob_jobcore") or importlib.import_module("launcher.targets.shared.jobcore")
    runfolder, stacks, stackshare, vitals = (_core.Bundled(n) for n in ("runfolder", "stacks", "stackshare", "vitals"))

PORT_KEY = "stacks_port"  # in a beacon's vitals: the port its runner serves /stacks.json on
ASK_TIMEOUT_S = 25.0  # a pod reads its ranks at once (py-spy: stacks.DUMP_TIMEOUT_S at most, twice for a stopped one)
NOT_IN_IMAGE = ("py-spy is not installed in the pod's image: add it to the image (RUN pip install py-spy in its "
                "Dockerfile, or pip install 'ddpjob[stacks]'; ddpjob's own training image has it), or set DDPJOB_PY_SPY "
                "to a py-spy binary there")
PTRACE_HINT = (" (Kubernetes: the pod's container needs the SYS_PTRACE capability, securityContext.capabilities.add, "
               "or nodes with kernel.yama.ptrace_scope 0)")


def answer(node: int, host: str, live: Sequence[Mapping[str, object]]) -> JSONObject:
    """This pod's ranks (``live``: the last vitals sample's, ``vitals.Sampler.live``), each read now by
    py-spy; where py-spy is not in the image, each says so and how to get it."""
    # The sample's ranks as it holds them (ints, or None), passed on unchanged.
    ranks = [stacks.RankStack(node=node, rank=cast("int | None", r.get("rank")), local_rank=cast("int | None", r.get("local_rank")),
                              pid=int(pid), host=host) for r in live if isinstance(pid := r.get("pid"), int)]
    changed = [r for r in ranks if vitals.ranks_of(r.pid)[0] != r.rank]  # as the local target checks
    for r in changed:
        r.error = "its process is gone or changed since the last sample (the rank restarted?): ask again"
    py_spy = stacks.find_py_spy()
    if py_spy is None:
        for r in ranks:
            r.error = r.error or NOT_IN_IMAGE
    else:
        ranks = [*stacks.dump_all(py_spy, [r for r in ranks if r not in changed]), *changed]
        for r in ranks:
            if r.error and "(ptrace)" in r.error:
                r.error += PTRACE_HINT
    return {"node": node, "host": host, "py_spy": py_spy is not None, "ranks": [asdict(r) for r in ranks]}


def serve(port: int, watch_file: str, own: Callable[[], JSONObject],
          say: Callable[[str], None]) -> ThreadingHTTPServer | None:
    """Serve on ``port`` (every interface: the API server's pod proxy and the other pods reach it) GET
    ``watch.json`` (``watch_file``: the first pod's watch writes it; the others have none: 404) and
    ``stacks.json`` (``own()``: this pod's ranks read now). None where ``port`` is 0 or taken."""
    if not port:
        return None
    watch_path, stacks_path = runfolder.WATCH_URL_PATH, runfolder.STACKS_URL_PATH

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == stacks_path:
                try:
                    data, code = json.dumps(own()).encode(), 200
                except Exception as exc:  # noqa: BLE001 - said to the one who asked; the runner goes on
                    data, code = json.dumps({"error": f"this pod's ranks could not be read: {exc}"}).encode(), 500
            elif path == watch_path:
                try:
                    with open(watch_file, "rb") as f:
                        data, code = f.read(), 200
                except OSError:
                    data, code = b'{"error": "no ' + watch_path[1:].encode() + b' yet"}', 404
            else:
                data, code = b'{"error": "not found"}', 404
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    try:
        server = ThreadingHTTPServer(("", port), Handler)
    except OSError as exc:
        say(f"stall watch and stacks not served: TCP port {port} ({exc}); status and ddpjob stacks cannot read them")
        return None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="ddpjob-http", daemon=True).start()
    return server


def where(node: int, own: Callable[[], JSONObject], port: int,
          keep: str | None = None) -> Callable[[Mapping[str, object], Sequence[Mapping[str, object]]], str | None]:
    """``heartbeat.Watch``'s ``where`` on the first pod (node ``node``): its own ranks read here (``own``),
    every other pod's asked over the pod network at the address its heartbeats come from and the port
    its vitals name (else ``port``), all at once; kept in ``keep`` (``stacks.json``), the one line
    ``stacks.summary`` returned, with the pods that did not answer named."""
    def placed(verdict: Mapping[str, object], nodes: Sequence[Mapping[str, object]]) -> str | None:
        def one(rec: Mapping[str, object]) -> JSONObject | None:
            return own() if rec.get("node") == node else ask(rec, port)

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes)))) as pool:
            answers = list(pool.map(one, nodes))
        ranks = [stackshare.rank_stack(r) for a in answers if isinstance(a, dict)
                 for r in _ranks(a.get("ranks")) if isinstance(r, dict)]
        silent = [str(rec.get("node")) for rec, a in zip(nodes, answers, strict=True) if not isinstance(a, dict)]
        note = (f"node(s) {', '.join(silent)} did not answer (their pod's runner is gone, or the pod network "
                "drops TCP to its port)") if silent else None
        found = stacks.JobStacks(task=0, ranks=ranks, note=note)
        stacks.save(keep, verdict, found)
        line = stacks.summary(ranks, cast("int | None", verdict.get("rank")) if verdict.get("kind") == "stuck" else None)
        return "; ".join(x for x in (line, note) if x) or None
    return placed


def _ranks(said: object) -> list[object]:
    """An answer's ``ranks``, a list (else none)."""
    return said if isinstance(said, list) else []


def ask(rec: Mapping[str, object], port: int, timeout: float = ASK_TIMEOUT_S) -> JSONObject | None:
    """Another pod's ``stacks.json``, from the watch's record of that node (its ``address``, the port in
    its vitals); None when it cannot be asked or does not answer."""
    addr = rec.get("address")
    vitals = rec.get("vitals")
    served = vitals.get(PORT_KEY) if isinstance(vitals, dict) and isinstance(vitals.get(PORT_KEY), int) else port
    if not addr or not served:
        return None
    host = f"[{addr}]" if ":" in str(addr) else str(addr)
    try:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the pod's HTTP_PROXY is not the way
        with opener.open(f"http://{host}:{served}{runfolder.STACKS_URL_PATH}", timeout=timeout) as resp:
            data: object = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("node") == rec.get("node") else None  # that pod's, no other's
