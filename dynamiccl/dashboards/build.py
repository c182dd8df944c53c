"""The five DynamICCL Grafana dashboards, as code (grafana-foundation-sdk==0.0.21).

``dynamiccl dashboards build`` writes :func:`render_all` to ``dynamiccl/dashboards/json/``; the JSON is committed
and provisioned by Grafana (``deploy/grafana/provisioning/dashboards/``); ``dynamiccl dashboards check``
(and a test) fails when the committed JSON differs from what this module generates.

Every panel query names only metrics declared by the services (``dynamiccl/collector/metrics.py``,
``dynamiccl/detector/metrics.py``, ``dynamiccl/retuner/metrics.py``) or recorded by ``deploy/prometheus/rules/`` — a test
checks that too. Each dashboard has the variables ``datasource`` (any Prometheus data source: every
query names ``${datasource}``, never a fixed uid), ``job_id``, ``comm`` (communicator) and ``collective``;
every service uses the collector's label names, so one matcher serves all panels. Panel ids are stable
(assigned in definition order).

>>> docs = render_all()
>>> sorted(docs)
['gpu.json', 'overview.json', 'ranks.json', 'regimes.json', 'retuner.json']
>>> d = json.loads(docs["overview.json"])
>>> d["uid"], [v["name"] for v in d["templating"]["list"]]
('dynamiccl-overview', ['datasource', 'job_id', 'comm', 'collective'])
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Callable

from grafana_foundation_sdk.builders import (bargauge, common, dashboard, heatmap, prometheus, stat, statetimeline,
                                             table, timeseries)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import prometheus as prom_m
from grafana_foundation_sdk.models.common import DataSourceRef

from dynamiccl.dashboards.names import FOLDER_TITLE, FOLDER_UID, REGIME_TAG

__all__ = ["DASHBOARDS", "render_all", "render", "PROMETHEUS", "FOLDER_UID", "FOLDER_TITLE",
           "REGIME_TAG"]

PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${datasource}")   # the dashboard's data source variable
GRAFANA = DataSourceRef(type_val="grafana", uid="-- Grafana --")
RI = "$__rate_interval"

# label filters
F = 'job_id=~"$job_id",comm=~"$comm",collective=~"$collective"'          # collector, per collective
FJ = 'job_id=~"$job_id"'
FC = 'job_id=~"$job_id",comm=~"$comm"'
FR = 'comm=~"$comm",collective=~"$collective"'                            # retuner (no job label)
SIZE = "2^{{size_bucket}} B"


# ------------------------------------------------------------------------------------------------
# small helpers over the SDK builders
# ------------------------------------------------------------------------------------------------
def q(expr: str, legend: str = "", *, ref: str = "A", fmt: str | None = None, instant: bool = False):
    t = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(PROMETHEUS)
    if legend:
        t = t.legend_format(legend)
    if fmt:
        t = t.format(prom_m.PromQueryFormat(fmt))
    if instant:
        t = t.instant()
    return t


def _legend():
    return (common.VizLegendOptions().show_legend(True).display_mode(common_m.LegendDisplayMode.TABLE)
            .placement(common_m.LegendPlacement.BOTTOM).calcs(["lastNotNull", "max"]))


def _thresholds(*steps: tuple[float | None, str]):
    return dashboard.ThresholdsConfig().mode(dash_m.ThresholdsMode.ABSOLUTE).steps(
        [dash_m.Threshold(value=v, color=c) for v, c in steps])


def ts(title: str, unit: str, *targets, desc: str = "", w: int = 12, h: int = 8, bars: bool = False,
       threshold: float | None = None):
    p = (timeseries.Panel().title(title).unit(unit).datasource(PROMETHEUS).span(w).height(h)
         .legend(_legend()).targets(list(targets)))
    if desc:
        p = p.description(desc)
    if bars:
        p = p.draw_style(common_m.GraphDrawStyle.BARS).fill_opacity(60)
    if threshold is not None:
        p = (p.thresholds(_thresholds((None, "green"), (threshold, "red")))
             .thresholds_style(common.GraphThresholdsStyleConfig().mode(common_m.GraphThresholdsStyleMode.LINE)))
    return p


def stat_panel(title: str, unit: str, *targets, desc: str = "", w: int = 6, h: int = 4, mappings=None):
    p = (stat.Panel().title(title).unit(unit).datasource(PROMETHEUS).span(w).height(h).targets(list(targets))
         .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False)))
    if desc:
        p = p.description(desc)
    if mappings:
        p = p.mappings(mappings)
    return p


def _value_text(pairs: dict[str, tuple[str, str]]):
    return [dash_m.ValueMap(options={k: dash_m.ValueMappingResult(text=t, color=c) for k, (t, c) in pairs.items()})]


# ------------------------------------------------------------------------------------------------
@dataclass
class Spec:
    uid: str
    title: str
    description: str
    rows: list[tuple[str, list]] = field(default_factory=list)   # (row title, panel builders)
    extra_variables: list = field(default_factory=list)
    tags: tuple[str, ...] = ()


def _variables() -> list:
    def var(name: str, label: str, query: str):
        return (dashboard.QueryVariable(name).label(label).datasource(PROMETHEUS).query(query)
                .definition(query).multi(True).include_all(True).all_value(".*")
                .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dash_m.VariableSort.ALPHABETICAL_ASC))
    source = (dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
              .regex("").multi(False).include_all(False))
    return [
        source,
        var("job_id", "Job", "label_values(dynamiccl_collectives_total, job_id)"),
        var("comm", "Communicator", 'label_values(dynamiccl_collectives_total{job_id=~"$job_id"}, comm)'),
        var("collective", "Collective",
            'label_values(dynamiccl_collectives_total{job_id=~"$job_id",comm=~"$comm"}, collective)'),
    ]


def _annotations() -> list:
    return [
        dashboard.AnnotationQuery().name("Regime-change alerts").datasource(PROMETHEUS).enable(True)
        .icon_color("red").expr(f'ALERTS{{alertname="NcclRegimeChange",alertstate="firing",{FJ}}}')
        .title_format("{{kind}} regime change").text_format("{{comm}}: {{where}}")
        .tag_keys("kind,comm,where").step("10s").use_value_for_time(False),
        dashboard.AnnotationQuery().name("Regime changes (pushed)").datasource(GRAFANA).enable(True)
        .icon_color("orange").target(dashboard.AnnotationTarget().type("tags").tags([REGIME_TAG]).limit(200)
                                     .match_any(False)),
    ]


def render(spec: Spec) -> str:
    b = (dashboard.Dashboard(spec.title).uid(spec.uid).description(spec.description)
         .tags(["dynamiccl", "nccl", *spec.tags]).refresh("10s").time("now-30m", "now").timezone("browser")
         .tooltip(dash_m.DashboardCursorSync.CROSSHAIR).readonly()
         .variables([*_variables(), *spec.extra_variables]).annotations(_annotations()))
    next_id = 1
    for row_title, panels in spec.rows:
        # an expanded row: its panels follow it at top level (Grafana reads row.panels only when collapsed)
        b = b.with_row(dashboard.Row(row_title).id(next_id))
        next_id += 1
        for p in panels:
            b = b.with_panel(p.id(next_id))
            next_id += 1
    return json.dumps(b.build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


# ------------------------------------------------------------------------------------------------
# the five dashboards
# ------------------------------------------------------------------------------------------------
def overview() -> Spec:
    lat = "job_comm_coll_size:dynamiccl_collective_duration_seconds"
    return Spec("dynamiccl-overview", "DynamICCL / Job overview",
                "Bus bandwidth and latency per collective and size bucket, records/s, drops.", [
        ("Bandwidth and latency", [
            ts("Bus bandwidth by collective and size", "Bps",
               q(f"dynamiccl_bus_bandwidth_bytes_per_second{{{F}}}", f"{{{{collective}}}} {{{{comm}}}} {SIZE}"),
               desc="nccl-tests busbw of the last 1 s window (record-weighted median per key)."),
            ts("Algorithm bandwidth by collective and size", "Bps",
               q(f"dynamiccl_algorithm_bandwidth_bytes_per_second{{{F}}}", f"{{{{collective}}}} {{{{comm}}}} {SIZE}")),
            ts("Latency p50 by collective and size", "s",
               q(f"{lat}:p50_1m{{{F}}}", f"{{{{collective}}}} {{{{comm}}}} {SIZE}")),
            ts("Latency p99 by collective and size", "s",
               q(f"{lat}:p99_1m{{{F}}}", f"{{{{collective}}}} {{{{comm}}}} {SIZE}")),
        ]),
        ("Distribution", [
            heatmap.Panel().title("Latency heatmap (all selected collectives)").datasource(PROMETHEUS)
            .span(12).height(9).calculate(False).targets([q(
                f"sum by (le) (job_comm_coll_size_le:dynamiccl_collective_duration_seconds_bucket:rate1m{{{F}}})",
                "{{le}}", fmt="heatmap")])
            .y_axis(heatmap.YAxisConfig().unit("s")).rows_frame(heatmap.RowsHeatmapOptions().layout(
                common_m.HeatmapCellLayout.LE)),
            ts("Bytes/s by collective", "Bps",
               q(f"sum by (collective) (rate(dynamiccl_collective_bytes_total{{{F}}}[{RI}]))", "{{collective}}"),
               h=9),
        ]),
        ("Volume and drops", [
            ts("Records/s (collector)", "ops",
               q(f"sum(rate(dynamiccl_collector_records_received_total[{RI}]))", "received"),
               q(f"sum(rate(dynamiccl_collector_records_aggregated_total[{RI}]))", "aggregated", ref="B"),
               w=8),
            ts("Operations/s by collective, algorithm, protocol", "ops",
               q(f"sum by (collective, algo, proto) (rate(dynamiccl_collectives_total{{{F}}}[{RI}]))",
                 "{{collective}} {{algo}}/{{proto}}"), w=8),
            ts("Dropped records/s", "ops",
               q(f"sum by (reason) (rate(dynamiccl_collector_records_dropped_total[{RI}]))", "collector {{reason}}"),
               q(f"sum by (reason) (rate(dynamiccl_plugin_records_dropped_total{{{FJ}}}[{RI}]))", "plugin {{reason}}",
                 ref="B"), w=8),
            ts("Plugin drop ratio by host (5m)", "percentunit",
               q(f"job_host:dynamiccl_plugin_records_dropped:ratio_rate5m{{{FJ}}}", "{{host}}"),
               threshold=0.01, desc="Alert NcclPluginDropRateHigh fires above 1 % for 2m.", w=24, h=6),
        ]),
    ])


def regimes() -> Spec:
    return Spec("dynamiccl-regimes", "DynamICCL / Regimes",
                "Detector view: regime timeline, CUSUM statistics, autoencoder score; alerts as annotations.", [
        ("Regime changes", [
            statetimeline.Panel().title("Regime timeline (1 = active, 0 = recovered), per communicator")
            .datasource(PROMETHEUS).span(16).height(7).targets([q(
                f"dynamiccl_detector_regime_active{{{FC}}}", "{{kind}} {{comm}} {{where}}")])
            .mappings(_value_text({"1": ("active", "red"), "0": ("recovered", "green")})).merge_values(True),
            ts("Magnitude of active changes (new/old latency)", "short",
               q(f"dynamiccl_detector_regime_magnitude{{{FC}}}", "{{kind}} {{comm}} {{where}}"), threshold=1.2,
               w=8, h=7),
            ts("Regime changes by kind", "short",
               q(f"sum by (kind) (increase(dynamiccl_detector_regime_changes_total[{RI}]))", "{{kind}}"),
               bars=True, w=8),
            ts("Detection delay (p50, p90 since start)", "s",
               q("histogram_quantile(0.5, sum by (le) (dynamiccl_detector_detection_delay_seconds_bucket))", "p50"),
               q("histogram_quantile(0.9, sum by (le) (dynamiccl_detector_detection_delay_seconds_bucket))", "p90",
                 ref="B"), w=8),
            table.Panel().title("Firing regime-change alerts").datasource(PROMETHEUS).span(8).height(8)
            .targets([q(f'ALERTS{{alertname="NcclRegimeChange",alertstate="firing",{FJ}}}', fmt="table",
                        instant=True)]),
        ]),
        ("Detector statistics", [
            ts("CUSUM statistic / threshold (>= 1 fires)", "short",
               q(f"dynamiccl_detector_cusum_statistic{{{F}}}", f"{{{{collective}}}} {{{{comm}}}} {SIZE}"),
               threshold=1.0),
            ts("Autoencoder anomaly score", "short",
               q(f"dynamiccl_detector_autoencoder_score{{{FJ}}}", "{{job_id}}")),
            ts("Detector windows/s", "ops",
               q(f"sum(rate(dynamiccl_detector_windows_received_total[{RI}]))", "received"),
               q(f"sum by (reason) (rate(dynamiccl_detector_windows_dropped_total[{RI}]))", "dropped {{reason}}",
                 ref="B"), w=24, h=6),
        ]),
    ], tags=("detector",))


def ranks() -> Spec:
    return Spec("dynamiccl-ranks", "DynamICCL / Ranks and hosts",
                "Cross-rank spread, straggler ranks (arrival skew), per-host view.", [
        ("Ranks", [
            ts("Cross-rank duration spread (max - min) by collective and size", "s",
               q(f"dynamiccl_collective_spread_seconds{{{F}}}", f"{{{{collective}}}} {{{{comm}}}} {SIZE}")),
            bargauge.Panel().title("Straggler ranks: largest arrival skew (last window)").datasource(PROMETHEUS)
            .unit("s").span(12).height(8).targets([q(
                f"topk(8, max by (comm, rank) (dynamiccl_rank_skew_seconds{{{FC}}}))", "{{comm}} rank {{rank}}",
                instant=True)]),
            ts("Arrival skew by rank (vs instance median)", "s",
               q(f"dynamiccl_rank_skew_seconds{{{FC}}}", "{{comm}} rank {{rank}}"), w=24),
        ]),
        ("Hosts", [
            ts("Operations/s by host", "ops",
               q(f"sum by (host) (rate(dynamiccl_collective_duration_seconds_count{{{F}}}[{RI}]))", "{{host}}"),
               w=8),
            ts("Latency p50 by host", "s",
               q(f"histogram_quantile(0.5, sum by (host, le) (rate(dynamiccl_collective_duration_seconds_bucket"
                 f"{{{F}}}[{RI}])))", "{{host}}"), w=8),
            ts("Seconds since the newest operation, by host", "s",
               q(f"time() - max by (host) (dynamiccl_last_event_timestamp_seconds{{{FJ}}})", "{{host}}"),
               desc="Event time (GPU clock) of the newest record from each host; grows when a host hangs.", w=8),
            ts("Plugin records sent/s and reconnects by host", "ops",
               q(f"sum by (host) (rate(dynamiccl_plugin_records_sent_total{{{FJ}}}[{RI}]))", "{{host}} sent"),
               q(f"sum by (host) (increase(dynamiccl_plugin_reconnects_total{{{FJ}}}[{RI}]))", "{{host}} reconnects",
                 ref="B"), w=24, h=6),
        ]),
    ])


def retuner() -> Spec:
    return Spec("dynamiccl-retuner", "DynamICCL / Retuner",
                "Active tuner configuration per collective and size, pushes, rollbacks, measured gain.", [
        ("Configuration", [
            table.Panel().title("Active configuration per communicator, collective, size").datasource(PROMETHEUS)
            .span(12).height(8).targets([q(f"dynamiccl_retuner_active_config_info{{{FR}}}", fmt="table",
                                           instant=True)]),
            stat_panel("Active config version", "none", q("max(dynamiccl_retuner_active_config_version)"), h=4),
            stat_panel("Mode", "none", q("max(dynamiccl_retuner_dry_run)"), h=4,
                       mappings=_value_text({"1": ("dry run", "blue"), "0": ("live", "green")})),
        ]),
        ("Actions and effect", [
            ts("Pushes and rollbacks", "short",
               q(f"sum(increase(dynamiccl_retuner_pushes_total[{RI}]))", "pushes"),
               q(f"sum(increase(dynamiccl_retuner_rollbacks_total[{RI}]))", "rollbacks", ref="B"), bars=True, w=8),
            ts("Decisions by action", "short",
               q(f"sum by (action) (increase(dynamiccl_retuner_decisions_total[{RI}]))", "{{action}}"),
               bars=True, w=8),
            ts("Measured gain (old/new latency)", "short",
               q(f"dynamiccl_retuner_measured_gain_ratio{{{FR}}}", f"{{{{collective}}}} {{{{comm}}}} {SIZE}"),
               threshold=1.0, w=8),
        ]),
    ], tags=("retuner",))


def gpu() -> Spec:
    H = 'host=~"$host"'
    host_var = (dashboard.QueryVariable("host").label("Host").datasource(PROMETHEUS)
                .query("label_values(dynamiccl_gpu_telemetry_up, host)")
                .definition("label_values(dynamiccl_gpu_telemetry_up, host)").multi(True).include_all(True)
                .all_value(".*").refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED))
    g = "{{host}} GPU {{gpu}}"
    return Spec("dynamiccl-gpu", "DynamICCL / GPU telemetry",
                "Per-GPU NVLink/PCIe throughput, SM clock, power, temperature, XID errors (NVML, via the collector).", [
        ("Status", [
            stat_panel("NVML telemetry", "none", q(f"min(dynamiccl_gpu_telemetry_up{{{H}}})"), w=8,
                       mappings=_value_text({"1": ("ok", "green"), "0": ("no NVIDIA driver", "orange")}),
                       desc="0 when the collector found no NVIDIA driver (it says so once in its log)."),
            stat_panel("GPUs", "none", q(f"count(dynamiccl_gpu_info{{{H}}})"), w=8),
            stat_panel("NVML query errors (1h)", "none",
                       q(f"sum(increase(dynamiccl_gpu_telemetry_errors_total{{{H}}}[1h]))"), w=8),
        ]),
        ("Interconnect", [
            ts("NVLink throughput", "Bps",
               q(f"rate(dynamiccl_gpu_nvlink_bytes_total{{{H}}}[{RI}])", f"{g} {{{{direction}}}}")),
            ts("PCIe throughput", "Bps",
               q(f"dynamiccl_gpu_pcie_throughput_bytes_per_second{{{H}}}", f"{g} {{{{direction}}}}")),
        ]),
        ("Device", [
            ts("SM clock", "hertz", q(f"dynamiccl_gpu_sm_clock_hertz{{{H}}}", g), w=8),
            ts("Power", "watt", q(f"dynamiccl_gpu_power_watts{{{H}}}", g), w=8),
            ts("Temperature", "celsius", q(f"dynamiccl_gpu_temperature_celsius{{{H}}}", g), w=8),
            ts("XID errors", "short",
               q(f"increase(dynamiccl_gpu_xid_errors_total{{{H}}}[{RI}])", g), bars=True, w=12),
            stat_panel("Last XID code", "none", q(f"dynamiccl_gpu_last_xid{{{H}}}", g), w=12, h=8),
        ]),
    ], extra_variables=[host_var], tags=("gpu",))


#: file name → spec factory
DASHBOARDS: dict[str, Callable[[], Spec]] = {
    "overview.json": overview, "regimes.json": regimes, "ranks.json": ranks, "retuner.json": retuner,
    "gpu.json": gpu,
}


def render_all() -> dict[str, str]:
    """File name → dashboard JSON text (sorted keys, 2-space indent, trailing newline)."""
    with warnings.catch_warnings():   # the SDK flags the v1 dashboard model as deprecated (v2 is Grafana 12+ only)
        warnings.simplefilter("ignore", DeprecationWarning)
        return {name: render(factory()) for name, factory in DASHBOARDS.items()}
