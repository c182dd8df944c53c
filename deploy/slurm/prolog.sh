#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/dynamiccl/prolog.sh, PrologFlags=Alloc): start this job's
# collector on this node before the job runs.
#   - node-local run directory $DYNAMICCL_RUN_BASE/<job id>/ (mode 0700, owned by the job's user):
#     the plugin socket collector.sock, pid, log, ports.env
#   - the collector's /metrics and feature-stream ports: free ports of this node, in ports.env
#   - a Prometheus file_sd target $DYNAMICCL_SD_DIR/<job id>-<node>-collector.json (job_id, node labels)
# A prolog that fails drains the node in Slurm: it fails only when the collector cannot start.
set -eu
DYNAMICCL_KIT="${DYNAMICCL_KIT:-$(dirname "$0")}"
. "$DYNAMICCL_KIT/lib.sh"
dccl_load_conf

mkdir -p "$DCCL_RUN"
chmod 0700 "$DCCL_RUN"
if [ "$(id -u)" = 0 ] && [ -n "${SLURM_JOB_UID:-}" ]; then
  chown "$SLURM_JOB_UID:${SLURM_JOB_GID:-$SLURM_JOB_UID}" "$DCCL_RUN"
fi
mkdir -p "$DCCL_JOB_SHARED/parquet" "$DCCL_JOB_SHARED/tuner"

metrics_port="$(dccl_free_port)"
features_port="$(dccl_free_port)"
# --allow-remote: the central Prometheus scrapes this /metrics; records arrive on the job's Unix socket only
dccl_start collector - "$DYNAMICCL_BIN" collector --listen "unix:$DCCL_SOCKET" \
  --metrics "0.0.0.0:$metrics_port" --features "tcp:127.0.0.1:$features_port" \
  --parquet "$DCCL_JOB_SHARED/parquet/$DCCL_NODE" --allow-remote

# ready = the socket exists; a collector that died (port taken, bad directory) fails the prolog with its log
i=0
while [ ! -S "$DCCL_SOCKET" ]; do
  if ! dccl_running "$(cat "$DCCL_RUN/collector.pid")" || [ $i -ge $((DYNAMICCL_START_TIMEOUT * 10)) ]; then
    echo "dynamiccl prolog: collector for job $SLURM_JOB_ID did not start; see $DCCL_RUN/collector.log:" >&2
    tail -n 5 "$DCCL_RUN/collector.log" >&2 || true
    dccl_stop collector
    exit 1
  fi
  sleep 0.1
  i=$((i + 1))
done
printf 'COLLECTOR_METRICS_PORT=%s\nCOLLECTOR_FEATURES_PORT=%s\n' "$metrics_port" "$features_port" \
  > "$DCCL_RUN/ports.env"
dccl_write_sd collector dynamiccl-collector "$metrics_port"
