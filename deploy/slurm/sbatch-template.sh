#!/bin/bash
# DynamICCL sbatch template: copy it, set the #SBATCH lines and the training command at the end.
# The prolog has started a collector for this job on every node; this script adds the job's detector and
# retuner on the batch node, points NCCL's plugins at them, and runs the training with srun.
#SBATCH --job-name=nccl-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=04:00:00
set -euo pipefail
DYNAMICCL_KIT="${DYNAMICCL_KIT:-/etc/dynamiccl}"        # where lib.sh and the conf are installed
. "$DYNAMICCL_KIT/lib.sh"
dccl_load_conf
[ -r "$DCCL_RUN/ports.env" ] || { echo "dynamiccl: no collector for job $SLURM_JOB_ID on $DCCL_NODE (prolog not run? PrologFlags=Alloc)" >&2; exit 1; }
. "$DCCL_RUN/ports.env"

# The detector reads this node's collector (see deploy/slurm/README.md, "Known limits"); the retuner
# writes this job's tuner configuration on the shared filesystem. Recommend-only unless DYNAMICCL_APPLY=1.
detector_metrics="$(dccl_free_port)"; detector_changes="$(dccl_free_port)"; retuner_metrics="$(dccl_free_port)"
# the detector's stdout is the job's change log (one regime change per line), next to its parquet history,
# where `dynamiccl report $DYNAMICCL_SHARED/jobs/<job id>/parquet` finds it
dccl_start detector "$DCCL_JOB_SHARED/changes.jsonl" "$DYNAMICCL_BIN" detector run \
  --features "tcp:127.0.0.1:$COLLECTOR_FEATURES_PORT" --metrics "0.0.0.0:$detector_metrics" \
  --serve "tcp:127.0.0.1:$detector_changes" --no-autoencoder
dccl_start retuner - "$DYNAMICCL_BIN" retuner run --changes "tcp:127.0.0.1:$detector_changes" \
  --features "tcp:127.0.0.1:$COLLECTOR_FEATURES_PORT" --metrics "0.0.0.0:$retuner_metrics" \
  --tuner-config "$DCCL_TUNER_CONFIG" --audit "$DCCL_JOB_SHARED/retuner-audit.jsonl" \
  ${DYNAMICCL_APPLY:+--apply}
dccl_write_sd detector dynamiccl-detector "$detector_metrics"
dccl_write_sd retuner dynamiccl-retuner "$retuner_metrics"
cleanup() { dccl_remove_sd detector retuner; dccl_stop retuner; dccl_stop detector; }
trap cleanup EXIT

# The three plugin settings, the same path on every node (the run directory is node-local, per job).
export NCCL_PROFILER_PLUGIN="${NCCL_PROFILER_PLUGIN:-$("$DYNAMICCL_BIN" plugins --profiler)}"
export DYNAMICCL_COLLECTOR="unix:$DCCL_SOCKET"
export NCCL_TUNER_PLUGIN="${NCCL_TUNER_PLUGIN:-$("$DYNAMICCL_BIN" plugins --tuner)}"
export DYNAMICCL_TUNER_CONFIG="$DCCL_TUNER_CONFIG"
export DYNAMICCL_JOB_ID="$SLURM_JOB_ID"                  # the job_id label of every metric
echo "dynamiccl: job $SLURM_JOB_ID on $(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)" \
     "collector socket $DCCL_SOCKET, tuner config $DCCL_TUNER_CONFIG" >&2

# ---- the training command -----------------------------------------------------------------------------
[ $# -gt 0 ] || set -- python train.py
srun --export=ALL "$@"
