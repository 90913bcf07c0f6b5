"""Summarizes one bench/e2e.sh run: tables of ratios and the targets.

    .venv/bin/python bench/summarize.py RESULTS_DIR   # markdown on stdout,
                                                      # RESULTS_DIR/summary.json
    .venv/bin/python bench/summarize.py --guards DIR  # bench/run_guard_bench.sh's
                                                      # results: ours vs Dynamo

Every ratio compares numbers measured in the same run on the same machine
(RESULTS_DIR/machine.txt). Inputs: load_<label>.json (precompile_load's
--json_out), direct.jsonl (aoti_direct_bench's --json_out), rss_soak.txt
(epoch seconds, VmRSS kB), metrics.txt (the server's /metrics after the run).
"""

import glob
import json
import os
import re
import sys


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def read_load(out, label):
    """Phases by concurrency; with rounds (load_<label>_r<k>.json), the median
    over rounds of throughput and each latency percentile, errors summed."""
    paths = sorted(glob.glob(os.path.join(out, f"load_{label}_r*.json")))
    if not paths:
        paths = [p for p in [os.path.join(out, f"load_{label}.json")] if os.path.exists(p)]
    by_c = {}
    for path in paths:
        with open(path) as f:
            for p in json.load(f)["phases"]:
                by_c.setdefault(p["concurrency"], []).append(p)
    merged = {}
    for c, phases in by_c.items():
        m = dict(phases[0])
        m["throughput_rps"] = median([p["throughput_rps"] for p in phases])
        m["latency_ms"] = {k: median([p["latency_ms"][k] for p in phases])
                           for k in phases[0]["latency_ms"]}
        m["errors"] = sum(p["errors"] for p in phases)
        m["requests"] = sum(p["requests"] for p in phases)
        m["rounds"] = len(phases)
        m["rps_range"] = (min(p["throughput_rps"] for p in phases),
                          max(p["throughput_rps"] for p in phases))
        outcomes = {}
        for p in phases:
            for k, v in p["outcomes"].items():
                outcomes[k] = outcomes.get(k, 0) + v
        m["outcomes"] = outcomes
        merged[c] = m
    return merged


def read_direct(out):
    """(label, threads) -> row; rows labelled label@r<k> are merged into the
    median over rounds of throughput and percentiles."""
    rows, rounds = {}, {}
    path = os.path.join(out, "direct.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                label = r["label"].split("@")[0]
                rounds.setdefault((label, r["threads"]), []).append(r)
    for key, rs in rounds.items():
        m = dict(rs[0])
        for k in ("throughput_cps", "p50_us", "p90_us", "p99_us", "mean_us"):
            m[k] = median([r[k] for r in rs])
        m["rounds"] = len(rs)
        rows[key] = m
    return rows


def fmt(v, digits=3):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def p50_ms(phase):
    return phase["latency_ms"]["p50"] if phase else None


def p99_ms(phase):
    return phase["latency_ms"]["p99"] if phase else None


def rps(phase):
    return phase["throughput_rps"] if phase else None


def table(rows):
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(out)


def metric_mean(metrics_text, name, labels):
    """Mean of a Prometheus histogram (sum / count) for series matching labels."""
    total = {"sum": 0.0, "count": 0.0}
    for line in metrics_text.splitlines():
        m = re.match(rf"{name}_(sum|count)\{{(.*)\}} (\S+)", line)
        if not m:
            continue
        series = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if all(series.get(k) == v for k, v in labels.items()):
            total[m.group(1)] += float(m.group(3))
    return total["sum"] / total["count"] if total["count"] else None


def guards_main(out):
    """Ours (guard_dispatch_bench JSON) vs Dynamo (dynamo_guards.py JSON)."""
    with open(os.path.join(out, "guard_bench.json")) as f:
        gb = json.load(f)
    ours = {}
    for b in gb["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"]  # BM_X/symbolic:0/variants:8
        m = re.match(r"BM_(\w+)/symbolic:(\d)/variants:(\d+)", name)
        if not m:
            continue
        scale = {"ns": 1, "us": 1e3, "ms": 1e6}[b["time_unit"]]
        t = b["real_time"] * scale
        if m.group(1) == "Match_Alternate":
            t /= 2  # two calls per iteration
        kind = "symbolic" if m.group(2) == "1" else "static"
        ours[(m.group(1), kind, int(m.group(3)))] = t

    def dynamo(path):
        if not os.path.exists(path):
            return {}, None
        with open(path) as f:
            d = json.load(f)
        return {(r["kind"], r["variants"]): r for r in d["results"]}, d

    dyn, dyn_doc = dynamo(os.path.join(out, "dynamo.json"))
    dyn_cpp, _ = dynamo(os.path.join(out, "dynamo_cpp.json"))
    lines = []
    machine = os.path.join(out, "machine.txt")
    if os.path.exists(machine):
        with open(machine) as f:
            lines += ["```", f.read().strip(), "```", ""]
    rows = [["kind", "variants", "Match hit (MRU) ns", "Scan hit first ns", "Scan hit last ns",
             "Match alternate ns/call", "Match miss ns", "ExplainMiss ns"]]
    for kind in ("static", "symbolic"):
        for n in (1, 8, 64):
            g = lambda case: ours.get((case, kind, n))
            rows.append([kind, str(n), fmt(g("Match_HitMru"), 1), fmt(g("Scan_HitFirst"), 1),
                         fmt(g("Scan_HitLast"), 1), fmt(g("Match_Alternate"), 1),
                         fmt(g("Match_Miss"), 1), fmt(g("ExplainMiss"), 0)])
    lines += ["### Ours: GuardProgram / FrameDispatcher (median of repetitions, ns per call)", "",
              table(rows), ""]
    if dyn:
        rows = [["kind", "variants", "case", "ours ns", "Dynamo ns (net)",
                 "Dynamo / ours", "Dynamo ns, C++ shape guards (net)", "Dynamo(C++) / ours"]]
        cases = (("hit first (MRU)", "Match_HitMru", "hit_first"),
                 ("hit last", "Scan_HitLast", "hit_last"),
                 ("miss", "Match_Miss", "miss"),
                 ("explain miss", "ExplainMiss", "explain"))
        for kind in ("static", "symbolic"):
            for n in (1, 8, 64):
                d, dc = dyn.get((kind, n)), dyn_cpp.get((kind, n))
                for label, ours_case, dyn_case in cases:
                    o = ours.get((ours_case, kind, n))
                    key = f"{dyn_case}_net_ns" if dyn_case != "explain" else "explain_ns"
                    dv = d[key] if d else None
                    dcv = dc[key] if dc else None
                    rows.append([kind, str(n), label, fmt(o, 1), fmt(dv, 0),
                                 fmt(ratio(dv, o), 1), fmt(dcv, 0), fmt(ratio(dcv, o), 1)])
        lines += ["### Dynamo (torch %s) vs ours, same guards" % dyn_doc["torch"], "",
                  "Dynamo's numbers are `RootGuardManager.check(f_locals)` timed from Python "
                  "with one closure call (%.0f ns) and one pybind11 call per check (%.0f ns) "
                  "subtracted (net); explain is `check_verbose` on every entry, not net." %
                  (dyn_doc["closure_call_ns"], dyn_doc["pybind_call_ns"]), "",
                  table(rows), ""]
    print("\n".join(lines))


def main():
    if sys.argv[1] == "--guards":
        guards_main(sys.argv[2])
        return
    out = sys.argv[1]
    direct = read_direct(out)
    summary = {"targets": []}
    lines = []
    with open(os.path.join(out, "machine.txt")) as f:
        machine = f.read()
    lines += ["## Machine and run", "", "```", machine.strip(), "```", ""]

    concurrencies = sorted(read_load(out, "ours_small").keys())
    for model, title in (("small", "small: mlp, FP32 [8,4] -> [8,3]"),
                         ("medium", "medium: MLP 256-1024-1024-256, FP32 [32,256] -> [32,256]")):
        ours = read_load(out, f"ours_{model}")
        echo = read_load(out, f"echo_{model}")
        peer = read_load(out, f"python_{model}")
        rows = [["concurrency", "ours p50 ms", "ours p99 ms", "ours req/s (range)", "echo p50 ms",
                 "echo req/s", "python p50 ms", "python req/s", "in-process p50 ms",
                 "in-process calls/s", "ours/python req/s", "ours/echo req/s",
                 "(ours - in-process p50) / echo p50"]]
        for c in concurrencies:
            o, e, p = ours.get(c), echo.get(c), peer.get(c)
            lim = direct.get((f"loader_{model}", c))
            lim_p50 = lim["p50_us"] / 1e3 if lim else None
            over = None
            if o and lim and e:
                over = (p50_ms(o) - lim_p50) / p50_ms(e)
            spread = (f" ({o['rps_range'][0]:.0f}-{o['rps_range'][1]:.0f})"
                      if o and o.get("rounds", 1) > 1 else "")
            rows.append([str(c), fmt(p50_ms(o)), fmt(p99_ms(o)), fmt(rps(o), 0) + spread,
                         fmt(p50_ms(e)), fmt(rps(e), 0), fmt(p50_ms(p)), fmt(rps(p), 0),
                         fmt(lim_p50, 4), fmt(lim["throughput_cps"] if lim else None, 0),
                         fmt(ratio(rps(o), rps(p)), 2), fmt(ratio(rps(o), rps(e)), 2),
                         fmt(over, 2)])
            summary.setdefault(model, {})[c] = {
                "ours": {"p50_ms": p50_ms(o), "p99_ms": p99_ms(o), "rps": rps(o),
                         "errors": o["errors"] if o else None},
                "echo": {"p50_ms": p50_ms(e), "p99_ms": p99_ms(e), "rps": rps(e)},
                "python": {"p50_ms": p50_ms(p), "p99_ms": p99_ms(p), "rps": rps(p)},
                "in_process": {"p50_ms": lim_p50,
                               "cps": lim["throughput_cps"] if lim else None},
            }
        rounds = max((p.get("rounds", 1) for p in ours.values()), default=1)
        lines += [f"## End to end, {title}", "",
                  f"Median over {rounds} interleaved rounds (ours' throughput range across "
                  "rounds in parentheses); in-process = AOTInductor's loader on the same "
                  ".pt2, same core, same concurrency as threads.", "", table(rows), ""]

    # In process: what each runtime layer adds to AOTInductor's own call.
    rows = [["model", "threads", "loader p50 us", "Variant::Run p50 us", "LoadedVersion::Call p50 us",
             "LoadedVersion - loader us", "loader calls/s", "LoadedVersion calls/s"]]
    for model in ("small", "medium"):
        for c in concurrencies:
            l = direct.get((f"layers_loader_{model}", c))
            v = direct.get((f"layers_variant_{model}", c))
            m = direct.get((f"layers_model_{model}", c))
            if not (l and v and m):
                continue
            rows.append([model, str(c), fmt(l["p50_us"], 1), fmt(v["p50_us"], 1),
                         fmt(m["p50_us"], 1), fmt(m["p50_us"] - l["p50_us"], 1),
                         fmt(l["throughput_cps"], 0), fmt(m["throughput_cps"], 0)])
    lines += ["## In process: the runtime's layers over AOTInductor's loader", "", table(rows), ""]

    # Eager fallback.
    lv = read_load(out, "ours_loop_variant").get(1)
    le = read_load(out, "ours_loop_eager").get(1)
    dv = direct.get(("model_loop_variant", 1))
    de = direct.get(("model_loop_eager", 1))
    d0 = direct.get(("model_loop_eager_n0", 1))
    rows = [["loop example", "server p50 ms", "server req/s", "in-process LoadedVersion::Call p50 us"],
            ["x [8,4], n=0: variant", fmt(p50_ms(lv)), fmt(rps(lv), 0),
             fmt(dv["p50_us"] if dv else None, 1)],
            ["x [8,4], n=1: eager fallback (one loop iteration)", fmt(p50_ms(le)),
             fmt(rps(le), 0), fmt(de["p50_us"] if de else None, 1)],
            ["x [16,4], n=0: eager fallback (a shape miss, same code)", "", "",
             fmt(d0["p50_us"] if d0 else None, 1)]]
    eager = {
        "server_p50_ratio": ratio(p50_ms(le), p50_ms(lv)),
        "server_rps_ratio": ratio(rps(lv), rps(le)),
        "in_process_p50_ratio_n1": ratio(de["p50_us"], dv["p50_us"]) if dv and de else None,
        "in_process_p50_ratio_shape_miss": ratio(d0["p50_us"], dv["p50_us"]) if dv and d0 else None,
    }
    summary["eager"] = eager
    lines += ["## Eager fallback vs variant (loop example, concurrency 1)", "", table(rows), "",
              f"Eager / variant: server p50 x{fmt(eager['server_p50_ratio'], 2)}, server "
              f"throughput /{fmt(eager['server_rps_ratio'], 2)}; in process p50 "
              f"x{fmt(eager['in_process_p50_ratio_n1'], 2)} (n=1), "
              f"x{fmt(eager['in_process_p50_ratio_shape_miss'], 2)} (shape miss, n=0).", ""]

    # Guard dispatch as the server measured it.
    metrics_path = os.path.join(out, "metrics.txt")
    if os.path.exists(metrics_path):
        with open(metrics_path) as f:
            metrics = f.read()
        rows = [["model", "frame", "mean guard dispatch us", "mean execution us"]]
        for model in ("mlp", "medium", "loop"):
            d = metric_mean(metrics, "precompile_guard_dispatch_duration_seconds",
                            {"model": model, "frame": "forward"})
            x = metric_mean(metrics, "precompile_execution_duration_seconds",
                            {"model": model, "frame": "forward"})
            rows.append([model, "forward", fmt(d * 1e6 if d else None, 2),
                         fmt(x * 1e6 if x else None, 1)])
        lines += ["## Inside the server (its Prometheus histograms, whole run)", "",
                  "Guard dispatch here is Dispatch()'s `matched - start`: building the "
                  "ArgViews, reading the global state and Match(), timed with absl::Now().", "",
                  table(rows), ""]

    # Soak.
    rss = []
    soak_path = os.path.join(out, "rss_soak.txt")
    if os.path.exists(soak_path):
        with open(soak_path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    rss.append((float(parts[0]), int(parts[1])))
    soak = read_load(out, "ours_soak").get(8)
    if len(rss) >= 20:
        t0 = rss[0][0]
        n = len(rss)
        tenth = max(n // 10, 3)
        early = sum(k for _, k in rss[tenth:2 * tenth]) / tenth
        late = sum(k for _, k in rss[-tenth:]) / tenth
        xs = [t - t0 for t, _ in rss[tenth:]]
        ys = [k for _, k in rss[tenth:]]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(
            sum((x - mx) ** 2 for x in xs), 1e-9)
        growth = late - early
        flat = growth <= max(0.02 * early, 4096)
        summary["soak"] = {"seconds": rss[-1][0] - t0, "samples": n, "early_kb": early,
                           "late_kb": late, "max_kb": max(k for _, k in rss),
                           "slope_kb_per_min": slope * 60, "flat": flat}
        lines += [f"## Memory soak ({rss[-1][0] - t0:.0f} s at concurrency 8, mixed outcomes)", "",
                  f"VmRSS: {early / 1024:.1f} MiB in the second tenth of the soak, "
                  f"{late / 1024:.1f} MiB in the last tenth (growth {growth / 1024:+.2f} MiB), "
                  f"max {max(k for _, k in rss) / 1024:.1f} MiB; least-squares slope after the "
                  f"first tenth {slope * 60 / 1024:+.3f} MiB/min. "
                  f"Requests: {soak['requests'] if soak else 'n/a'}, outcomes "
                  f"{json.dumps(soak['outcomes']) if soak else 'n/a'}.", ""]

    # Targets.
    def target(name, met, detail):
        summary["targets"].append({"target": name, "met": met, "detail": detail})

    s1 = summary.get("small", {}).get(1)
    if s1 and s1["in_process"]["p50_ms"] is not None and s1["echo"]["p50_ms"]:
        over = s1["ours"]["p50_ms"] - s1["in_process"]["p50_ms"]
        bound = 1.25 * s1["echo"]["p50_ms"]
        target("small, concurrency 1: server p50 - in-process p50 <= 1.25 x echo p50",
               over <= bound,
               f"{over * 1e3:.0f} us vs 1.25 x {s1['echo']['p50_ms'] * 1e3:.0f} us = "
               f"{bound * 1e3:.0f} us ({over / s1['echo']['p50_ms']:.2f} x echo)")
    for model in ("small", "medium"):
        for c, r in sorted(summary.get(model, {}).items()):
            if r["ours"]["rps"] and r["python"]["rps"]:
                x = r["ours"]["rps"] / r["python"]["rps"]
                target(f"{model}, concurrency {c}: throughput >= 5 x the Python peer", x >= 5,
                       f"{x:.2f} x ({r['ours']['rps']:.0f} vs {r['python']['rps']:.0f} req/s)")
    for model in ("small", "medium"):
        rows_ = summary.get(model, {})
        if 64 in rows_ and rows_[64]["ours"]["rps"]:
            best = max(rows_[c]["ours"]["rps"] or 0 for c in rows_ if c < 64)
            r64 = rows_[64]["ours"]
            ok = r64["rps"] >= 0.9 * best and not r64["errors"]
            target(f"{model}: no collapse at 64 clients (req/s >= 0.9 x best of lower "
                   f"concurrency, no errors)", ok,
                   f"{r64['rps']:.0f} req/s vs best {best:.0f}; errors {r64['errors']}; "
                   f"p99 {r64['p99_ms']:.2f} ms")
    if "soak" in summary:
        s = summary["soak"]
        span = (f"{s['seconds']:.0f} s" if s["seconds"] >= 300
                else f"{s['seconds']:.0f} s, not the 5 minutes the target asks for")
        target(f"resident memory flat over the soak ({span})",
               s["flat"] and s["seconds"] >= 300, f"growth {(s['late_kb'] - s['early_kb']) / 1024:+.2f} MiB, slope "
               f"{s['slope_kb_per_min'] / 1024:+.3f} MiB/min (flat: growth <= max(2 %, 4 MiB))")
    rows = [["target", "met", "measured"]]
    for t in summary["targets"]:
        rows.append([t["target"], "MET" if t["met"] else "NOT MET", t["detail"]])
    lines += ["## Targets", "", table(rows), ""]

    print("\n".join(lines))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)


if __name__ == "__main__":
    main()
