#!/usr/bin/env bash
# End-to-end on a throwaway kind cluster: create it with a local image registry, install the Kubeflow
# training operator v1.9.4, build and load the training image, run the quickstart job with ddpjob,
# follow its logs, delete; then `build:` (ddpjob builds the image + a working directory, pushes it to
# the registry and the PyTorchJob runs it by digest; unchanged files push nothing, a changed file gives
# a new digest) and, with helm, the same build: as a Trainer v2.3 TrainJob.
#
#   k8s/kind-e2e.sh            # needs: docker (or podman via KIND_EXPERIMENTAL_PROVIDER), kind, kubectl,
#                              #        and ddpjob installed with the k8s extra (pip install -e '.[k8s]');
#                              #        helm for the TrainJob part (skipped without it, or with TRAINJOB=0)
#   KEEP=1 k8s/kind-e2e.sh     # keep the cluster (and its registry) afterwards
#
# Not run in this repository's CI or on the machine it was written on (no kind, no docker daemon);
# the same paths are exercised offline by tests/k8s and tests/imagebuild against a loopback API server
# and a real registry on 127.0.0.1.
set -euo pipefail

CLUSTER=${CLUSTER:-ddpjob-e2e}
OPERATOR_REF=${OPERATOR_REF:-v1.9.4}
IMAGE=${IMAGE:-ddpjob-train:e2e}
REG_NAME=${REG_NAME:-ddpjob-e2e-registry}
REG_PORT=${REG_PORT:-5001}
REG=localhost:$REG_PORT
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export KUBECONFIG=${KUBECONFIG_E2E:-$ROOT/.kind-e2e.kubeconfig}
export DDPJOB_HOME=${DDPJOB_HOME:-$ROOT/.kind-e2e-home}
WORK=$(mktemp -d)

for tool in docker kind kubectl ddpjob; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is required" >&2; exit 2; }
done

cleanup() {
  rm -rf "$WORK"
  if [[ -z "${KEEP:-}" ]]; then
    kind delete cluster --name "$CLUSTER" || true
    docker rm -f "$REG_NAME" >/dev/null 2>&1 || true
    rm -f "$KUBECONFIG"
  else
    echo "kind-e2e: kept cluster $CLUSTER (KUBECONFIG=$KUBECONFIG) and registry $REG_NAME ($REG)"
  fi
}
trap cleanup EXIT

latest_job() {
  ddpjob list --target k8s --limit 1 -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])'
}

echo "== registry $REG_NAME on $REG, and kind cluster $CLUSTER whose nodes pull from it"
# kind's documented local registry: each node's containerd maps localhost:$REG_PORT to the registry's
# container on the kind network. It speaks plain HTTP, so the spec's build: says insecure: true
# (docker itself treats localhost registries as insecure).
docker run -d --restart=always -p "127.0.0.1:$REG_PORT:5000" --name "$REG_NAME" registry:2 >/dev/null
printf '%s\n' 'kind: Cluster' 'apiVersion: kind.x-k8s.io/v1alpha4' 'containerdConfigPatches:' '- |-' \
  '  [plugins."io.containerd.grpc.v1.cri".registry]' '    config_path = "/etc/containerd/certs.d"' \
  > "$WORK/kind.yaml"
kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" --wait 120s --config "$WORK/kind.yaml"
for node in $(kind get nodes --name "$CLUSTER"); do
  docker exec "$node" mkdir -p "/etc/containerd/certs.d/$REG"
  printf '[host."http://%s:5000"]\n' "$REG_NAME" | docker exec -i "$node" cp /dev/stdin "/etc/containerd/certs.d/$REG/hosts.toml"
done
docker network connect kind "$REG_NAME" 2>/dev/null || true

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
JOB=$(latest_job)
ddpjob status "$JOB"
kubectl get pytorchjobs,pods -l ddpjob/job-id="$JOB" -o wide || true

echo "== logs after deleting the job (served from $DDPJOB_HOME/runs/$JOB/pods)"
kubectl delete pytorchjob "$JOB" --wait=true
ddpjob logs "$JOB" | tail -n 5

echo "== build: the training image + a working directory, pushed to $REG, run by digest"
docker tag "$IMAGE" "$REG/ddpjob/base:e2e"
docker push -q "$REG/ddpjob/base:e2e" >/dev/null  # the base, where the nodes can pull it
mkdir "$WORK/proj"
printf '%s\n' 'import os' \
  'print(f"working-directory file ran: rank {os.environ.get(\"RANK\")} in {os.getcwd()}", flush=True)' \
  > "$WORK/proj/hello.py"
printf '%s\n' 'name: e2e-build' "image: $REG/ddpjob/base:e2e" 'command: [python, hello.py]' 'nodes: 2' \
  'procs_per_node: 1' "build: {registry: $REG/ddpjob/e2e, engine: docker, insecure: true}" > "$WORK/proj/job.yaml"
cd "$WORK/proj"
ddpjob render job.yaml --target k8s | grep 'is not in the registry yet'   # render never builds
ddpjob submit job.yaml --target k8s -f | tee "$WORK/out.log"
grep -q "working-directory file ran: rank 1" "$WORK/out.log"
JOB=$(latest_job)
PINNED=$(kubectl get pytorchjob "$JOB" -o jsonpath='{.spec.pytorchReplicaSpecs.Master.template.spec.containers[0].image}')
echo "pinned: $PINNED"
[[ "$PINNED" == "$REG/ddpjob/e2e@sha256:"* ]] || { echo "kind-e2e: not pinned by digest: $PINNED" >&2; exit 1; }
ddpjob build job.yaml 2>&1 | grep 'nothing built or pushed'                # unchanged files
[[ "$(ddpjob build -q job.yaml)" == "$PINNED" ]]
echo "# changed" >> hello.py
[[ "$(ddpjob build -q job.yaml)" != "$PINNED" ]] || { echo "kind-e2e: a changed file kept the digest" >&2; exit 1; }

if [[ "${TRAINJOB:-1}" != 0 ]] && command -v helm >/dev/null; then
  echo "== Trainer v2.3 (helm), and the same build: as a TrainJob"
  helm install kubeflow-trainer oci://ghcr.io/kubeflow/charts/kubeflow-trainer --version 2.3.0 \
    --namespace kubeflow-system --create-namespace --set runtimes.torchDistributed.enabled=true --wait
  kubectl wait --for=condition=Established crd/trainjobs.trainer.kubeflow.org --timeout=120s
  ddpjob submit job.yaml --target k8s --set k8s.api=trainjob -f | tee "$WORK/tj.log"
  grep -q "working-directory file ran: rank 1" "$WORK/tj.log"
  JOB=$(latest_job)
  kubectl get trainjob "$JOB" -o jsonpath='{.spec.trainer.image}' | grep "@sha256:"
else
  echo "== TrainJob part skipped (needs helm; TRAINJOB=0 skips it on purpose)"
fi
echo "kind-e2e: OK"
