"""Typed, validated configuration of the detector service (`dynamiccl.detector.service.Detector`).

``DetectorConfig()`` holds the defaults in nested groups (`dynamiccl.detector.config_groups`);
``validate()`` runs every group's check at start-up and raises ``ValueError`` naming the dotted
field. Settings change by dotted key, from code, the command line (``--set baseline.warmup=30``) or
a YAML mapping (``{"baseline": {"warmup": 30}}``)::

    >>> cfg = DetectorConfig().with_overrides({"baseline.warmup": 30, "autoencoder": {"enabled": False}})
    >>> cfg.baseline.warmup, cfg.autoencoder.enabled, cfg.overrides()
    (30, False, {'baseline.warmup': 30, 'autoencoder.enabled': False})
    >>> DetectorConfig().with_overrides({"warmup": 30})
    Traceback (most recent call last):
    ...
    ValueError: detector config: 'warmup' is now 'baseline.warmup'

Runtime objects (clock, registry) are keyword arguments of the classes, never config fields.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .config_groups import (GROUPS, AutoencoderConfig, BaselineConfig, CusumConfig, FusionConfig, IncidentConfig,
                            OutputConfig, StragglerConfig, StreamsConfig, WorkloadConfig)

__all__ = ["DetectorConfig", "parse_overrides", "DEFAULT_FEATURES", "DEFAULT_METRICS", "DEFAULT_SERVE",
           "CusumConfig", "BaselineConfig", "StreamsConfig", "FusionConfig", "IncidentConfig", "WorkloadConfig",
           "StragglerConfig", "AutoencoderConfig", "OutputConfig"]

DEFAULT_FEATURES = "tcp:127.0.0.1:9465"
DEFAULT_METRICS = "127.0.0.1:9466"
DEFAULT_SERVE = "tcp:127.0.0.1:9467"

#: the flat keys of the configuration before it was grouped -> the dotted key that replaced each
LEGACY_KEYS: dict[str, str] = {
    **{k: f"cusum.{k}" for k in ("deltas", "arl0", "stream_false_alarms_per_day", "long_run_variance")},
    **{k: f"baseline.{k}" for k in ("warmup", "self_start", "instance_weight", "scale_floor")},
    "baseline_estimator": "baseline.estimator", "baseline_memory": "baseline.memory",
    **{k: f"streams.{k}" for k in ("min_instances", "max_latency_s", "max_streams", "history")},
    "stream_idle_s": "streams.idle_s",
    **{k: f"fusion.{k}" for k in ("corroborate", "confirm_z", "persist_ratio", "confirm_windows", "quiet_z",
                                  "min_ratio", "small_shift_wait", "partial_window", "onset_wait")},
    **{k: f"incidents.{k}" for k in ("merge_s", "merge_similar_s", "step_ratio", "recovery_fraction",
                                     "recovery_windows", "flap_transitions", "flap_window_s")},
    "workload_change": "workload.mix_change", "coverage_change": "workload.coverage_change",
    "workload_settle": "workload.settle_windows", "workload_settle_ratio": "workload.settle_ratio",
    "workload_settle_share": "workload.settle_share", "workload_settle_chain": "workload.settle_chain",
    "straggler_share": "straggler.share", "straggler_min_instances": "straggler.min_instances",
    "straggler_recheck": "straggler.recheck", "straggler_trigger_z": "straggler.trigger_z",
    "autoencoder_grace": "autoencoder.grace", "seed": "autoencoder.seed",
    "top_statistics": "outputs.top_statistics",
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class DetectorConfig:
    """Detector settings, one group per concern (see each group's docstring and comments).

    Streams are (job_id, comm_hash, func, size_bucket) rows of the collector's ``keys`` frame;
    each feeds ``log(lat_p50_s)`` per window to the CUSUM banks of ``cusum.deltas``.
    """

    cusum: CusumConfig = field(default_factory=CusumConfig)
    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    streams: StreamsConfig = field(default_factory=StreamsConfig)
    fusion: FusionConfig = field(default_factory=FusionConfig)
    incidents: IncidentConfig = field(default_factory=IncidentConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    autoencoder: AutoencoderConfig = field(default_factory=AutoencoderConfig)
    outputs: OutputConfig = field(default_factory=OutputConfig)

    def validate(self) -> "DetectorConfig":
        for name, cls in GROUPS.items():
            group = getattr(self, name)
            if not isinstance(group, cls):
                raise ValueError(f"detector config: {name} must be a {cls.__name__} (set its fields as "
                                 f"{name}.FIELD), got {group!r}")
            group.validate()
        return self

    def replace(self, **changes: Any) -> "DetectorConfig":
        """A validated copy: ``replace(baseline=BaselineConfig(...))`` or ``replace(**{"baseline.warmup": 30})``."""
        return self.with_overrides(changes)

    def with_overrides(self, overrides: Mapping[str, Any]) -> "DetectorConfig":
        """A validated copy with ``overrides`` applied: dotted keys, whole groups, or nested mappings."""
        by_group: dict[str, dict[str, Any]] = {}
        whole: dict[str, Any] = {}
        for key, value in _flatten(overrides):
            group, _, name = key.partition(".")
            if not name and isinstance(value, GROUPS.get(group, ())):
                whole[group] = value
                continue
            cls = _group_class(key)
            by_group.setdefault(group, {})[name] = _coerce(value, _field(cls, key).default)
        new = dataclasses.replace(self, **whole)
        groups = {g: dataclasses.replace(getattr(new, g), **kv) for g, kv in by_group.items()}
        return dataclasses.replace(new, **groups).validate()

    def flat(self) -> dict[str, Any]:
        """Every setting by its dotted key."""
        return {f"{g}.{f.name}": getattr(getattr(self, g), f.name)
                for g in GROUPS for f in dataclasses.fields(GROUPS[g])}

    def overrides(self) -> dict[str, Any]:
        """The settings that differ from the defaults, by dotted key (what a run should print)."""
        base = DetectorConfig().flat()
        return {k: v for k, v in self.flat().items() if v != base[k]}


def parse_overrides(items: Iterable[str], *, flag: str = "--set") -> dict[str, Any]:
    """``["baseline.warmup=30", "autoencoder.enabled=false"]`` -> typed values by dotted key.

    Each value is read as its field's type (bool: 1/true/yes/on or 0/false/no/off; tuples: comma
    separated). ValueError names the item: not KEY=VALUE, an unknown or legacy key, an unreadable value.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ValueError(f"{flag} {item!r}: expected KEY=VALUE with KEY a dotted setting, e.g. baseline.warmup=30")
        default = _field(_group_class(key), key).default
        out[key] = _read(key, text.strip(), default, flag)
    return out


def _known() -> str:
    return ", ".join(sorted(DetectorConfig().flat()))


def _group_class(key: str) -> type:
    group, dot, _ = key.partition(".")
    if key in LEGACY_KEYS:
        raise ValueError(f"detector config: {key!r} is now {LEGACY_KEYS[key]!r}")
    if not dot and group in GROUPS:
        names = ", ".join(f"{group}.{f.name}" for f in dataclasses.fields(GROUPS[group]))
        raise ValueError(f"detector config: {key!r} is a group of settings; set one of {names}")
    if not dot or group not in GROUPS:
        raise ValueError(f"detector config: unknown setting {key!r}; known: {_known()}")
    return GROUPS[group]


def _field(cls: type, key: str) -> dataclasses.Field:
    name = key.partition(".")[2]
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise ValueError(f"detector config: unknown setting {key!r}; known: {_known()}")


def _flatten(mapping: Mapping[str, Any], prefix: str = ""):
    """Nested mappings (YAML) to dotted keys; a group object or a leaf value ends the walk."""
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            yield from _flatten(v, key + ".")
        else:
            yield key, v


def _coerce(value: Any, default: Any) -> Any:
    # YAML and JSON give lists and ints where the field holds a tuple and a float: same setting, same type
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _read(key: str, text: str, default: Any, flag: str) -> Any:
    try:
        if isinstance(default, bool):
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
            raise ValueError(text)
        if isinstance(default, int):
            number = float(text)             # 1e5 is an int setting's 100000
            if not number.is_integer():
                raise ValueError(text)
            return int(number)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, tuple):
            return tuple(float(x) for x in text.split(",") if x.strip())
        return text
    except ValueError:
        raise ValueError(f"{flag} {key}: cannot read {text!r} as {type(default).__name__}") from None
