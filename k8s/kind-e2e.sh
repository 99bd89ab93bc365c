#!/usr/bin/env bash
# End-to-end on a throwaway kind cluster: create it, install the Kubeflow training operator v1.9.4,
# build and load the training image, run the quickstart job with ddpjob, follow its logs, delete.
#
#   k8s/kind-e2e.sh            # needs: docker (or podman via KIND_EXPERIMENTAL_PROVIDER), kind, kubectl,
#                              #        and ddpjob installed with the k8s extra (pip install -e '.[k8s]')
#   KEEP=1 k8s/kind-e2e.sh     # keep the cluster afterwards
#
# Not run in this repository's CI or on the machine it was written on (no container engine there);
# the same path is exercised offline by tests/k8s against a loopback API server.
set -euo pipefail

CLUSTER=${CLUSTER:-ddpjob-e2e}
OPERATOR_REF=${OPERATOR_REF:-v1.9.4}
IMAGE=${IMAGE:-ddpjob-train:e2e}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export KUBECONFIG=${KUBECONFIG_E2E:-$ROOT/.kind-e2e.kubeconfig}
export DDPJOB_HOME=${DDPJOB_HOME:-$ROOT/.kind-e2e-home}

for tool in docker kind kubectl ddpjob; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is required" >&2; exit 2; }
done

cleanup() {
  if [[ -z "${KEEP:-}" ]]; then
    kind delete cluster --name "$CLUSTER" || true
    rm -f "$KUBECONFIG"
  else
    echo "kind-e2e: kept cluster $CLUSTER (KUBECONFIG=$KUBECONFIG)"
  fi
}
trap cleanup EXIT

echo "== kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" --wait 120s

echo "== training operator $OPERATOR_REF"
kubectl apply --server-side -k "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=$OPERATOR_REF"
kubectl -n kubeflow rollout status deployment/training-operator --timeout=300s
kubectl wait --for=condition=Established crd/pytorchjobs.kubeflow.org --timeout=60s

echo "== image $IMAGE"
docker build -f "$ROOT/docker/Dockerfile" -t "$IMAGE" "$ROOT"
kind load docker-image "$IMAGE" --name "$CLUSTER"

echo "== checks: client side, then the API server's (dryRun=All)"
ddpjob validate "$ROOT/jobs/quickstart.yaml" --target k8s
ddpjob submit "$ROOT/jobs/quickstart.yaml" --target k8s --set image="$IMAGE" \
  --set k8s.image_pull_policy=Never --dry-run=server >/dev/null

echo "== quickstart: 2 pods (Master + Worker), followed to the end"
ddpjob submit "$ROOT/jobs/quickstart.yaml" --target k8s --nodes 2 --set image="$IMAGE" \
  --set k8s.image_pull_policy=Never -f
JOB=$(ddpjob list --target k8s --limit 1 -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')
ddpjob status "$JOB"
kubectl get pytorchjobs,pods -l ddpjob/job-id="$JOB" -o wide || true

echo "== logs after deleting the job (served from $DDPJOB_HOME/runs/$JOB/pods)"
kubectl delete pytorchjob "$JOB" --wait=true
ddpjob logs "$JOB" | tail -n 5
echo "kind-e2e: OK"
