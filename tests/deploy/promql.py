"""The PromQL expressions that the deployment files evaluate, ready to send to a Prometheus.

`dashboard_and_alert_exprs(repo_root)` collects every target expression of the Grafana dashboard
and every rule expression of the Prometheus alert rules, with Grafana's template variables
replaced by values a plain Prometheus query accepts (`$model_name` -> `.*`,
`$__rate_interval` -> `1m`). An e2e test can send each one to `/api/v1/query` of a Prometheus
that scraped a real server and check that it parses and returns data.

This file has no test of its own; import it by path, e.g.

    sys.path.insert(0, str(repo_root / "tests" / "deploy"))
    from promql import dashboard_and_alert_exprs
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

DASHBOARD = Path("deploy/grafana/dashboards/eagle-serve.json")
ALERTS = Path("deploy/prometheus/alerts.yml")

# Grafana variables used by the dashboard -> a value Prometheus accepts in their place.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$model_name": ".*",
}

# Metric names in an expression: every series this project exports starts with `eagle_`
# (digits included: eagle_e2e_request_latency_seconds).
METRIC_NAME = re.compile(r"\beagle_[a-z0-9_]+")


def substitute_grafana_variables(expr: str) -> str:
    """Replace the dashboard's template variables (longest name first, so `$__rate_interval`
    is never cut short by a shorter variable)."""
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VARIABLES[name])
    return expr


def iter_panels(panels: list[dict]) -> Iterator[dict]:
    """Every panel of a dashboard, including those nested in (collapsed) rows."""
    for panel in panels:
        yield panel
        yield from iter_panels(panel.get("panels", []))


def dashboard_exprs(repo_root: Path) -> list[tuple[str, str]]:
    """(source, raw expr) for each dashboard target; source is 'dashboard:<panel title>/<refId>'."""
    dashboard = json.loads((repo_root / DASHBOARD).read_text())
    exprs = []
    for panel in iter_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            if target.get("expr"):
                source = f"dashboard:{panel['title']}/{target.get('refId', '?')}"
                exprs.append((source, target["expr"]))
    return exprs


def alert_exprs(repo_root: Path) -> list[tuple[str, str]]:
    """(source, expr) for each rule; source is 'alerts:<group>/<alert or record name>'."""
    rules = yaml.safe_load((repo_root / ALERTS).read_text())
    exprs = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule.get("record")
            exprs.append((f"alerts:{group['name']}/{name}", rule["expr"]))
    return exprs


def dashboard_and_alert_exprs(repo_root: str | Path) -> list[tuple[str, str]]:
    """Every PromQL expression of the dashboard and the alert rules, variables substituted."""
    repo_root = Path(repo_root)
    return [
        (source, substitute_grafana_variables(expr).strip())
        for source, expr in dashboard_exprs(repo_root) + alert_exprs(repo_root)
    ]
