# Shared helpers of the DynamICCL Slurm kit (sourced; POSIX sh + coreutils, util-linux setsid/setpriv,
# python3). The sourcing script sets DYNAMICCL_KIT to the directory of this file.
# Every path of a job contains its job id: two jobs on one node never share a socket, a tuner
# configuration, a port file or a Prometheus target file.

dccl_load_conf() {
  conf="${DYNAMICCL_SLURM_CONF:-/etc/dynamiccl/slurm.conf}"
  [ -r "$conf" ] || conf="$DYNAMICCL_KIT/dynamiccl-slurm.conf"
  # shellcheck disable=SC1090
  . "$conf"
  : "${SLURM_JOB_ID:?SLURM_JOB_ID is not set: run from Slurm (prolog, epilog or a batch job)}"
  case "$SLURM_JOB_ID" in *[!0-9_]*|'') echo "dynamiccl: bad SLURM_JOB_ID '$SLURM_JOB_ID'" >&2; exit 1 ;; esac
  DCCL_NODE="${SLURMD_NODENAME:-$(hostname -s)}"
  DCCL_ADDR="${DYNAMICCL_NODE_ADDR:-$DCCL_NODE}"
  DCCL_RUN="$DYNAMICCL_RUN_BASE/$SLURM_JOB_ID"              # node-local, per job
  DCCL_JOB_SHARED="$DYNAMICCL_SHARED/jobs/$SLURM_JOB_ID"   # shared, per job
  DCCL_SOCKET="$DCCL_RUN/collector.sock"
  DCCL_TUNER_CONFIG="$DCCL_JOB_SHARED/tuner/dynamiccl-tuner.conf"
}

# A free TCP port on this node (bound then released: a short race with other binders, retried by the caller).
dccl_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}

# dccl_write_sd NAME SERVICE PORT: a Prometheus file_sd target for this job, written atomically.
# Labels: job_id (= the Slurm job id, also what the plugin reports) and node.
dccl_write_sd() {
  mkdir -p "$DYNAMICCL_SD_DIR"
  f="$DYNAMICCL_SD_DIR/$SLURM_JOB_ID-$DCCL_NODE-$1.json"
  printf '[{"targets": ["%s:%s"], "labels": {"job_id": "%s", "node": "%s", "service": "%s"}}]\n' \
    "$DCCL_ADDR" "$3" "$SLURM_JOB_ID" "$DCCL_NODE" "$2" > "$f.tmp.$$"
  mv -f "$f.tmp.$$" "$f"
}

dccl_remove_sd() {   # dccl_remove_sd NAME...
  for n in "$@"; do rm -f "$DYNAMICCL_SD_DIR/$SLURM_JOB_ID-$DCCL_NODE-$n.json"; done
}

# dccl_start NAME STDOUT CMD...: start a node service detached (own session), as the job's user when we
# are root; stderr (and stdout when STDOUT is -) to $DCCL_RUN/NAME.log; its pid to $DCCL_RUN/NAME.pid.
dccl_start() {
  name="$1"; out="$2"; shift 2
  [ "$out" = - ] && out="$DCCL_RUN/$name.log"
  as=""
  if [ "$DYNAMICCL_AS_USER" = auto ] && [ "$(id -u)" = 0 ] && [ -n "${SLURM_JOB_UID:-}" ] \
     && [ "$SLURM_JOB_UID" != 0 ]; then
    as="setpriv --reuid=$SLURM_JOB_UID --regid=${SLURM_JOB_GID:-$SLURM_JOB_UID} --init-groups --"
  fi
  # shellcheck disable=SC2086
  setsid $as "$@" </dev/null >>"$out" 2>>"$DCCL_RUN/$name.log" &
  echo $! > "$DCCL_RUN/$name.pid"
}

# dccl_running PID: the process exists and is not a zombie (an unreaped child counts as gone)
dccl_running() {
  [ -r "/proc/$1/stat" ] || return 1
  state="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)"
  [ -n "$state" ] && [ "$state" != Z ]
}

# dccl_stop NAME: stop the service whose pid file is $DCCL_RUN/NAME.pid, only if that pid still runs
# `dynamiccl` (a recycled pid is left alone); TERM, then KILL after 10 s.
dccl_stop() {
  pidf="$DCCL_RUN/$1.pid"
  [ -r "$pidf" ] || return 0
  pid="$(cat "$pidf")"
  if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q dynamiccl; then
    kill -TERM "$pid" 2>/dev/null
    i=0
    while dccl_running "$pid" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    dccl_running "$pid" && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$pidf"
}
