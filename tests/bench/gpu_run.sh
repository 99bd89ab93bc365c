#!/usr/bin/env bash
# Issue 32's GPU run, as one script for a lent GPU machine (about 15 minutes at once, start included):
# run it from the repository's root there. Every step is bounded and writes under $OUT; a step that
# fails is reported and the next one runs. Figures go to docs/performance.md's "On a GPU" with the card,
# versions and date that env.txt and each JSON hold.
#
#   bash tests/bench/gpu_run.sh [STEPS]   # STEPS: setup,bench,extra,profile,check (default all)
#
#   setup    pydantic and companions from ./.whl (wheels downloaded beforehand on a machine with PyPI:
#            see ../shared/reference/gpu/NOTES.md; the GPU machine has no network), then env.txt
#   bench    tests/bench/gpu_bench.py --form gpu: ResNet-18 and the MLP, bf16, batch 256, hand-written
#            loops (NCHW, tuned) against the trainer by hand and under `ddpjob submit`, 3 repeats
#            alternating (-> bench.json)
#   extra    one repeat of the sides that cost more: hand_ddp, ddpjob with OMP_NUM_THREADS=1, and
#            torch.compile by hand and in the trainer, and with 2+ GPUs one rank per GPU (scaling
#            efficiency), ResNet-18 (-> extra.json)
#   profile  the trainer's ResNet-18 steps under torch.profiler: GPU busy share, step split, top
#            operators (-> profile/)
#   check    tests/bench/gpu_check.sh quickstart: README command 1 (2 nodes sharing the GPU over gloo) and
#            the same on 1 node (NCCL), with this trainer (-> check/)
# FORM=cpu runs the same steps with the benchmark's CPU sizes (a dry run on a machine without a GPU).
set -u
OUT=${OUT:-/tmp/ddpjob-gpu-run}
STEPS=${1:-setup,bench,extra,profile,check}
FORM=${FORM:-gpu}
mkdir -p "$OUT"
want() { [[ ",$STEPS," == *",$1,"* ]]; }
step() {  # step NAME LIMIT_S CMD...: run with a time limit, log to $OUT/NAME.log, say how it ended
  local name=$1 limit=$2 t0 rc; shift 2
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1; rc=$?
  echo "== $name: exit $rc in $(( $(date +%s) - t0 ))s: $*"
  tail -n "${TAIL:-8}" "$OUT/$name.log"
}

if want setup; then
  if [ -d .whl ] && ! python3 -c 'import pydantic' 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/ddpjob-site .whl/*.whl
  fi
  { date -u; nvidia-smi -L 2>&1; nproc; python3 --version
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
      "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")'
    command -v gcc cc || echo "no C compiler: --compile cannot run"; } >"$OUT/env.txt" 2>&1
  cat "$OUT/env.txt"
fi
[ -d /tmp/ddpjob-site ] && export PYTHONPATH=/tmp/ddpjob-site${PYTHONPATH:+:$PYTHONPATH}
export DDPJOB_CONFIG=none PYTHONUNBUFFERED=1

if want bench; then
  TAIL=3 step bench 330 python3 tests/bench/gpu_bench.py --form "$FORM" --repeats 3 --quiet-wait 2 \
    --sides hand_nchw,hand_tuned,trainer,ddpjob --out "$OUT/bench.json"
fi
if want extra; then
  TAIL=3 step extra 200 python3 tests/bench/gpu_bench.py --form "$FORM" --repeats 1 --quiet-wait 2 --models resnet18 \
    --compile --omp1 --sides hand_tuned,hand_ddp,hand_compile,trainer,trainer_compile,ddpjob,ddpjob_omp1,ddpjob_all_gpus \
    --out "$OUT/extra.json"
fi
if want profile; then
  if [ "$FORM" = gpu ]; then size=(--amp bf16 --batch-size 256 --train-size 20480); else size=(--batch-size 16 --train-size 640); fi
  TAIL=20 step profile 120 python3 tests/bench/gpu_profile.py --steps 20 --warmup 10 --out "$OUT/profile" -- \
    --dataset synthetic --model resnet18 "${size[@]}"
fi
if want check; then
  mkdir -p "$OUT/check"
  TAIL=12 step check 150 env OUT="$OUT/check" DDPJOB="python3 -m launcher" bash tests/bench/gpu_check.sh quickstart
fi
echo "== done: $OUT"
