"""The corpus loader and figures: halves by seed, archives, the key=value line."""
import tarfile

import pytest

from dynamiccl.harness import corpus


def _fake_run(root, seed):
    d = root / f"seed-{seed:03d}"
    (d / "records" / "x").mkdir(parents=True)
    (d / "truth.json").write_text('{"events": []}')
    (d / "summary.json").write_text('{"interrupted": false}')
    (d / "records" / "x" / "part.parquet").write_bytes(b"")
    return d


def test_halves_are_by_seed_and_runs_without_records_are_skipped(tmp_path):
    for s in range(4):
        _fake_run(tmp_path, s)
    (tmp_path / "seed-009").mkdir()  # a run that never recorded
    assert [s for s, _ in corpus.load_runs(tmp_path, "eval")] == [1, 3]
    assert [s for s, _ in corpus.load_runs(tmp_path, "dev")] == [0, 2]
    assert len(corpus.load_runs(tmp_path, None)) == 4


def test_an_archive_is_read_like_a_folder(tmp_path):
    src = tmp_path / "c" / "corpus"
    for s in range(2):
        _fake_run(src, s)
    archive = tmp_path / "c.tar.xz"
    with tarfile.open(archive, "w:xz") as tf:
        tf.add(src, arcname="corpus")
    runs = corpus.load_runs(archive, "eval")
    assert [s for s, _ in runs] == [1]
    unpacked = runs[0][1].parent
    assert unpacked.exists() and unpacked.name.startswith(("dynamiccl-corpus-", "corpus"))
    corpus.cleanup_extracted()                  # what the process does at exit: nothing left in /tmp
    assert not runs[0][1].exists()


def test_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="test-bed corpus not found"):
        corpus.load_runs(tmp_path / "nope")


def test_figures_and_line():
    a = corpus.RunScore(1, changes=10, reported=9, false_alarms=1, monitored_s=1800,
                        delays_s=[1.0, 2.0, 3.0, 6.0], delays_instances=[10, 20, 30, 60], localisable=4, localised=3,
                        localised_report=2)
    b = corpus.RunScore(3, changes=10, reported=10, false_alarms=0, monitored_s=1800, delays_s=[4.0],
                        delays_instances=[40], localisable=0, localised=0)
    s = corpus.summarise([a, b])
    assert s["within_5s"] == 4 and s["within_5s_share"] == 0.2
    assert s["false_alarms_per_h"] == 1.0 and s["median_delay_s"] == 3.0 and s["localise_top1"] == 0.75
    assert s["localise_top1_at_truth"] == 0.0
    assert s["localise_top1_report"] == 0.5          # the report's own verdicts, without later updates
    assert "testbed_localise_top1=0.750 testbed_localise_top1_report=0.500 " in corpus.line(s)
    assert corpus.line(s).startswith("testbed_runs=2 testbed_changes=20 testbed_within_5s=0.200 ")


def test_pack_keeps_finished_runs_only(tmp_path):
    src = tmp_path / "runs"
    for s in range(3):
        d = _fake_run(src, s)
        (d / "logs").mkdir()
        if s == 2:  # seed 2 never finished
            (d / "summary.json").unlink()
        if s == 1:
            (d / "summary.json").write_text('{"interrupted": true}')
    n = corpus.pack(src, tmp_path / "c.tar.xz")
    assert n == 1
    runs = corpus.load_runs(tmp_path / "c.tar.xz", None)
    assert [s for s, _ in runs] == [0] and not (runs[0][1] / "logs").exists()


def test_the_right_rank_or_link():
    from types import SimpleNamespace as NS

    from dynamiccl.detector.localise import Where
    ingress = NS(single_rank=2, direction="ingress")
    egress = NS(single_rank=2, direction="egress")
    into_3 = Where("link", 3, (2, 3), 0.9, "late_finish")
    assert corpus.names_it(Where("rank", 2, None, 1.0, "late_arrival"), ingress)
    assert not corpus.names_it(into_3, ingress)      # the link out of 2 is not 2's ingress
    assert corpus.names_it(into_3, egress)           # ... but is 2's egress
    assert not corpus.names_it(None, egress)


def test_a_softer_step_is_an_improvement():
    softer = {"do": "throttle", "mbit_from": 9.5, "mbit_to": 19.0, "degrades": True}
    deeper = {"do": "throttle", "mbit_from": 40.0, "mbit_to": 19.0, "degrades": True}
    assert corpus._relabel(softer)["degrades"] is False and corpus._relabel(deeper)["degrades"] is True


def test_evaluate_suite_testbed_names_a_missing_corpus(tmp_path):
    import argparse

    from dynamiccl.harness import detector_eval_cli as evaluate
    p = argparse.ArgumentParser()
    evaluate.add_arguments(p)
    args = p.parse_args(["--suite", "testbed", "--corpus", str(tmp_path / "none.tar.xz")])
    with pytest.raises(FileNotFoundError, match="none.tar.xz"):
        evaluate.run(args)
    assert p.parse_args([]).suite == "simulated"  # the default suite is unchanged


def test_evaluate_suite_testbed_applies_set_overrides(tmp_path, monkeypatch):
    """``--set`` reaches the test-bed replay's detector config (it was silently ignored)."""
    import argparse

    from dynamiccl.harness import detector_eval_cli as evaluate
    seen = {}

    def fake_run_suite(path, half, config=None, print_fn=print, window_s=None):
        seen["config"], seen["window_s"] = config, window_s
        return {"half": half}
    monkeypatch.setattr(corpus, "run_suite", fake_run_suite)
    monkeypatch.setattr(corpus, "line", lambda rep: "testbed=fake")
    p = argparse.ArgumentParser()
    evaluate.add_arguments(p)
    evaluate.run(p.parse_args(["--suite", "testbed", "--set", "streams.step_rate=true"]))
    assert seen["config"] is not None and seen["config"].streams.step_rate is True
    evaluate.run(p.parse_args(["--suite", "testbed"]))
    assert seen["config"] is None  # defaults: the replay's own DetectorConfig()
    assert seen["window_s"] is None  # ... and the collector's default window
    evaluate.run(p.parse_args(["--suite", "testbed", "--window", "0.5"]))
    assert seen["window_s"] == 0.5
    with pytest.raises(ValueError, match="--window"):
        evaluate.run(p.parse_args(["--suite", "testbed", "--window", "0"]))


def test_the_live_verdict_is_the_newest_handed_out_within_the_reports_budget():
    from types import SimpleNamespace as NS

    from dynamiccl.detector.where_refresh import WhereUpdate
    first = {"kind": "rank", "rank": 1, "link": None, "confidence": 0.5, "rule": "late_arrival"}
    rc = NS(id="rc-1", evidence={"where": first})
    ups = [WhereUpdate("rc-1", "j", 104.0, {**first, "rank": 2}), WhereUpdate("rc-2", "j", 103.0, {**first, "rank": 3}),
           WhereUpdate("rc-1", "j", 107.0, {**first, "rank": 0})]
    assert corpus._live_where(rc).rank == 1
    assert corpus._live_where(rc, ups, 105.0).rank == 2          # the update after 105 s comes too late
    assert corpus._live_where(NS(id="rc-2", evidence={}), ups, 105.0).rank == 3
