#!/usr/bin/env bash
# The GPU check docs/performance.md's "On a GPU" figures come from: run on a machine with NVIDIA GPU(s) where
# `ddpjob` and torch are installed, from the repository's root. Each step is bounded; a step that
# fails is reported and the next one runs. Prints the figures; writes the logs under $OUT (default
# /tmp/ddpjob-gpu-check).
#
#   bash tests/bench/gpu_check.sh [STEPS]      # STEPS: env,doctor,quickstart,resnet,dup (default all)
#
#   doctor      `ddpjob doctor --nodes 1` (one rank per GPU: NCCL) and the default 2 nodes (on a
#               1-GPU machine they share it: gloo, and the verdict says NCCL was not checked)
#   quickstart  README command 1 (2 nodes) and the same on 1 node
#   resnet      ResNet-18, synthetic CIFAR-shaped data, --amp bf16, batch 256 per process:
#               images/s (global, median of the logged windows after the first two) for 1 process and
#               for 2 (one per GPU where there are 2, else 2 sharing one GPU over gloo)
#   dup         two ranks on one GPU with NCCL, by hand: what NCCL says (why ddpjob uses gloo then)
#   top         `ddpjob top ID --once` (text and -o json) of a running ResNet-18 job, one rank per GPU:
#               the GPU, GPU% and GPU MEM columns filled from nvidia-smi (issue 34's GPU check); and
#               that the UUID the trainer reports (what names a rank's GPU inside a container, where
#               nvidia-smi lists the host's pids) is one nvidia-smi lists
set -u
OUT=${OUT:-/tmp/ddpjob-gpu-check}
STEPS=${1:-env,doctor,quickstart,resnet,dup,top}
mkdir -p "$OUT"
export DDPJOB_HOME=${DDPJOB_HOME:-$(mktemp -d)} DDPJOB_CONFIG=none PYTHONUNBUFFERED=1
DDPJOB=${DDPJOB:-ddpjob}
want() { [[ ",$STEPS," == *",$1,"* ]]; }
step() {  # step NAME LIMIT_S CMD...: run, log to $OUT/NAME.log, print its tail and its exit code and time
  local name=$1 limit=$2 t0 rc; shift 2
  t0=$(date +%s%N)
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1; rc=$?
  echo "== $name: exit $rc in $(( ($(date +%s%N) - t0) / 1000000 )) ms: $*"
  tail -n "${TAIL:-25}" "$OUT/$name.log"
}
job_id() { grep -o 'Submitted [^ ]*' "$OUT/$1.log" | head -1 | cut -d' ' -f2; }
rate() {  # rate STEP: median images/s of the job's logged windows after the first two
  python3 - "$DDPJOB_HOME/runs/$(job_id "$1")" <<'EOF'
import json, pathlib, statistics, sys
files = sorted(pathlib.Path(sys.argv[1]).rglob("metrics.jsonl"))
rows = [json.loads(line) for f in files for line in f.read_text().splitlines() if line.startswith("{")]
rates = [r["samples_per_s"] for r in rows if r.get("samples_per_s") and "eval_loss" not in r][2:]
print(f"images/s median {statistics.median(rates):.0f} over {len(rates)} windows (min {min(rates):.0f}, "
      f"max {max(rates):.0f}), world size {max(r.get('world_size') or 0 for r in rows)}" if rates else "no windows logged")
EOF
}

if want env; then
  nvidia-smi -L
  python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL",
    ".".join(map(str, torch.cuda.nccl.version())), "GPUs", torch.cuda.device_count())'
  $DDPJOB --version
fi
GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if want doctor; then
  step doctor-1node 150 $DDPJOB doctor --nodes 1
  step doctor-default 150 $DDPJOB doctor
fi
if want quickstart; then
  TAIL=6 step quickstart-2nodes 180 $DDPJOB submit jobs/quickstart.yaml --target local --nodes 2 -f
  TAIL=6 step quickstart-1node 180 $DDPJOB submit jobs/quickstart.yaml --target local --nodes 1 -f
fi
if want resnet; then
  train=(python -m launcher.train --dataset synthetic --model resnet18 --amp bf16 --batch-size 256
         --eval-size 512 --epochs 1 --log-every 20 --lr 0.1)
  TAIL=4 step resnet-1proc 240 $DDPJOB submit --name resnet18-1 --nodes 1 -p 1 -f -- "${train[@]}" --train-size 76800
  rate resnet-1proc
  if [ "$GPUS" -ge 2 ]; then what="2 GPUs, nccl"; else what="2 processes sharing 1 GPU, gloo"; fi
  TAIL=4 step resnet-2proc 240 $DDPJOB submit --name resnet18-2 --nodes 1 -p 2 -f -- "${train[@]}" --train-size 153600
  echo "($what)"; rate resnet-2proc
fi
if want dup; then
  cat >"$OUT/dup.py" <<'EOF'
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl")
t = torch.ones(1, device="cuda:0")
dist.all_reduce(t)
print("all_reduce ok", t.item())
dist.destroy_process_group()
EOF
  TAIL=8 step dup-nccl 90 python3 -m torch.distributed.run --nproc-per-node 2 "$OUT/dup.py"
fi
if want top; then
  train=(python -m launcher.train --dataset synthetic --model resnet18 --amp bf16 --batch-size 256
         --eval-size 512 --epochs 1 --log-every 20 --lr 0.1 --train-size 2000000)
  TAIL=3 step top-submit 60 $DDPJOB submit --name top-gpu --nodes 1 -p "$GPUS" -- "${train[@]}"
  id=$(job_id top-submit)
  sleep 45  # past the start and a few samples of the watch (every few seconds)
  TAIL=12 step top-text 60 $DDPJOB top "$id" --once
  TAIL=40 step top-json 60 $DDPJOB top "$id" --once -o json
  TAIL=3 step top-cancel 120 $DDPJOB cancel "$id" -y
  TAIL=3 step top-uuid 60 python3 -c '
import sys, torch
from launcher.targets.shared.vitals import gpus
from launcher.train.vitals import gpu_identity
torch.zeros(1, device="cuda:0")
devices, _, why = gpus()
mine, listed = gpu_identity(torch.device("cuda", 0)), [d["uuid"] for d in devices]
print("trainer names", mine, "| nvidia-smi lists", listed, why or "")
sys.exit(0 if mine in listed else 1)'
fi
