"""DetectorConfig: nested typed groups, each validated naming its dotted field; overrides by dotted key from
code, `--set` and a YAML mapping; the old flat keys refused with the dotted key to use; defaults unchanged."""
from __future__ import annotations

import dataclasses

import pytest

from dynamiccl.cli import build_parser
from dynamiccl.detector.cli import detector_config_from_args
from dynamiccl.detector.config import (LEGACY_KEYS, AutoencoderConfig, BaselineConfig, DetectorConfig, FusionConfig,
                                       parse_overrides)
from dynamiccl.detector.config_groups import GROUPS
from dynamiccl.settings import apply, finish

#: the flat configuration's defaults before the grouping (3503b66): grouping must change none of them
FLAT_DEFAULTS = {
    "deltas": (2.0, 6.0), "arl0": 1e5, "stream_false_alarms_per_day": 1.0, "warmup": 60, "self_start": False,
    "baseline_estimator": "winsorized", "instance_weight": 0.5, "long_run_variance": 2.0, "baseline_memory": 480,
    "scale_floor": 0.004, "min_instances": 2, "max_latency_s": 3600.0, "max_streams": 2_000_000,
    "stream_idle_s": 3600.0, "corroborate": 2, "confirm_z": 3.0, "persist_ratio": 1.5, "confirm_windows": 2,
    "quiet_z": 1.0, "merge_s": 5.0, "merge_similar_s": 30.0, "min_ratio": 1.03, "small_shift_wait": False,
    "step_ratio": 1.1, "recovery_fraction": 0.3, "recovery_windows": 2, "flap_transitions": 2,
    "flap_window_s": 10.0, "workload_change": 0.08, "coverage_change": 0.04, "workload_settle": 5,
    "workload_settle_ratio": 1.15, "workload_settle_share": 0.02, "workload_settle_chain": False,
    "partial_window": 0.3, "history": 32, "straggler_share": 0.6, "straggler_min_instances": 3,
    "straggler_recheck": True, "onset_wait": True, "straggler_trigger_z": 8.0, "autoencoder": True,
    "autoencoder_grace": 60, "seed": 0, "top_statistics": 50,
}


def _dotted(flat_key: str) -> str:
    return "autoencoder.enabled" if flat_key == "autoencoder" else LEGACY_KEYS[flat_key]


# settings added after the grouping (no flat key ever existed for them)
ADDED_SINCE = {"baseline.self_start_until": 60, "baseline.early_ratio": 1.5, "baseline.early_z": 5.0,
               "baseline.early_min": 10, "streams.step_rate": False,
               "incidents.transient_s": 10.0, "baseline.split_warmup": False, "incidents.recovery_drain": True,
               "baseline.trim_warmup": False}
ADDED_SINCE["baseline.paced_warmup"] = True       # the step-paced warm-up chart (`paced_warmup.py`)
ADDED_SINCE["incidents.softer_release"] = True    # a softer step's release is one change (`softer_release.py`)
ADDED_SINCE["incidents.regime_spread"] = True     # a deeper step against its regime's noise (`regime_spread.py`)
ADDED_SINCE["baseline.chart_excursions"] = False  # per-chart warm-up CUSUM references (`chart_excursions.py`)
ADDED_SINCE["baseline.resume_warmup"] = True      # a warm-up resumed on an A -> B -> A workload (`warmup_stash.py`)
ADDED_SINCE["baseline.diff_scale"] = False        # a warm-up scale from lagged differences (`warmup_scale.py`)
ADDED_SINCE["fusion.onset_level"] = False         # an alarm judged on its level since onset (`onset_level.py`)
ADDED_SINCE["baseline.warmup_step"] = True        # a step inside a sparse stream's warm-up (`warmup_step.py`)
ADDED_SINCE["baseline.paced_two_step"] = True     # a paced change on two backed steps (`paced_two_step.py`)
ADDED_SINCE["workload.straddle_union"] = False    # a rank-set loss that is one straddling instance (`rank_straddle.py`)
ADDED_SINCE["workload.rank_set_keep"] = True      # a rank-set change at the same level keeps the baseline (`stream_rebase.py`)
ADDED_SINCE["fusion.preconfirm"] = False          # an alarm on two windows beyond the bar is confirmed (`preconfirm.py`)
ADDED_SINCE["straggler.where_refresh_windows"] = 3   # a reported change's `where` judged again (`where_refresh.py`)
ADDED_SINCE["incidents.post_recovery_hold"] = False  # one more window soon after a recovery (`post_recovery.py`)
ADDED_SINCE["incidents.adopt_improvement"] = True   # an improvement becomes the baseline (`adopt_improvement.py`)


def test_every_default_is_the_flat_configurations():
    flat = DetectorConfig().validate().flat()
    assert {k: flat.pop(k) for k in ADDED_SINCE} == ADDED_SINCE
    assert {_dotted(k): v for k, v in FLAT_DEFAULTS.items()} == flat
    assert all(type(flat[_dotted(k)]) is type(v) for k, v in FLAT_DEFAULTS.items())


def test_each_flat_key_has_one_dotted_key():
    dotted = [_dotted(k) for k in FLAT_DEFAULTS]
    assert sorted(dotted + list(ADDED_SINCE)) == sorted(DetectorConfig().flat())   # one to one, nothing left over
    assert set(LEGACY_KEYS) | {"autoencoder"} == set(FLAT_DEFAULTS)


@pytest.mark.parametrize("key, bad", [
    ("cusum.deltas", ()), ("cusum.deltas", (2.0, -1.0)), ("cusum.arl0", 1.0), ("cusum.long_run_variance", 0.5),
    ("cusum.stream_false_alarms_per_day", 0.0),
    ("baseline.warmup", 1), ("baseline.warmup", 2.5), ("baseline.memory", 10), ("baseline.estimator", "mean"),
    ("baseline.instance_weight", 2.0), ("baseline.self_start_until", 5), ("baseline.self_start_until", True), ("baseline.scale_floor", float("nan")), ("baseline.self_start", "yes"),
    ("baseline.early_ratio", 1.0), ("baseline.early_z", 0.0), ("baseline.early_min", 2),
    ("streams.min_instances", 0), ("streams.max_latency_s", -1.0), ("streams.idle_s", float("inf")),
    ("streams.history", 0), ("fusion.corroborate", 0), ("fusion.persist_ratio", 0.9), ("fusion.quiet_z", -1.0),
    ("fusion.min_ratio", 0.99), ("fusion.onset_wait", 1), ("incidents.step_ratio", 1.0),
    ("incidents.recovery_fraction", 1.0), ("incidents.transient_s", -1.0), ("incidents.flap_window_s", 0.0), ("incidents.flap_transitions", 0),
    ("workload.mix_change", 0.0), ("workload.settle_ratio", 0.5), ("workload.settle_windows", 0),
    ("workload.settle_chain", "no"), ("straggler.share", 0.4), ("straggler.trigger_z", -1.0),
    ("straggler.recheck", "yes"), ("autoencoder.enabled", 1), ("autoencoder.grace", 0),
    ("autoencoder.seed", 1.5), ("outputs.top_statistics", 0),
])
def test_each_group_names_the_dotted_field(key, bad):
    group, name = key.split(".")
    broken = dataclasses.replace(DetectorConfig(), **{group: dataclasses.replace(GROUPS[group](), **{name: bad})})
    with pytest.raises(ValueError, match=f"detector config: {key} must be"):
        broken.validate()
    with pytest.raises(ValueError, match=f"detector config: {key} must be"):
        DetectorConfig().with_overrides({key: bad})


def test_a_group_set_to_a_value_says_how_to_set_its_fields():
    with pytest.raises(ValueError, match=r"autoencoder must be a AutoencoderConfig \(set its fields as autoencoder"):
        DetectorConfig(autoencoder=False).validate()
    with pytest.raises(ValueError, match="'autoencoder' is a group of settings; set one of autoencoder.enabled"):
        DetectorConfig().replace(autoencoder=False)


def test_overrides_by_dotted_key_group_and_nested_mapping_agree():
    want = DetectorConfig(baseline=BaselineConfig(warmup=30), autoencoder=AutoencoderConfig(enabled=False))
    assert DetectorConfig().replace(**{"baseline.warmup": 30, "autoencoder.enabled": False}) == want
    assert DetectorConfig().replace(baseline={"warmup": 30}, autoencoder={"enabled": False}) == want
    assert DetectorConfig().with_overrides({"baseline": {"warmup": 30}, "autoencoder": {"enabled": False}}) == want
    assert DetectorConfig().replace(baseline=BaselineConfig(warmup=30),
                                    **{"autoencoder.enabled": False}) == want
    assert want.overrides() == {"baseline.warmup": 30, "autoencoder.enabled": False}
    # YAML/JSON types: a list is the tuple, an int the float
    cfg = DetectorConfig().with_overrides({"cusum": {"deltas": [3, 6], "arl0": 10000}})
    assert cfg.cusum.deltas == (3, 6) and cfg.cusum.arl0 == 1e4 and isinstance(cfg.cusum.arl0, float)
    assert DetectorConfig().with_overrides({}) == DetectorConfig()


@pytest.mark.parametrize("flat", sorted(LEGACY_KEYS))
def test_a_flat_key_names_the_dotted_key_to_use(flat):
    message = f"'{flat}' is now '{LEGACY_KEYS[flat]}'"
    with pytest.raises(ValueError, match=message):
        DetectorConfig().replace(**{flat: 1})
    with pytest.raises(ValueError, match=message):
        parse_overrides([f"{flat}=1"])


def test_unknown_keys_list_the_known_ones():
    for key in ("baseline.nope", "nope.warmup", "nope"):
        with pytest.raises(ValueError, match=f"unknown setting '{key}'; known: autoencoder.enabled, "):
            DetectorConfig().with_overrides({key: 1})


def test_set_values_are_read_as_the_fields_type():
    got = parse_overrides(["cusum.deltas=2,6", "autoencoder.enabled=off", "baseline.warmup=20",
                           "streams.max_streams=1e5", "cusum.arl0=1e4", "baseline.estimator=mad",
                           "fusion.small-shift-wait=YES"])
    assert got == {"cusum.deltas": (2.0, 6.0), "autoencoder.enabled": False, "baseline.warmup": 20,
                   "streams.max_streams": 100000, "cusum.arl0": 1e4, "baseline.estimator": "mad",
                   "fusion.small_shift_wait": True}
    for item, message in (("baseline.warmup=lots", "--set baseline.warmup: cannot read 'lots' as int"),
                          ("baseline.warmup=2.5", "cannot read '2.5' as int"),
                          ("autoencoder.enabled=maybe", "cannot read 'maybe' as bool"),
                          ("baseline.warmup", "expected KEY=VALUE")):
        with pytest.raises(ValueError, match=message):
            parse_overrides([item])


def _run_args(argv, doc=None):
    p = build_parser()
    apply(p, {}, doc or {})
    return finish(p.parse_args(["detector", "run", *argv]))


def test_detector_run_takes_dotted_settings_from_the_command_line_and_yaml():
    cfg = detector_config_from_args(_run_args(["--set", "baseline.warmup=30", "--set", "fusion.min_ratio=1.1",
                                               "--no-autoencoder"]))
    assert cfg.overrides() == {"baseline.warmup": 30, "fusion.min_ratio": 1.1, "autoencoder.enabled": False}
    doc = {"detector": {"run": {"set": {"baseline": {"warmup": 30, "self_start": True},
                                        "cusum": {"deltas": [2, 6.5]}, "fusion.min_ratio": 1.1}}}}
    cfg = detector_config_from_args(_run_args([], doc))
    assert cfg.overrides() == {"baseline.warmup": 30, "baseline.self_start": True, "cusum.deltas": (2.0, 6.5),
                               "fusion.min_ratio": 1.1}
    assert detector_config_from_args(_run_args(["--warmup", "20"], doc)).baseline.warmup == 20   # the flag wins
    with pytest.raises(ValueError, match="'warmup' is now 'baseline.warmup'"):
        detector_config_from_args(_run_args([], {"detector": {"run": {"set": {"warmup": 30}}}}))


def test_the_groups_are_frozen_and_typed():
    cfg = DetectorConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.fusion.min_ratio = 2.0                                           # type: ignore[misc]
    assert isinstance(cfg.fusion, FusionConfig)
    assert {f.name for f in dataclasses.fields(DetectorConfig)} == set(GROUPS)


def test_readme_settings_table_lists_every_key_with_its_default():
    import ast
    import re
    from pathlib import Path

    from dynamiccl import detector
    text = Path(detector.__file__).with_name("README.md").read_text()
    section = text.split("## Settings (`DetectorConfig`)", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if re.match(r"^\| `\w+\.\w+` \|", line)]
    table = {key.strip().strip("`"): ast.literal_eval(default.strip().strip("`")) for key, default, *_ in rows}
    assert list(table) == list(DetectorConfig().flat())
    assert table == DetectorConfig().flat()
