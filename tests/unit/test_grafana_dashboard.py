"""docs/grafana/malleable.json against the metrics the code registers: every metric named in a
PromQL expression (panels and template variables) is a series the agent or the watcher exposes,
and every label a selector, a ``by``/``without`` clause or a legend uses is on that series.

The exposed series are read from the metrics objects themselves (``AgentMetrics``,
``WatcherMetrics``), fed one cycle and one poll the way the agent and the watcher feed them, so
labelled metrics have children and the names carry prometheus_client's suffixes (``_total``,
``_bucket``, ``_sum``, ``_count``, ``_created``) exactly as scraped."""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurm_plugin.daemon.metrics import AgentMetrics
from slurm_plugin.feed.metrics import WatcherMetrics
from slurm_plugin.feed.watcher import PollResult

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "docs" / "grafana" / "malleable.json"

# PromQL's functions, aggregation operators and keywords: identifiers that are not metrics.
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
    "clamp_max", "clamp_min", "count_over_time", "day_of_month", "day_of_week", "day_of_year",
    "days_in_month", "delta", "deriv", "exp", "floor", "histogram_quantile", "holt_winters",
    "hour", "idelta", "increase", "irate", "label_join", "label_replace", "last_over_time",
    "ln", "log10", "log2", "max_over_time", "min_over_time", "minute", "month",
    "predict_linear", "present_over_time", "quantile_over_time", "rate", "resets", "round",
    "scalar", "sgn", "sort", "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time",
    "sum_over_time", "time", "timestamp", "vector", "year",
}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                "count_values", "bottomk", "topk", "quantile"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "offset", "bool", "inf", "nan"}
NOT_METRICS = FUNCTIONS | AGGREGATIONS | KEYWORDS

IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
STRING = r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'"
SELECTOR = re.compile(rf"({IDENT})?\s*\{{((?:{STRING}|[^}}\"'])*)\}}")
MATCHER = re.compile(rf"\s*({IDENT})\s*(=~|!~|!=|=)\s*({STRING})\s*,?")
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
LEGEND_LABEL = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$")


def exposed_series() -> dict[str, set[str]]:
    """Series name -> its label names, as a scrape of the agent and of the watcher shows them."""
    agent = AgentMetrics("n1", per_job=True)   # the dashboard shows jobs: served with --metrics-per-job
    job = SimpleNamespace(job_id=7, allocation=frozenset({0, 1}))
    snapshot = SimpleNamespace(jobs=[job], problems=["p"], faults=["f"])
    usage = {7: SimpleNamespace(borrowed_core_s=1.0, lent_core_s=2.0)}
    for _ in range(2):       # the second cycle grows the node counters from the first
        agent.observe(SimpleNamespace(seconds=0.01, applied=[object()], failures=["x"],
                                      snapshot=snapshot,
                                      plan=SimpleNamespace(targets={7: frozenset({0, 1, 2})}),
                                      usage=usage))
        usage = {7: SimpleNamespace(borrowed_core_s=3.0, lent_core_s=4.0)}
    agent.bind_failures.labels(agent.node).inc()            # as MetricsServer counts them
    watcher = WatcherMetrics()
    watcher.observe(PollResult(nodes_written=["n1"], jobs=3, usage_closed=[7], wakes_sent=1,
                               seconds=0.1), wall=1.0, event_lag_s=0.2)
    watcher.observe(PollResult(error="down"), wall=2.0, event_lag_s=None)
    watcher.bind_failures.labels(watcher.node).inc()
    series: dict[str, set[str]] = {}
    for registry in (agent.registry, watcher.registry):
        for family in registry.collect():
            assert family.samples, f"{family.name} has no samples: feed it above"
            for sample in family.samples:
                series.setdefault(sample.name, set()).update(sample.labels)
    return series


SERIES = exposed_series()


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))          # collapsed rows hold their panels
    return out


def expressions(dashboard: dict) -> list[tuple[str, str, str]]:
    """(where, PromQL, legend) for every target and every query template variable."""
    out = []
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            out.append((f"panel {panel['title']!r} {target.get('refId')}", target["expr"],
                        target.get("legendFormat", "")))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = LABEL_VALUES.match(query)
            assert m, f"variable {var['name']}: expected label_values(..., label): {query}"
            out.append((f"variable {var['name']}", m.group(1), "{{%s}}" % m.group(2)))
    return out


def strip_grafana(expr: str) -> str:
    """Grafana's variables as PromQL would see them once substituted."""
    expr = re.sub(r"\[\s*\$\{?__\w+\}?\s*\]", "[5m]", expr)      # [$__rate_interval], [$__range]
    return re.sub(r"\$\{?\w+\}?", "x", expr)


def metrics_and_labels(expr: str) -> tuple[list[str], list[tuple[str | None, str]],
                                           list[str]]:
    """(metric names, (metric or None, label) used in selectors, labels in groupings)."""
    expr = strip_grafana(expr)
    selectors: list[tuple[str | None, str]] = []

    def selector(m: re.Match) -> str:
        name, body = m.group(1), m.group(2)
        rest = MATCHER.sub(lambda mm: selectors.append((name, mm.group(1))) or "", body)
        assert not rest.strip(), f"cannot read the matchers {body!r} in {expr!r}"
        return f" {name or ''} "

    bare = SELECTOR.sub(selector, expr)
    assert not re.search(STRING, bare), f"a string outside a selector in {expr!r}"
    grouping = []
    for m in GROUPING.finditer(bare):
        grouping += [label.strip() for label in m.group(2).split(",") if label.strip()]
    bare = GROUPING.sub(" ", bare)
    bare = re.sub(r"\[[^\]]*\]", " ", bare)                      # range durations
    bare = re.sub(r"\b\d+(\.\d+)?([eE][+-]?\d+)?[smhdwy]?\b", " ", bare)   # numbers
    names = []
    for m in re.finditer(rf"({IDENT})\s*(\()?", bare):
        ident, call = m.group(1), m.group(2)
        if call:
            assert ident in NOT_METRICS, f"unknown function {ident}() in {expr!r}"
        elif ident.lower() not in NOT_METRICS:
            names.append(ident)
    return names, selectors, grouping


def problems(dashboard: dict, series: dict[str, set[str]]) -> list[str]:
    found = []
    for where, expr, legend in expressions(dashboard):
        names, selectors, grouping = metrics_and_labels(expr)
        if not names:
            found.append(f"{where}: no metric in {expr!r}")
        for name in names:
            if name not in series:
                found.append(f"{where}: {name} is not a series the code exposes")
        labels = set().union(*(series.get(n, set()) for n in names))
        for name, label in selectors:
            if name is None:
                found.append(f"{where}: a selector without a metric name in {expr!r}")
            elif name in series and label not in series[name]:
                found.append(f"{where}: {name} has no label {label!r} "
                             f"(it has {sorted(series[name])})")
        for label in grouping:
            if label not in labels:
                found.append(f"{where}: grouping by {label!r}, on none of {names}")
        for label in LEGEND_LABEL.findall(legend):
            if label not in labels:
                found.append(f"{where}: legend uses {label!r}, on none of {names}")
    return found


def test_the_series_read_from_the_code_carry_prometheus_client_suffixes():
    assert SERIES["malleable_job_cores"] == {"node", "job", "kind"}
    assert SERIES["malleable_resizes_total"] == {"node"}
    assert {"malleable_cycle_seconds_bucket", "malleable_cycle_seconds_sum",
            "malleable_cycle_seconds_count"} <= set(SERIES)
    assert SERIES["malleable_cycle_seconds_bucket"] == {"node", "le"}
    assert SERIES["malleable_watcher_polls_total"] == {"result"}
    assert "malleable_resizes" not in SERIES and "malleable_cycle_seconds" not in SERIES


def test_it_is_a_dashboard_with_panels_and_the_site_chooses_datasource_and_node():
    dashboard = load()
    assert dashboard["title"] and dashboard["uid"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["node"]["type"] == "query"
    assert "label_values(" in json.dumps(variables["node"]["query"])
    graphs = [p for p in all_panels(dashboard) if p["type"] != "row"]
    assert len(graphs) >= 8
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in graphs:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_metric_and_label_in_the_dashboard_is_one_the_code_exposes():
    assert problems(load(), SERIES) == []


def test_the_panels_cover_the_agent_and_the_watcher():
    used = {n for _, expr, _ in expressions(load()) for n in metrics_and_labels(expr)[0]}
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in SERIES}
    unused = {f for f in families
              if not any(re.sub(r"_(total|bucket|sum|count)$", "", u) == f for u in used)}
    assert unused == set(), f"metrics no panel shows: {sorted(unused)}"


@pytest.mark.parametrize("typo, expected", [
    ("malleable_resizes_total", "malleable_resize_total is not a series"),
    ("malleable_cycle_seconds_bucket", "malleable_cycle_seconds is not a series"),
    ('kind="current"', "malleable_job_cores has no label 'kinds'"),
    ("sum by (le, node)", "grouping by 'nodes'"),
    ("{{node}} job {{job}} held", "legend uses 'jobb'"),
    ("label_values(malleable_cycle_seconds_count, node)",
     "malleable_cycle_second_count is not a series"),
])
def test_a_typo_in_a_name_or_a_label_is_caught(typo, expected):
    broken = {"malleable_resizes_total": "malleable_resize_total",
              "malleable_cycle_seconds_bucket": "malleable_cycle_seconds",
              'kind="current"': 'kinds="current"',
              "sum by (le, node)": "sum by (le, nodes)",
              "{{node}} job {{job}} held": "{{node}} job {{jobb}} held",
              "label_values(malleable_cycle_seconds_count, node)":
                  "label_values(malleable_cycle_second_count, node)"}[typo]
    dashboard = load()
    fields = [(t, key) for panel in all_panels(dashboard) for t in panel.get("targets", [])
              for key in ("expr", "legendFormat")]
    fields += [(v["query"], "query") for v in dashboard["templating"]["list"]
               if v["type"] == "query"]
    where, key = next((d, k) for d, k in fields if typo in d.get(k, ""))
    where[key] = where[key].replace(typo, broken, 1)
    found = problems(dashboard, SERIES)
    assert any(expected in p for p in found), found


def test_the_promql_reader_finds_names_and_ignores_functions_keywords_and_labels():
    names, selectors, grouping = metrics_and_labels(
        'histogram_quantile(0.95, sum by (le, node) (rate(a_bucket{node=~"$node", '
        'x!="y,}"}[$__rate_interval]))) / ignoring(z) b_total offset 5m > bool 1e3 '
        'and on(node) time() - c')
    assert names == ["a_bucket", "b_total", "c"]
    assert selectors == [("a_bucket", "node"), ("a_bucket", "x")]
    assert grouping == ["le", "node", "z", "node"]
    with pytest.raises(AssertionError, match="unknown function"):
        metrics_and_labels("rated(a_total[5m])")
