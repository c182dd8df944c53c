"""The Slurm kit (deploy/slurm): prolog, sbatch template and epilog run with a fake Slurm (`srun`,
`scontrol` on PATH) and a stand-in `dynamiccl` that listens where it is told. Checked: per-job paths that
two jobs on one node never share, the processes started and stopped, file_sd targets written at job start
and removed at the end, the job id in every target label, the plugin settings the training sees."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "deploy/slurm"

#: stand-in for `dynamiccl`: binds the addresses a service is given, creates the collector's socket,
#: records its argv, and runs until SIGTERM
STUB = textwrap.dedent('''\
    #!PYTHON
    import json, os, signal, socket, sys, time
    args = sys.argv[1:]
    if args[0] == "plugins":
        print("/opt/dynamiccl/libnccl-%s-dynamiccl.so" % ("profiler" if "--profiler" in args else "tuner"))
        sys.exit(0)
    with open(os.environ["STUB_LOG"], "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "argv": args}) + "\\n")
    held = []
    def opt(name):
        return args[args.index(name) + 1] if name in args else None
    # what each service listens on (the detector's and retuner's --features/--changes are client addresses)
    serves = {"collector": ("--listen", "--metrics", "--features"), "detector": ("--metrics", "--serve"),
              "retuner": ("--metrics",)}[args[0]]
    for v in filter(None, map(opt, serves)):
        if v.startswith("unix:"):
            s = socket.socket(socket.AF_UNIX); s.bind(v[5:])
        else:
            s = socket.socket(); s.bind(("127.0.0.1", int(v.rsplit(":", 1)[1])))
        s.listen(); held.append(s)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(0.2)
    ''').replace("PYTHON", sys.executable)

#: fake srun: checks the collector socket answers, then records the plugin settings the training sees
SRUN = textwrap.dedent('''\
    #!/bin/sh
    python3 - "$@" <<'PY'
    import json, os, socket, sys
    s = socket.socket(socket.AF_UNIX); s.connect(os.environ["DYNAMICCL_COLLECTOR"][5:]); s.close()
    keys = ("NCCL_PROFILER_PLUGIN", "DYNAMICCL_COLLECTOR", "NCCL_TUNER_PLUGIN", "DYNAMICCL_TUNER_CONFIG",
            "DYNAMICCL_JOB_ID")
    targets = sorted(os.listdir(os.environ["DYNAMICCL_SD_DIR"]))
    with open(os.environ["SRUN_LOG"], "a") as f:
        f.write(json.dumps({"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys},
                            "targets": targets}) + "\\n")
    PY
    ''')
SCONTROL = '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "node01\\nnode02\\n"\n'


@pytest.fixture
def slurm(tmp_path):
    if shutil.which("setsid") is None:
        pytest.skip("setsid (util-linux) not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("dynamiccl", STUB), ("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "DYNAMICCL_SLURM_CONF": str(tmp_path / "no-site-conf"), "DYNAMICCL_KIT": str(KIT),
           "DYNAMICCL_BIN": str(bin_dir / "dynamiccl"), "DYNAMICCL_RUN_BASE": str(tmp_path / "run"),
           "DYNAMICCL_SHARED": str(tmp_path / "shared"), "DYNAMICCL_AS_USER": "none",
           "DYNAMICCL_NODE_ADDR": "127.0.0.1", "STUB_LOG": str(tmp_path / "stub.jsonl"),
           "SRUN_LOG": str(tmp_path / "srun.jsonl"), "SLURMD_NODENAME": "node01",
           "SLURM_JOB_NODELIST": "node[01-02]", "DYNAMICCL_SD_DIR": str(tmp_path / "shared/targets")}
    yield tmp_path, env
    for line in (tmp_path / "stub.jsonl").read_text().splitlines() if (tmp_path / "stub.jsonl").exists() else []:
        try:                                    # nothing the test started may outlive it
            os.kill(json.loads(line)["pid"], 9)
        except ProcessLookupError:
            pass


def run(script: str, env: dict, job: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash" if script.endswith("template.sh") else "sh", str(KIT / script), *args],
                          env={**env, "SLURM_JOB_ID": job}, capture_output=True, text=True, timeout=120)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_two_jobs_on_one_node_share_nothing_and_clean_up(slurm):
    tmp, env = slurm
    for job in ("101", "102"):
        r = run("prolog.sh", env, job)
        assert r.returncode == 0, r.stderr
    runs = {job: tmp / "run" / job for job in ("101", "102")}
    pids, ports = {}, {}
    for job, d in runs.items():
        assert (d / "collector.sock").is_socket() and oct(d.stat().st_mode & 0o777) == "0o700"
        pids[job] = int((d / "collector.pid").read_text())
        cmd = Path(f"/proc/{pids[job]}/cmdline").read_bytes().split(b"\0")
        assert b"collector" in cmd and f"unix:{d / 'collector.sock'}".encode() in cmd
        ports[job] = dict(line.split("=") for line in (d / "ports.env").read_text().split())
        sd = json.loads((tmp / f"shared/targets/{job}-node01-collector.json").read_text())
        assert sd == [{"targets": [f"127.0.0.1:{ports[job]['COLLECTOR_METRICS_PORT']}"],
                       "labels": {"job_id": job, "node": "node01", "service": "dynamiccl-collector"}}]
        assert (tmp / f"shared/jobs/{job}/tuner").is_dir()
    assert ports["101"] != ports["102"] and pids["101"] != pids["102"]
    # job 101 ends: its files and process go, job 102 is untouched
    r = run("epilog.sh", env, "101")
    assert r.returncode == 0, r.stderr
    assert _wait_gone(pids["101"]) and not runs["101"].exists()
    assert not (tmp / "shared/targets/101-node01-collector.json").exists()
    assert _alive(pids["102"]) and (runs["102"] / "collector.sock").is_socket()
    assert (tmp / "shared/targets/102-node01-collector.json").exists()
    assert run("epilog.sh", env, "101").returncode == 0            # again: nothing left, no error
    assert run("epilog.sh", env, "102").returncode == 0
    assert _wait_gone(pids["102"]) and os.listdir(tmp / "shared/targets") == []


def test_batch_script_runs_the_job_with_its_services_and_removes_them(slurm):
    tmp, env = slurm
    assert run("prolog.sh", env, "7").returncode == 0
    r = run("sbatch-template.sh", env, "7", "python", "train.py", "--epochs", "1")
    assert r.returncode == 0, r.stderr
    (seen,) = [json.loads(x) for x in (tmp / "srun.jsonl").read_text().splitlines()]
    assert seen["argv"] == ["--export=ALL", "python", "train.py", "--epochs", "1"]
    assert seen["env"] == {
        "NCCL_PROFILER_PLUGIN": "/opt/dynamiccl/libnccl-profiler-dynamiccl.so",
        "DYNAMICCL_COLLECTOR": f"unix:{tmp / 'run/7/collector.sock'}",
        "NCCL_TUNER_PLUGIN": "/opt/dynamiccl/libnccl-tuner-dynamiccl.so",
        "DYNAMICCL_TUNER_CONFIG": str(tmp / "shared/jobs/7/tuner/dynamiccl-tuner.conf"),
        "DYNAMICCL_JOB_ID": "7"}
    # while the training ran, Prometheus had the job's three targets
    assert seen["targets"] == ["7-node01-collector.json", "7-node01-detector.json", "7-node01-retuner.json"]
    started = [json.loads(x) for x in (tmp / "stub.jsonl").read_text().splitlines()]
    by_cmd = {s["argv"][0]: s for s in started}
    assert set(by_cmd) == {"collector", "detector", "retuner"}
    ports = dict(line.split("=") for line in (tmp / "run/7/ports.env").read_text().split())
    assert f"tcp:127.0.0.1:{ports['COLLECTOR_FEATURES_PORT']}" in by_cmd["detector"]["argv"]
    assert str(tmp / "shared/jobs/7/tuner/dynamiccl-tuner.conf") in by_cmd["retuner"]["argv"]
    assert "--apply" not in by_cmd["retuner"]["argv"]             # recommend-only unless DYNAMICCL_APPLY=1
    assert (tmp / "shared/jobs/7/changes.jsonl").exists()          # the detector's change log
    # the batch script's exit took its services and their targets away; the collector stays until the epilog
    for svc in ("detector", "retuner"):
        assert _wait_gone(by_cmd[svc]["pid"])
        assert not (tmp / f"shared/targets/7-node01-{svc}.json").exists()
    assert _alive(by_cmd["collector"]["pid"])
    assert run("epilog.sh", env, "7").returncode == 0 and _wait_gone(by_cmd["collector"]["pid"])


def test_prolog_fails_with_the_collector_log_when_it_cannot_start(slurm):
    tmp, env = slurm
    (tmp / "bin/dynamiccl").write_text("#!/bin/sh\necho 'dynamiccl collector: error: address in use' >&2\nexit 1\n")
    r = run("prolog.sh", env, "9")
    assert r.returncode == 1 and "address in use" in r.stderr and "did not start" in r.stderr
    assert not (tmp / "shared/targets/9-node01-collector.json").exists()


def test_prolog_refuses_a_bad_job_id(slurm):
    _, env = slurm
    r = run("prolog.sh", env, "../../etc")
    assert r.returncode != 0 and "bad SLURM_JOB_ID" in r.stderr


def test_service_node_prometheus_reads_the_targets(slurm, tmp_path):
    """The central Prometheus config: file_sd jobs named as the rules expect, honor_labels, valid for promtool
    once rendered by the native stack (which points file_sd at DYNAMICCL_SD_DIR)."""
    import yaml

    from dynamiccl.stack import Stack, StackConfig
    cfg = StackConfig.from_env({"DYNAMICCL_PROMETHEUS_CONFIG": str(KIT / "prometheus-slurm.yml"),
                                "DYNAMICCL_SD_DIR": str(tmp_path / "targets")}, state_dir=tmp_path / "stack",
                               only=("prometheus", "alertmanager", "alert-log"))
    svcs, _ = Stack(cfg).plan()
    assert {s.name for s in svcs} == {"alert-log", "alertmanager", "prometheus"}
    prom = yaml.safe_load((tmp_path / "stack/config/prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    for svc in ("collector", "detector", "retuner"):
        j = jobs[f"dynamiccl-{svc}"]
        assert j["honor_labels"] is True
        assert j["file_sd_configs"][0]["files"] == [str(tmp_path / "targets" / f"*-{svc}.json")]
    if shutil.which("promtool"):
        r = subprocess.run(["promtool", "check", "config", str(tmp_path / "stack/config/prometheus.yml")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    with pytest.raises(ValueError, match="not in this plan"):
        Stack(StackConfig.from_env({}, state_dir=tmp_path / "s2", only=("prometheus", "nats"))).plan()


@pytest.mark.slow
def test_prolog_and_epilog_with_the_real_collector(slurm):
    import urllib.request
    tmp, env = slurm
    wrapper = tmp / "bin/dynamiccl-real"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m dynamiccl \"$@\"\n")
    wrapper.chmod(0o755)
    env = {**env, "DYNAMICCL_BIN": str(wrapper), "DYNAMICCL_START_TIMEOUT": "120"}
    r = run("prolog.sh", env, "55")
    assert r.returncode == 0, r.stderr + (tmp / "run/55/collector.log").read_text()
    ports = dict(line.split("=") for line in (tmp / "run/55/ports.env").read_text().split())
    pid = int((tmp / "run/55/collector.pid").read_text())
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{ports['COLLECTOR_METRICS_PORT']}/metrics", timeout=10)
        assert b"dynamiccl_collector_connections_open" in body.read()
    finally:
        assert run("epilog.sh", env, "55").returncode == 0
    assert _wait_gone(pid) and not (tmp / "run/55").exists()
