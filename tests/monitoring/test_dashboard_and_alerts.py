"""The Grafana dashboard (deploy/grafana) and the alerting rules
(deploy/monitoring) ask only for what the real server exports.

A server serving the examples is driven through each request outcome, then
its /metrics is scraped. Every metric the dashboard's queries and the rules'
expressions select must be there, with every label they match, group by or
print, and every label value they match exactly; promtool checks the rules
and runs their unit tests (deploy/monitoring/alerts.test.yaml).
"""

import json
import pathlib
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "testing"))
from server_process import ServerProcess, built, copy_tree  # noqa: E402

BIN = ROOT / "bazel-bin"
DASHBOARD = ROOT / "deploy" / "grafana" / "precompile-serve.json"
RULES = ROOT / "deploy" / "monitoring" / "alerts.rules.yaml"
RULE_TESTS = ROOT / "deploy" / "monitoring" / "alerts.test.yaml"

# Labels Prometheus (or the Prometheus Operator) adds to what it scrapes.
TARGET_LABELS = {"namespace", "pod", "job", "instance", "container", "endpoint", "service"}
# PromQL's own words, the functions and the aggregations used here.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "rate", "increase", "histogram_quantile", "and", "or",
    "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left", "group_right",
}
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r"(\w+)\s*(=~|!~|!=|=)\s*\"([^\"]*)\"")


def parse_promql(expr: str):
    """(selected metrics: name -> list of (label, op, value) matchers,
    labels named in grouping clauses) of a PromQL expression."""
    grouping = {label.strip() for m in GROUPING.finditer(expr)
                for label in m.group(2).split(",") if label.strip()}
    rest = GROUPING.sub(" ", expr)
    metrics = {}
    for m in SELECTOR.finditer(rest):
        metrics.setdefault(m.group(1), []).extend(MATCHER.findall(m.group(2)))
    rest = SELECTOR.sub(" ", rest)
    rest = re.sub(r"\[[^\]]*\]|\"[^\"]*\"", " ", rest)  # ranges, strings
    for word in re.findall(r"(?<![\w.])[a-zA-Z_:][\w:]*", rest):
        if word not in PROMQL_WORDS:
            metrics.setdefault(word, [])
    return metrics, grouping


def parse_exposition(text: str):
    """metric name -> {label name -> set of values} of Prometheus text."""
    series = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+\S+", line)
        assert m, f"not Prometheus text: {line!r}"
        labels = series.setdefault(m.group(1), {})
        for name, value in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""):
            labels.setdefault(name, set()).add(value)
    return series


def dashboard_queries():
    """(panel title, expr, legendFormat) of every query of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [(p["title"], t["expr"], t.get("legendFormat", ""))
               for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["definition"])
            assert inner, f"variable {variable['name']}: {variable['definition']}"
            queries.append((f"variable {variable['name']}", f"{inner.group(1)}{{{inner.group(2)}!=\"\"}}",
                            ""))
    return queries


def alert_rules():
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def http_json(url, body=None):
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """What /metrics exports after a request of every outcome."""
    root = tmp_path_factory.mktemp("monitoring") / "repository"
    for name in ("mlp", "loop"):
        copy_tree(built(BIN / "examples" / name), root / name / "1")
    # A model whose load fails: the load-failure series exist once one has.
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "MANIFEST.pb").write_bytes(b"not a manifest")
    server = ServerProcess(built(BIN / "server" / "precompile_server"), root, ["--metrics_port=0"],
                           ready_pattern=r"event=not_ready|event=ready")
    try:
        metrics_port = int(server.await_output(r"event=listening .*metrics_port=(\d+)"))
        base = f"http://{server.http_address}/v2/models"

        def infer(model, rows, parameters=None, datatype="FP32"):
            body = {"inputs": [{"name": "x", "shape": [rows, 4], "datatype": datatype,
                                "data": [0.5] * (rows * 4)}]}
            if parameters:
                body["parameters"] = parameters
            return http_json(f"{base}/{model}/infer", body)

        outcomes = {
            "variant": infer("mlp", 8),
            "eager_fallback": infer("loop", 8, {"n": 1}),
            "refused": infer("mlp", 1),
            "invalid": infer("mlp", 8, datatype="INT64"),
            "unknown model": infer("nosuch", 8),
        }
        assert outcomes["variant"][0] == 200, outcomes
        assert outcomes["eager_fallback"][1]["parameters"]["precompile_outcome"] == "eager_fallback"
        assert [outcomes[o][0] for o in ("refused", "invalid", "unknown model")] == [400, 400, 404], outcomes
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        series = parse_exposition(text)
        # What PrecompileModelNotReady reads: 0 for the model that failed.
        ready = dict(re.findall(r'^precompile_model_ready\{model="(\w+)"\} (\S+)$', text, re.M))
        assert ready == {"mlp": "1", "loop": "1", "broken": "0"}, text
    finally:
        assert server.stop() == 0, server.log()
    return series


def check_expression(where, expr, exported, printed=()):
    """What `expr` (and the labels in `printed`) asks of `exported`; a list
    of problems."""
    problems = []
    metrics, grouping = parse_promql(expr)
    assert metrics, f"{where}: no metric in {expr!r}"
    available = set(TARGET_LABELS)
    for name, matchers in metrics.items():
        if name not in exported:
            problems.append(f"{where}: the server exports no metric {name}")
            continue
        labels = exported[name]
        available |= set(labels)
        for label, op, value in matchers:
            if label not in labels and label not in TARGET_LABELS:
                problems.append(f"{where}: {name} has no label {label} (it has {sorted(labels)})")
            elif label in labels and op in ("=", "=~") and "$" not in value:
                wanted = value.split("|") if op == "=~" else [value]
                missing = [v for v in wanted if v not in labels[label]]
                if missing:
                    problems.append(f"{where}: {name} has no {label} {missing} "
                                    f"(it has {sorted(labels[label])})")
    for label in set(grouping) | set(printed):
        if label not in available:
            problems.append(f"{where}: no metric of {expr!r} has the label {label}")
    return problems


def test_every_dashboard_query_selects_what_the_server_exports(exported):
    problems = []
    queries = dashboard_queries()
    assert len(queries) >= 15
    for title, expr, legend in queries:
        printed = re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)
        problems += check_expression(f"panel '{title}'", expr, exported, printed)
    assert not problems, "\n".join(problems)


def test_every_alert_selects_what_the_server_exports(exported):
    problems = []
    rules = alert_rules()
    assert len(rules) >= 6
    for rule in rules:
        templates = " ".join(rule.get("annotations", {}).values())
        printed = re.findall(r"\$labels\.(\w+)", templates)
        problems += check_expression(f"alert {rule['alert']}", rule["expr"], exported, printed)
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_misspelt_metric_label_or_value(exported):
    # The checks above are only as good as these: each kind of slip is caught.
    good = 'sum by (model) (rate(precompile_requests_total{outcome="refused"}[5m]))'
    assert check_expression("good", good, exported, ["model"]) == []
    for slip in (good.replace("requests_total", "request_total"),
                 good.replace("by (model)", "by (modell)"),
                 good.replace('outcome="refused"', 'outcome="refusd"'),
                 good.replace('outcome="refused"', 'result="refused"')):
        assert check_expression("slip", slip, exported, ["model"]), slip
    assert check_expression("legend", good, exported, ["frame"]), "a legend label that is gone"


def test_the_dashboard_imports_into_grafana():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        # Every query goes to the datasource the importer picks.
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), panel["title"]
        assert panel["targets"] and panel.get("description"), panel["title"]


def promtool() -> str:
    """promtool, from tools/setup.sh or the PATH."""
    for candidate in (ROOT / ".venv" / "bin" / "promtool", shutil.which("promtool")):
        if candidate and pathlib.Path(candidate).exists():
            return str(candidate)
    pytest.fail("promtool is missing: run tools/setup.sh (it unpacks Debian's prometheus package)")


def test_promtool_checks_the_rules_and_their_unit_tests_pass():
    check = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in check.stdout
    tests = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True,
                           text=True, cwd=RULE_TESTS.parent)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    # Every alert has a test that makes it fire.
    tested = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels", RULE_TESTS.read_text()))
    assert tested == {r["alert"] for r in alert_rules()}, tested
