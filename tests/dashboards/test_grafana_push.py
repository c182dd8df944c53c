"""`dynamiccl dashboards push|annotate` against a loopback fake of Grafana's documented HTTP API."""
from __future__ import annotations

import json
import socket

import pytest

from fake_grafana import FakeGrafana
from dynamiccl.dashboards.grafana_push import Annotator, GrafanaError, add_annotation, connect, push_dashboards
from dynamiccl.cli import main

RC = {"v": 1, "id": "rc-j1-1", "kind": "bandwidth", "job_id": "j1", "start_s": 1700000010.0,
      "detected_s": 1700000011.5, "magnitude": 2.4, "comms": ["0x1f"], "comm_names": ["dp0"], "funcs": ["AllReduce"],
      "size_buckets": [24], "ranks": [], "hosts": ["sim-node-01"], "recovers": None, "evidence": {}}


@pytest.fixture
def grafana():
    g = FakeGrafana().start()
    yield g
    g.stop()


def test_push_creates_folder_then_every_dashboard(grafana, capsys):
    assert main(["dashboards", "push", "--url", grafana.url, "--token", grafana.token]) == 0
    assert grafana.violations == []
    paths = [(m, p) for m, p, _ in grafana.requests]
    assert paths[:2] == [("GET", "/api/folders/dynamiccl"), ("POST", "/api/folders")]
    assert paths[2:] == [("POST", "/api/dashboards/db")] * 5
    assert grafana.folders["dynamiccl"]["title"] == "DynamICCL"
    assert sorted(grafana.dashboards) == ["dynamiccl-gpu", "dynamiccl-overview", "dynamiccl-ranks",
                                          "dynamiccl-regimes", "dynamiccl-retuner"]
    assert all(d["folderUid"] == "dynamiccl" for d in grafana.dashboards.values())
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"pushed=5 folder=dynamiccl url={grafana.url}"
    # a second push reuses the folder and overwrites by uid (version 2)
    assert main(["dashboards", "push", "--url", grafana.url, "--token", grafana.token]) == 0
    assert [m for m, p, _ in grafana.requests].count("POST") == 1 + 5 + 5
    assert grafana.dashboards["dynamiccl-overview"]["version"] == 2 and grafana.violations == []


def test_bad_token_is_a_clear_error(grafana, capsys):
    assert main(["dashboards", "push", "--url", grafana.url, "--token", "wrong"]) == 1
    err = capsys.readouterr().err
    assert "rejected the token (401 Unauthorized)" in err and "--token" in err
    assert grafana.dashboards == {}


def test_unreachable_grafana_is_a_clear_error(capsys):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                   # nothing listens there now
    assert main(["dashboards", "push", "--url", f"http://127.0.0.1:{port}", "--token", "t", "--timeout", "2"]) == 1
    assert f"cannot reach Grafana at http://127.0.0.1:{port}" in capsys.readouterr().err


def test_missing_url_and_bad_url(capsys, monkeypatch):
    monkeypatch.delenv("GRAFANA_URL", raising=False)
    assert main(["dashboards", "push", "--url", "", "--token", "t"]) == 2
    assert "--url (or $GRAFANA_URL) is required" in capsys.readouterr().err
    with pytest.raises(GrafanaError, match="expected http"):
        connect("grafana:3000", "t")


def test_rejected_payload_names_the_dashboard(grafana):
    g = connect(grafana.url, grafana.token)
    with pytest.raises(GrafanaError, match=r"dashboard broken.json: .*rejected the request \(400\)"):
        push_dashboards(g, {"broken.json": {"title": "x", "uid": "u" * 41}})


def test_annotation_matches_the_documented_body(grafana):
    g = connect(grafana.url, grafana.token)
    assert add_annotation(g, RC) == 1
    a = grafana.annotations[0]
    assert a["time"] == 1700000010000 and a["timeEnd"] == 1700000011500
    assert a["tags"] == ["regime-change", "bandwidth", "job:j1", "comm:dp0"]
    assert "latency x2.40 on dp0" in a["text"] and grafana.violations == []


def test_annotator_keeps_going_through_errors_and_bad_lines(grafana, tmp_path, capsys):
    grafana.fail_annotations = 1
    lines = [json.dumps(RC), "not json", json.dumps({**RC, "kind": "weather", "start_s": "x"}),
             json.dumps({**RC, "id": "rc-j1-2", "kind": "recovery", "recovers": "rc-j1-1", "magnitude": 1.0})]
    f = tmp_path / "rc.jsonl"
    f.write_text("\n".join(lines) + "\n")
    rc = main(["dashboards", "annotate", "--url", grafana.url, "--token", grafana.token, "--file", str(f)])
    assert rc == 1                               # one POST failed (500): reported, not fatal
    assert capsys.readouterr().out.strip().endswith("annotations posted=1 failed=1 malformed=2")
    assert [a["tags"][1] for a in grafana.annotations] == ["recovery"]
    assert "(ends rc-j1-1)" in grafana.annotations[0]["text"]


def test_annotator_with_grafana_down_counts_and_continues():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ann = Annotator(connect(f"http://127.0.0.1:{port}", "t", timeout=1))
    ann.run([json.dumps(RC), json.dumps(RC)])
    assert (ann.posted, ann.failed) == (0, 2)


def test_push_never_prints_a_password_from_the_url(grafana, capsys):
    """Issue 18 #9: `pushed=... url=` and errors printed the password given inside the URL."""
    from dynamiccl.dashboards.grafana_push import redact
    assert redact("http://admin:s3cr%40t@h:3000/g") == "http://admin:***@h:3000/g"
    assert redact("http://h:3000") == "http://h:3000" and redact("http://tok@h:1") == "http://tok@h:1"
    url = grafana.url.replace("://", "://admin:hunter2@")
    main(["dashboards", "push", "--url", url, "--token-file", "/nonexistent/t"])
    main(["dashboards", "push", "--url", url.replace("127.0.0.1", "127.0.0.1:bad"), "--token", "t"])
    main(["dashboards", "push", "--url", url])
    out = capsys.readouterr()
    assert "hunter2" not in out.out + out.err, out
    assert "admin:***@" in out.out and "password in --url is visible" in out.err


def test_token_from_a_private_file_and_argv_warned(grafana, tmp_path, capsys, monkeypatch):
    import os
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    f = tmp_path / "token"
    f.write_text(grafana.token + "\n")
    os.chmod(f, 0o644)
    assert main(["dashboards", "push", "--url", grafana.url, "--token-file", str(f)]) == 2
    assert "not be readable by group or others" in capsys.readouterr().err
    os.chmod(f, 0o600)
    assert main(["dashboards", "push", "--url", grafana.url, "--token-file", str(f)]) == 0
    assert "warning" not in capsys.readouterr().err
    monkeypatch.setenv("GRAFANA_TOKEN_FILE", str(f))
    assert main(["dashboards", "push", "--url", grafana.url]) == 0
    assert main(["dashboards", "push", "--url", grafana.url, "--token", grafana.token]) == 0
    assert "--token is visible to every user" in capsys.readouterr().err


def test_annotate_stream_discards_an_over_long_line_whole():
    """The regime-change stream is read by the shared line reader: a line over 1 MiB is dropped up to its
    newline (before, its tail after the first MiB came through as a line of its own)."""
    import threading

    from dynamiccl.dashboards.cli import _stream_lines
    first, last = json.dumps(RC).encode(), json.dumps({**RC, "id": "rc-j1-2"}).encode()
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.sendall(first + b"\n" + b"x" * (3 << 20) + b"\n" + last + b"\n")
            stop.wait(10)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    got = []
    try:
        for line in _stream_lines(f"tcp:127.0.0.1:{srv.getsockname()[1]}", stop):
            got.append(line)
            if line == last or len(got) > 3:
                break
    finally:
        stop.set()
        t.join(5)
        srv.close()
    assert got == [first, last]
