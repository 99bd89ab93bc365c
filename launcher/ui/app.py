"""The dashboard as a Starlette application: the pages, their live parts, cancel and the assets.

Routes (every one needs the token, see ``launcher.ui.guard``)::

    GET  /                      the jobs table       GET /live/jobs            its live part
    GET  /jobs/{id}[?task=I]    one job              GET /jobs/{id}/live       its live part
    GET  /jobs/{id}/log?node=N[&task=I]  a node's whole log
    GET  /compare?id=A&id=B...  the runs of several jobs side by side
    POST /jobs/{id}/cancel      cancel, then back to the job page (a GET is 405)

The jobs table takes a filter in its query (``state``, ``target``, ``name``), and so does its live part.
    GET  /static/app.js, /static/style.css

The endpoints are plain functions: Starlette runs them in its thread pool, so the service's blocking
calls (SQLite, a scheduler's status) never hold up the server's event loop.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from launcher.core.errors import DdpjobError, JobNotFound
from launcher.targets.base import LogFilter
from launcher.ui import assets, comparepage, pages, view
from launcher.ui.guard import Guard

if TYPE_CHECKING:
    from launcher.service.jobs import Jobs

MAX_COMPARED = 20  # jobs one compare view reads (each is a status query and its metrics files)


def create_app(jobs: Jobs, token: str, hosts: frozenset[str] | None, port: int) -> Starlette:
    """The dashboard over ``jobs`` (the service), answering only requests with ``token`` and a Host
    header in ``hosts`` (None: see ``guard.allowed``) for the server's ``port``."""
    home = str(jobs.registry.home)

    def task_param(request: Request) -> int | None:
        value = request.query_params.get("task", "")
        return int(value) if value.isdigit() and len(value) < 7 else None

    def error_page(status: int, title: str, message: str) -> HTMLResponse:
        body = f"<h1>{escape(title)}</h1><p>{escape(message)}</p><p><a href=\"{pages.url('/', token)}\">All jobs</a></p>"
        return HTMLResponse(pages.page(f"ddpjob: {title}", body, token, home), status_code=status)

    def job_filter(request: Request) -> view.JobFilter:
        q = request.query_params
        return view.JobFilter(q.get("state", "")[:20], q.get("target", "")[:20], q.get("name", "")[:200])

    def index(request: Request) -> Response:
        flt = job_filter(request)
        table = pages.jobs_table(view.job_rows(jobs, flt=flt), token, filtered=flt.active)
        return HTMLResponse(pages.jobs_page(token, home, table, flt))

    def live_jobs(request: Request) -> Response:
        flt = job_filter(request)
        return HTMLResponse(pages.jobs_table(view.job_rows(jobs, flt=flt), token, filtered=flt.active))

    def compare(request: Request) -> Response:
        ids = [i for i in request.query_params.getlist("id") if i.strip()][:MAX_COMPARED]
        cmp = view.compare_view(jobs, ids) if ids else None
        return HTMLResponse(comparepage.compare_page(cmp, token, home))

    def whole_log(request: Request) -> Response:
        rec = jobs.get(request.path_params["job_id"])
        node = request.query_params.get("node", "0")
        if not node.isdigit() or len(node) > 6:
            return error_page(400, "no such node", f"node={node!r}: give a node number (node=0 is the first)")
        task = task_param(request)
        lines = jobs.logs(rec.id, LogFilter(task=task, node=int(node)), follow=False)
        return StreamingResponse(pages.whole_log(rec.id, int(node), task, lines, token, home),
                                 media_type="text/html; charset=utf-8")

    def job(request: Request) -> Response:
        chosen = task_param(request)
        v = view.job_view(jobs, request.path_params["job_id"], chosen)
        return HTMLResponse(pages.job_page(v, token, home, pages.job_live(v, token), view.spec_text(v.rec),
                                           view.plan_text(v.rec), chosen))

    def job_live(request: Request) -> Response:
        v = view.job_view(jobs, request.path_params["job_id"], task_param(request))
        return HTMLResponse(pages.job_live(v, token))

    def cancel(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        rec = jobs.get(job_id)
        try:
            jobs.cancel(rec.id)
        except JobNotFound:
            raise
        except DdpjobError as e:
            return error_page(409, f"{rec.id} was not cancelled", str(e))
        # 303: the browser follows with a GET, so a reload of the page does not post again.
        return RedirectResponse(pages.link(pages.job_path(rec.id), token), status_code=303)

    def script(request: Request) -> Response:
        return Response(assets.SCRIPT, media_type="text/javascript")

    def style(request: Request) -> Response:
        return Response(assets.STYLE, media_type="text/css")

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_page(404, "not found", str(exc) if isinstance(exc, JobNotFound) else "no such page")

    routes = [
        Route("/", index), Route("/live/jobs", live_jobs),
        Route("/jobs/{job_id}", job), Route("/jobs/{job_id}/live", job_live), Route("/jobs/{job_id}/log", whole_log),
        Route("/compare", compare),
        Route("/jobs/{job_id}/cancel", cancel, methods=["POST"]),
        Route("/static/app.js", script), Route("/static/style.css", style),
    ]
    return Starlette(routes=routes, middleware=[Middleware(Guard, token=token, hosts=hosts, port=port)],
                     exception_handlers={JobNotFound: not_found, 404: not_found})
