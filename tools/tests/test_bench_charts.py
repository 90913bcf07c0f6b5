"""bench/charts/ shows what bench/results/ recorded: the committed figures are
what bench/charts.py draws from the results today, and each point carries
the recorded value of its series.
"""

import importlib.util
import json
import pathlib
import re
import shutil
import xml.etree.ElementTree as ElementTree

ROOT = pathlib.Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"


def charts_module():
    spec = importlib.util.spec_from_file_location("charts", ROOT / "bench" / "charts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def point_values(svg_path):
    """{(what, unit): value} of every point, from its title:
    'precompile-serve, 8 clients: 19 057 req/s' -> {('precompile-serve, 8 clients', 'req/s'): 19057}."""
    values = {}
    for title in ElementTree.parse(svg_path).iter(f"{SVG}title"):
        what, _, value = title.text.rpartition(": ")
        number, unit = re.fullmatch(r"([\d .]+) (\S+)", value).groups()
        values[(what, unit)] = float(number.replace(" ", ""))
    return values


def test_the_committed_figures_are_drawn_from_the_recorded_results():
    assert charts_module().main(["charts.py", "--check"]) == 0, (
        "run python3 bench/charts.py and commit bench/charts/")


def test_a_changed_result_makes_the_check_fail(tmp_path):
    charts = charts_module()
    results = tmp_path / "results"
    shutil.copytree(ROOT / "bench" / "results" / "2026-11-30", results / "2026-11-30")
    shutil.copytree(ROOT / "bench" / "results" / "2026-12-01", results / "2026-12-01")
    shutil.copytree(ROOT / "bench" / "results" / "2026-12-02", results / "2026-12-02")
    path = results / "2026-11-30" / "e2e_real_models.json"
    data = json.loads(path.read_text())
    data["small"]["8"]["ours"]["rps"] *= 2
    path.write_text(json.dumps(data))
    charts.RESULTS = str(results)
    assert charts.main(["charts.py", "--check"]) == 1


def test_each_point_carries_its_series_recorded_value():
    recorded = json.loads((ROOT / "bench/results/2026-11-30/e2e_real_models.json").read_text())
    drawn = point_values(ROOT / "bench/charts/end_to_end_small.svg")
    series = {"precompile-serve": "ours", "gRPC echo (the floor)": "echo", "Python peer": "python"}
    for clients, run in recorded["small"].items():
        for name, key in series.items():
            rps = drawn[(f"{name}, {clients} clients", "req/s")]
            assert abs(rps - run[key]["rps"]) <= 1, (name, clients, rps, run[key]["rps"])
            p99 = drawn[(f"{name}, {clients} clients", "ms")]
            assert abs(p99 - run[key]["p99_ms"]) <= 0.01 * run[key]["p99_ms"], (name, clients, p99)
        in_process = drawn[(f"in process (no RPC), {clients} clients", "req/s")]
        assert abs(in_process - run["in_process"]["cps"]) <= 1
    costs = point_values(ROOT / "bench/charts/eager_costs.svg")
    for name, stem in (("variant hit", "cost_variant"), ("Python eager miss", "cost_python")):
        phase = json.loads(
            (ROOT / f"bench/results/2026-12-01/python_eager_mix/{stem}.json").read_text())["phases"][0]
        assert abs(costs[(f"{name}, p50", "ms")] - phase["latency_ms"]["p50"]) < 0.001
        assert abs(costs[(f"{name}, p99", "ms")] - phase["latency_ms"]["p99"]) < 0.001
