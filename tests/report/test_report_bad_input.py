"""Bad input: an empty or missing directory, a partial part file, damaged data, mixed schema
versions, malformed side files — a clear message, and a report of what can be reported."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dynamiccl.cli import main
from report_helpers import make_run, num, part_files, raw_events, read_tables


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("base")
    d = make_run(root, records=20_000, chunk_records=5_000, flush_rows=5_000, rate_per_s=500.0)
    files = part_files(d)
    assert len(files) >= 4
    return d, files


def _report(d, out, capsys) -> tuple[int, str, dict, str]:
    rc = main(["report", str(d), "-o", str(out)])
    err = capsys.readouterr().err
    text = out.read_text() if os.path.exists(out) else ""
    return rc, err, read_tables(text) if text else {}, text


def _records_in_mix(tables) -> int:
    return int(sum(num(r["records"]) for r in tables["mix"]))


def test_empty_directory(tmp_path, capsys):
    rc, err, _, text = _report(tmp_path, tmp_path / "r.html", capsys)
    assert rc == 2 and text == ""
    assert "nothing to report" in err and "no parquet part files (*.parquet) under the directory" in err


def test_missing_directory(tmp_path, capsys):
    rc = main(["report", str(tmp_path / "nope")])
    assert rc == 2
    assert "no such directory" in capsys.readouterr().err


def test_only_temp_files(tmp_path, capsys, base_run):
    shutil.copy(base_run[1][0], tmp_path / "part-1.parquet.tmp.123")
    rc, err, _, _ = _report(tmp_path, tmp_path / "r.html", capsys)
    assert rc == 2 and "no parquet part files" in err


def test_partial_part_file(tmp_path, capsys, base_run):
    d, files = base_run
    run = tmp_path / "parquet"
    shutil.copytree(d, run)
    good = part_files(str(run))
    data = open(good[0], "rb").read()
    bad = run / "part-9999999999999-1-000000.parquet"
    bad.write_bytes(data[: len(data) // 2])  # a writer that died mid-file without the atomic rename
    (run / "part-9999999999999-1-000001.parquet").write_bytes(b"")  # and an empty one
    rc, err, tables, text = _report(run, tmp_path / "r.html", capsys)
    assert rc == 0
    assert "2 part file(s) skipped" in err and "not a complete parquet file" in err and bad.name in err
    assert "not a complete parquet file" in text  # the report says it too
    assert _records_in_mix(tables) == 20_000  # everything else is reported


def test_damaged_data_in_a_valid_file(tmp_path, capsys, base_run):
    d, files = base_run
    run = tmp_path / "parquet"
    shutil.copytree(d, run)
    victim = part_files(str(run))[1]
    rows = pq.read_metadata(victim).num_rows
    data = bytearray(open(victim, "rb").read())
    data[len(data) // 5: len(data) * 3 // 5] = bytes(len(data) * 3 // 5 - len(data) // 5)  # footer intact
    open(victim, "wb").write(bytes(data))
    rc, err, tables, text = _report(run, tmp_path / "r.html", capsys)
    assert rc == 0
    assert "unreadable data" in err and os.path.basename(victim) in err
    assert _records_in_mix(tables) == 20_000 - rows


def _write(table: pa.Table, path) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)


def test_mixed_schema_versions(tmp_path, capsys, base_run):
    d, files = base_run
    run = tmp_path / "parquet"
    t = [pq.read_table(f) for f in files[:4]]
    _write(t[0], run / "a" / "part-1.parquet")                                        # current schema
    old = t[1].drop_columns(["tuner_config_version", "cpu_end_ns", "comm_name", "nnodes", "n_channels"])
    _write(old, run / "b" / "part-2.parquet")                                         # an older version
    new = t[2].append_column("gpu_uuid", pa.array(["GPU-0"] * t[2].num_rows))
    new = new.set_column(new.schema.get_field_index("bytes"), "bytes", pc.cast(new.column("bytes"), pa.int64()))
    _write(new, run / "c" / "part-3.parquet")                                         # a newer version
    _write(t[3].drop_columns(["gpu_end_ns"]), run / "d" / "part-4.parquet")           # unusable
    rc, err, tables, text = _report(run, tmp_path / "r.html", capsys)
    assert rc == 0
    assert "missing required column(s) gpu_end_ns" in err and "part-4.parquet" in err
    assert "older schema lack" in text and "tuner_config_version" in text
    assert "newer schema have unknown column(s) gpu_uuid" in text
    assert "store bytes with another numeric type: cast" in text
    assert _records_in_mix(tables) == t[0].num_rows + t[1].num_rows + t[2].num_rows
    # numbers still right: the older file's records count as config version 0
    ev = raw_events([run / "a" / "part-1.parquet", run / "b" / "part-2.parquet", run / "c" / "part-3.parquet"])
    versions = {int(num(r["tuner config version"])): num(r["records"]) for r in tables["versions"]}
    assert sum(versions.values()) == len(ev)
    assert versions.get(0) == float(np.count_nonzero(ev["tuner_config_version"] == 0))


def test_invalid_records_are_counted_and_left_out(tmp_path, capsys, base_run):
    d, files = base_run
    t = pq.read_table(files[0])
    rank = t.column("rank").to_numpy().copy()
    rank[:10] = 999  # rank >= nranks: no plugin produces this
    t = t.set_column(t.schema.get_field_index("rank"), "rank", pa.array(rank, pa.int32()))
    _write(t, tmp_path / "parquet" / "part-1.parquet")
    rc, err, tables, text = _report(tmp_path / "parquet", tmp_path / "r.html", capsys)
    assert rc == 0
    assert "10 row(s) with values no plugin produces" in text
    assert _records_in_mix(tables) == t.num_rows - 10


def test_malformed_side_files(tmp_path, capsys, base_run):
    d, files = base_run
    run = tmp_path / "run"
    shutil.copytree(d, run / "parquet")
    (run / "changes.jsonl").write_text(
        '{"v":1,"id":"rc-1","kind":"latency","job_id":"j","start_s":1.0,"detected_s":2.0,"magnitude":1.5}\n'
        'garbage\n{"v":1,"kind":"weather"}\n{"v":2,"id":"x"}\n')
    (run / "retuner-audit.jsonl").write_text('{"t": 1.0, "action": "push", "version": 1}\n[1, 2]\n')
    rc, err, tables, text = _report(run / "parquet", tmp_path / "r.html", capsys)
    assert rc == 0
    assert "changes.jsonl: 3 malformed line(s) skipped" in err
    assert "retuner-audit.jsonl: 1 malformed line(s) skipped" in err
    assert [r["id"][0] for r in tables["changes"]] == ["rc-1"]
    assert len(tables["decisions"]) == 1


def test_explicit_side_file_must_exist(tmp_path, capsys, base_run):
    rc = main(["report", base_run[0], "-o", str(tmp_path / "r.html"), "--changes", str(tmp_path / "nope.jsonl")])
    assert rc == 2 and "no such file" in capsys.readouterr().err


def test_bad_settings(tmp_path, capsys, base_run):
    assert main(["report", base_run[0], "-o", str(tmp_path / "r.html"), "--bin", "0"]) == 2
    assert "bin_s must be" in capsys.readouterr().err
    assert main(["report", base_run[0], "-o", str(tmp_path / "r.html"), "--bin", "0.001"]) == 2
    assert "too small for a run" in capsys.readouterr().err
