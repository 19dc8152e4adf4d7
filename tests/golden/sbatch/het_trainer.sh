#!/bin/bash
# Paddock job (het layout), rendered by controller/sbatch.py: do not edit.
#SBATCH --job-name=paddock
#SBATCH --time=02:00:00
#SBATCH --signal=B:TERM@300
#SBATCH --partition=cpu
#SBATCH --account=rl-team
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=4
#SBATCH hetjob
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=16

RUN_DIR=/scratch/paddock/runs/exp-1
PY=/opt/paddock/.venv/bin/python
IMAGE_STORE=/var/tmp/paddock/images
DEPLOYMENT="slurm-${SLURM_JOB_ID}"

# The run directory must be writable here; every node must see it (shared storage).
if ! mkdir -p "$RUN_DIR/logs" || ! touch "$RUN_DIR/logs/.writable"; then
  echo "paddock: run directory $RUN_DIR is not writable from $(hostname)" >&2
  exit 2
fi

srun --het-group=0 --nodes=1 --ntasks=1 "$PY" -m controller.cli job head --run-dir "$RUN_DIR" --deployment "$DEPLOYMENT" --image-store "$IMAGE_STORE" --agents 4 --agents-wait-s 300 --versions 8 --rollouts-per-task 1 --tasks-limit 0 --heartbeat-interval-s 1.0 --taskset swe-lite --bank /scratch/paddock/bank --trainer '/opt/paddock/.venv/bin/python train.py --lr 1e-6 --out "$HOME/ckpt"' \
  >>"$RUN_DIR/logs/head.log" 2>&1 &
HEAD_PID=$!
srun --het-group=1 --nodes=4 --ntasks-per-node=1 "$PY" -m controller.cli job agent --run-dir "$RUN_DIR" --deployment "$DEPLOYMENT" --image-store "$IMAGE_STORE" --slots 8 --controller-wait-s 300 --heartbeat-interval-s 1.0 \
  >>"$RUN_DIR/logs/agents.log" 2>&1 &
AGENTS_PID=$!

# The end-of-time signal reaches this shell (--signal=B:...). Slurm delivers a step signal to
# every process of the step (sandboxes too), so it goes on as SIGWINCH, which processes
# ignore by default and the job steps handle: agents drain, the head stops training, waits
# for the drain and flushes the store. (A signal to srun itself would abort its step.)
forward() { echo "paddock: SIGTERM before the time limit: draining"; scancel --signal=28 "$SLURM_JOB_ID"; }
trap forward TERM
# wait returns early (>128) when the trap runs: wait again until the step has exited
while :; do wait "$HEAD_PID"; HEAD_RC=$?; kill -0 "$HEAD_PID" 2>/dev/null || break; done
# the head has stopped the controller: agents still waiting for one are told to give up
[ "$HEAD_RC" -eq 0 ] || scancel --signal=TERM "$SLURM_JOB_ID"
while :; do wait "$AGENTS_PID"; kill -0 "$AGENTS_PID" 2>/dev/null || break; done
echo "paddock: head exited with $HEAD_RC"
exit "$HEAD_RC"
