"""The kubernetes client, loaded lazily, and the translation of its errors into ddpjob's typed errors.

Only this module imports ``kubernetes`` (inside ``Kube.__init__``), so ``render``/``validate`` and
``--help`` never pay for it. Calls return plain JSON dicts (``_preload_content=False``) rather than
the client's generated models: the manifests we send are dicts, and dicts read back the same way
across client versions.

Error mapping (each with its own message; exit codes from ``launcher.core.errors``):

| what happened | error | exit |
| --- | --- | --- |
| no kubeconfig / unknown context / bad kubeconfig | ``KubeconfigMissing`` (TargetUnavailable) | 3 |
| (no kubeconfig, inside a pod: the pod's service account is used, see ``Kube``) | | |
| API server unreachable | ``ClusterUnreachable`` (TargetUnavailable) | 3 |
| 404 on create, or no ``pytorchjobs.kubeflow.org`` CRD: the operator is not installed | ``OperatorMissing`` (SchedulerComponentMissing) | 6 |
| 404 on create: the namespace does not exist | ``SubmitRejected`` | 3 |
| 403 | ``PermissionDenied`` on create, ``TargetError`` later | 5 (3 later) |
| 409 on create | ``AlreadyExists`` | 7 |
| 422 / 400 on create (dry run included) | ``InvalidObject``, the server's message and causes | 8 |
| anything else | ``TargetError`` with status and message | 3 |
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TypeVar, cast

from launcher.core import errors
from launcher.core.errors import SubmitRejected, TargetError, TargetUnavailable
from launcher.core.jsondata import JSONObject, arr, at, obj, text
from launcher.targets.k8s.objects.apis import PYTORCHJOB, KubeflowApi

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException
    from urllib3 import BaseHTTPResponse

OPERATOR_INSTALL = (
    'kubectl apply --server-side -k "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.4"'
)
TIMEOUT = 30.0
# Where the kubelet mounts a pod's service account (token, ca.crt, namespace): the in-cluster fallback.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# A training job silent for longer drops its log stream; the reader reconnects and skips what it has.
STREAM_READ_TIMEOUT = 300.0
T = TypeVar("T")


class KubeconfigMissing(TargetUnavailable):
    """No usable kubeconfig (file missing, context unknown, unreadable)."""


class ClusterUnreachable(TargetUnavailable):
    """The API server named in the kubeconfig did not answer."""


class OperatorMissing(errors.SchedulerComponentMissing):
    """The PyTorchJob CRD is not installed: the training operator is missing."""


class PermissionDenied(errors.PermissionDenied):
    """403: the user lacks RBAC permissions (k8s/rbac.yaml grants them)."""


class AlreadyExists(errors.AlreadyExists):
    """409: a PyTorchJob of that name exists in the namespace."""


class InvalidObject(errors.InvalidForScheduler):
    """422 (or 400): the API server rejected the object; its message says why.

    Attributes:
        name: the object's name; ``status``: e.g. ``422 Unprocessable Entity``; ``server``: the API
            server's own message.
        causes: ``(field, message)`` pairs from the Status' causes (and the fields a strict
            decoding error names), for mapping back to the spec.
    """

    def __init__(self, message: str, *, name: str = "", status: str = "", server: str = "",
                 causes: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.name = name
        self.status = status
        self.server = server
        self.causes = causes


def kubeconfig_paths() -> list[str]:
    """The kubeconfig files the client reads: $KUBECONFIG (a path list) or ~/.kube/config."""
    env = os.environ.get("KUBECONFIG")
    if env:
        return [p for p in env.split(os.pathsep) if p]
    return [os.path.expanduser("~/.kube/config")]


class Kube:
    """A connection to one cluster (a kubeconfig context) with the few calls the target needs.

    Without a kubeconfig file but inside a pod (``KUBERNETES_SERVICE_HOST`` set), the pod's
    service account is used (token, CA and namespace under ``SERVICE_ACCOUNT_DIR``).
    """

    def __init__(self, context: str | None = None, namespace: str | None = None, api: KubeflowApi = PYTORCHJOB) -> None:
        self.api = api  # which custom resource create/list/delete_job handle, and its pods' container
        try:
            from kubernetes import client, config
            from kubernetes.config.config_exception import ConfigException
        except ImportError as e:
            raise TargetUnavailable(
                "the k8s target needs the kubernetes client: pip install 'ddpjob[k8s]'"
            ) from e
        self.paths = kubeconfig_paths()
        where = f"kubeconfig {os.pathsep.join(self.paths)}" + (f", context {context!r}" if context else ", current context")
        in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ and not any(os.path.exists(p) for p in self.paths)
        try:
            if in_cluster:
                from kubernetes.config.incluster_config import InClusterConfigLoader

                where = f"pod's service account ({SERVICE_ACCOUNT_DIR})"
                cfg = client.Configuration()
                # kubernetes.config is unannotated: its calls are untyped.
                InClusterConfigLoader(token_filename=os.path.join(SERVICE_ACCOUNT_DIR, "token"),  # type: ignore[no-untyped-call]
                                      cert_filename=os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt")).load_and_set(cfg)
                self.api_client = client.ApiClient(cfg)
                self.context = "in-cluster"
                default_ns = _incluster_namespace()
            else:
                if not any(os.path.exists(p) for p in self.paths):
                    raise KubeconfigMissing(
                        f"no kubeconfig found (tried {', '.join(self.paths)}); set KUBECONFIG or create one "
                        "with your cluster's tools (e.g. `kind create cluster`, `gcloud container clusters get-credentials`)"
                    )
                config_file = self.paths[0] if len(self.paths) == 1 else None
                contexts, active = config.list_kube_config_contexts(config_file=config_file)  # type: ignore[no-untyped-call]  # kubernetes.config is unannotated
                chosen = active if context is None else next((c for c in contexts or [] if c.get("name") == context), None)
                if chosen is None:
                    names = ", ".join(sorted(c.get("name", "?") for c in contexts or [])) or "none"
                    raise KubeconfigMissing(f"context {context!r} is not in {where.split(',')[0]} (contexts: {names})")
                self.context = chosen.get("name", "")
                default_ns = (chosen.get("context") or {}).get("namespace") or "default"
                self.api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]  # kubernetes.config is unannotated
                    config_file=config_file, context=self.context)
        except KubeconfigMissing:
            raise
        except (ConfigException, OSError, ValueError, TypeError, KeyError) as e:
            raise KubeconfigMissing(f"cannot use the {where}: {e}") from e
        self.namespace = namespace or default_ns
        self.host = self.api_client.configuration.host
        self.where = f"{self.host} (context {self.context!r}, {where.split(',')[0]})"
        self.custom = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)

    # ------------------------------------------------------------------ PyTorchJobs
    def create_job(self, body: JSONObject, *, dry_run: bool = False) -> JSONObject:
        name = str(obj(body["metadata"])["name"])
        resp = self._call(
            lambda: self.custom.create_namespaced_custom_object(
                self.api.group, self.api.version, self.namespace, self.api.plural, body, dry_run="All" if dry_run else None,
                field_validation="Strict", _preload_content=False, _request_timeout=TIMEOUT,
            ),
            action="create", name=name,
        )
        return _json(resp)

    def list_jobs(self, selector: str) -> list[JSONObject]:
        resp = self._call(lambda: self.custom.list_namespaced_custom_object(
            self.api.group, self.api.version, self.namespace, self.api.plural, label_selector=selector, _preload_content=False,
            _request_timeout=TIMEOUT), action="list", name=selector)
        return _items(resp)

    def delete_job(self, name: str) -> bool:
        """Delete with foreground propagation (pods go first); False if it was already gone."""
        from kubernetes import client

        body = client.V1DeleteOptions(propagation_policy="Foreground")
        return self._maybe(lambda: self.custom.delete_namespaced_custom_object(
            self.api.group, self.api.version, self.namespace, self.api.plural, name, body=body, _preload_content=False,
            _request_timeout=TIMEOUT), "delete", name) is not None

    def read_crd(self, name: str) -> JSONObject | None:
        """The cluster's CustomResourceDefinition ``name``; None when it is not installed (404).

        Raises:
            PermissionDenied: 403 (CRDs are cluster-scoped: a namespaced Role cannot read them).
        """
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api = client.ApiextensionsV1Api(self.api_client)
        try:
            return _json(api.read_custom_resource_definition(name, _preload_content=False, _request_timeout=TIMEOUT))
        except ApiException as e:
            if e.status == 404:
                return None
            if e.status == 403:
                raise PermissionDenied(f"403 reading customresourcedefinitions/{name}: {server_message(e)}") from e
            _raise(e, "read", f"customresourcedefinitions/{name}", self)
        except Exception as e:  # noqa: BLE001 - network errors
            _raise_network(e, self)

    # ------------------------------------------------------------------ pods, logs, events
    def list_pods(self, selector: str) -> list[JSONObject]:
        resp = self._call(lambda: self.core.list_namespaced_pod(
            self.namespace, label_selector=selector, _preload_content=False, _request_timeout=TIMEOUT),
            action="list pods", name=selector)
        return _items(resp)

    def get_pod(self, name: str) -> JSONObject | None:
        return self._maybe(lambda: self.core.read_namespaced_pod(
            name, self.namespace, _preload_content=False, _request_timeout=TIMEOUT), "get pod", name)

    def pod_log(self, name: str, *, previous: bool = False, tail: int | None = None) -> bytes | None:
        """The whole log of the pod's training container (``pytorch``, or ``node`` for a TrainJob's pods),
        or its previous run's, or its last ``tail`` lines; None if there is none."""
        from kubernetes.client.exceptions import ApiException

        try:
            # The stubs say str; with _preload_content=False the client returns the raw urllib3 response.
            resp = cast("BaseHTTPResponse", self.core.read_namespaced_pod_log(
                name, self.namespace, container=self.api.container, previous=previous or None,
                tail_lines=tail, _preload_content=False, _request_timeout=TIMEOUT))
            return bytes(resp.data)
        except ApiException as e:
            if e.status in (400, 404):  # waiting to start, no previous container, pod gone
                return None
            _raise(e, "read logs of", name, self)
        except Exception as e:  # noqa: BLE001 - network errors
            _raise_network(e, self)

    def stream_log(self, name: str) -> BaseHTTPResponse | None:
        """An open ``follow=true`` log response (urllib3), or None if the container is not running yet."""
        from kubernetes.client.exceptions import ApiException

        try:
            return cast("BaseHTTPResponse", self.core.read_namespaced_pod_log(  # the stubs say str, as in pod_log
                name, self.namespace, container=self.api.container, follow=True, _preload_content=False,
                _request_timeout=(TIMEOUT, STREAM_READ_TIMEOUT)))
        except ApiException as e:
            if e.status in (400, 404):
                return None
            _raise(e, "stream logs of", name, self)
        except Exception as e:  # noqa: BLE001
            _raise_network(e, self)

    def pod_proxy(self, name: str, port: int, path: str) -> bytes | None:
        """GET ``path`` from ``port`` of pod ``name`` through the API server's pod proxy (RBAC: ``pods/proxy``
        get); None when nothing answers there (the pod is gone, or its server is not up yet: 404, 502, 503)."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = cast("BaseHTTPResponse", self.core.connect_get_namespaced_pod_proxy_with_path(
                f"{name}:{port}", self.namespace, path.lstrip("/"), _preload_content=False, _request_timeout=TIMEOUT))
            return bytes(resp.data)
        except ApiException as e:
            if e.status in (404, 502, 503):
                return None
            _raise(e, "get", f"pods/{name}:{port}/proxy/{path.lstrip('/')}", self)
        except Exception as e:  # noqa: BLE001 - network errors
            _raise_network(e, self)

    def pod_events(self, pod: str) -> list[JSONObject]:
        resp = self._call(lambda: self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={pod}", _preload_content=False,
            _request_timeout=TIMEOUT), action="list events of", name=pod)
        return _items(resp)

    # ------------------------------------------------------------------ plumbing
    def _call(self, fn: Callable[[], T], *, action: str, name: str) -> T:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn()
        except ApiException as e:
            _raise(e, action, name, self)
        except Exception as e:  # noqa: BLE001 - urllib3/socket errors: translated, cause kept
            _raise_network(e, self)

    def _maybe(self, fn: Callable[[], object], action: str, name: str) -> JSONObject | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return _json(fn())
        except ApiException as e:
            if e.status == 404 and _is_object_404(e):
                return None
            _raise(e, action, name, self)
        except Exception as e:  # noqa: BLE001
            _raise_network(e, self)


def _json(resp: object) -> JSONObject:
    data: object = getattr(resp, "data", resp)
    return obj(json.loads(data.decode("utf-8") or "{}") if isinstance(data, (bytes, bytearray)) else data)


def _items(resp: object) -> list[JSONObject]:  # a list call's objects
    return [item for item in arr(_json(resp).get("items")) if isinstance(item, dict)]


def _incluster_namespace() -> str:
    try:
        with open(os.path.join(SERVICE_ACCOUNT_DIR, "namespace"), encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def _status(e: ApiException) -> JSONObject:
    try:
        return obj(json.loads(e.body) if e.body else {})
    except (TypeError, ValueError):
        return {}


def _is_object_404(e: ApiException) -> bool:
    """A 404 about the object itself (a Status naming it), not a missing API (plain '404 page not found')."""
    st = _status(e)
    return st.get("kind") == "Status" and bool(at(st, "details", "name")) and at(st, "details", "kind") != "namespaces"


def server_message(e: ApiException) -> str:
    """The API server's own words: the Status message plus its causes, else the raw body."""
    st = _status(e)
    msg = text(st.get("message")) or (e.body or "").strip() or e.reason or f"HTTP {e.status}"
    causes = arr(at(st, "details", "causes"))
    extra = [f"{c.get('field', '')}: {c.get('message', '')}".strip(": ") for c in causes if isinstance(c, dict)]
    extra = [x for x in extra if x and x not in msg]
    return msg + ("".join(f"\n  - {x}" for x in extra) if extra else "")


def server_causes(e: ApiException) -> tuple[tuple[str, str], ...]:
    """``(field, message)`` of each cause the API server gave, plus the fields of a strict
    decoding error (``unknown field "spec.x"``, a 400 without causes)."""
    st = _status(e)
    out = [(str(c.get("field") or ""), str(c.get("message") or c.get("reason") or ""))
           for c in arr(at(st, "details", "causes")) if isinstance(c, dict)]
    for m in re.finditer(r'(unknown|duplicate) field "([^"]+)"', str(st.get("message") or "")):
        out.append((m.group(2), f"{m.group(1)} field"))
    return tuple(out)


def operator_missing(host: str, api: KubeflowApi = PYTORCHJOB) -> OperatorMissing:
    if api is not PYTORCHJOB:
        return OperatorMissing(
            f"the cluster {host} has no {api.kind} API ({api.api_version} {api.plural}; 404): {api.controller} "
            f"is not installed. Install v2.3 (with its torch-distributed runtime):\n  {api.install}\n"
            "  (see k8s/README.md: ddpjob docs k8s/README.md prints it)"
        )
    return OperatorMissing(
        f"the cluster {host} has no PyTorchJob API (kubeflow.org/v1 pytorchjobs; 404): the Kubeflow "
        f"training operator is not installed. Install v1.9.x:\n  {OPERATOR_INSTALL}\n"
        "  (see k8s/README.md: ddpjob docs k8s/README.md prints it)"
    )


def _raise(e: ApiException, action: str, name: str, kube: Kube) -> NoReturn:
    status = e.status
    msg = server_message(e)
    creating = action == "create"
    if status == 401:
        raise KubeconfigMissing(
            f"the API server {kube.where} refused our credentials (401 Unauthorized): {msg}; "
            "refresh the kubeconfig's credentials"
        ) from e
    if status == 403 and creating and "admission webhook" in msg:
        # Trainer v2's validating webhook answers 403 Forbidden: a verdict on the object, not on RBAC.
        raise InvalidObject(f"an admission webhook refused {kube.api.kind} {name!r} ({status} {e.reason}): {msg}",
                            name=name, status=f"{status} {e.reason}", server=msg, causes=server_causes(e)) from e
    if status == 403:
        err: type[SubmitRejected | TargetError] = PermissionDenied if creating else TargetError
        raise err(
            f"permission denied (403) to {action} {name} in namespace {kube.namespace!r}: {msg}\n"
            f"  fix: ask an admin to apply k8s/rbac.yaml in that namespace (it grants {kube.api.plural}, pods, pods/log, pods/proxy, events; "
            "ddpjob docs k8s/rbac.yaml prints it)"
        ) from e
    if status == 404 and creating and (at(_status(e), "details", "kind") == "namespaces" or 'namespaces "' in msg):
        raise SubmitRejected(f"namespace {kube.namespace!r} does not exist on {kube.host}: {msg}; "
                             "set k8s.namespace (or create it: kubectl create namespace NAME)") from e
    if status == 404 and (creating or not _is_object_404(e)):
        raise operator_missing(kube.host, kube.api) from e
    if status == 409 and creating:
        raise AlreadyExists(
            f"a {kube.api.kind} named {name!r} already exists in namespace {kube.namespace!r} (409): {msg}; "
            f"submit again for a new id, or delete the old one: kubectl delete {kube.api.kind.lower()} {name} -n {kube.namespace}"
        ) from e
    if status in (400, 422) and creating:
        raise InvalidObject(f"the API server rejected {kube.api.kind} {name!r} ({status} {e.reason}): {msg}", name=name,
                            status=f"{status} {e.reason}", server=msg, causes=server_causes(e)) from e
    err = SubmitRejected if creating else TargetError
    raise err(f"could not {action} {name} on {kube.host} ({status} {e.reason}): {msg}") from e


def _raise_network(e: Exception, kube: Kube) -> NoReturn:
    import urllib3

    if isinstance(e, (urllib3.exceptions.HTTPError, OSError)):
        raise ClusterUnreachable(f"cannot reach the Kubernetes API server {kube.where}: {type(e).__name__}: {e}") from e
    raise e
