#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/dynamiccl/epilog.sh): remove this job's Prometheus targets of
# this node first (so Prometheus stops scraping before the processes go), then stop the job's services on
# this node and remove its run directory. Never fails the node: every step tolerates what is already gone.
set -u
DYNAMICCL_KIT="${DYNAMICCL_KIT:-$(dirname "$0")}"
. "$DYNAMICCL_KIT/lib.sh"
dccl_load_conf

dccl_remove_sd collector detector retuner
for svc in retuner detector collector; do
  dccl_stop "$svc"
done
case "$DCCL_RUN" in
  "$DYNAMICCL_RUN_BASE"/[0-9]*) rm -rf "$DCCL_RUN" ;;
esac
exit 0
