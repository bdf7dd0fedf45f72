#!/usr/bin/python3
"""test_grafana.py - deploy/grafana/canopy.json against the daemon.

1. The dashboard is Grafana JSON as it imports: a title and uid, unique
   panel ids, a Prometheus datasource variable every panel and target
   uses, and at least one target per panel that is not a row.
2. Every PromQL expression names only metrics a running `canopy serve`
   exports (its /metrics, scraped after a request; a histogram's
   _bucket/_sum/_count by its family), and only their labels (plus job
   and instance, which Prometheus adds, and le of a histogram's buckets)
   in selectors and `by (...)`; every function it calls is PromQL's.
3. The expressions parse: promtool check rules on each as a recording
   rule (Grafana's variables replaced), where promtool is installed.
4. The dashboard covers what docs/deploy.md promises: latency, throughput,
   batches against the bound, queue, errors, reloads, memory.

usage: test_grafana.py DASHBOARD.json   (CANOPY_BIN, CANOPY_DATA from meson)
"""
import json
import os
import re
import shutil
import subprocess
import sys

from deploylib import (Skip, check, free_port, init_model, main, request,
                       start_canopy)

FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg", "avg_over_time", "ceil",
    "changes", "clamp", "clamp_max", "clamp_min", "count", "count_over_time",
    "count_values", "delta", "deriv", "exp", "floor", "group",
    "histogram_quantile", "idelta", "increase", "irate", "label_join",
    "label_replace", "last_over_time", "ln", "log2", "log10", "max",
    "max_over_time", "min", "min_over_time", "quantile", "quantile_over_time",
    "rate", "resets", "round", "scalar", "sort", "sort_desc", "sqrt",
    "stddev", "stdvar", "sum", "sum_over_time", "time", "timestamp", "topk",
    "bottomk", "vector"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right",
            "and", "or", "unless", "bool", "offset"}
ADDED = {"job", "instance"}   # target labels Prometheus adds to each series
VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$job": ".*",
        "$instance": ".*", "${datasource}": "prom"}


def exported(port):
    """{metric name: set of label names} from the daemon's /metrics."""
    _, _, body = request(port, "GET", "/metrics")
    fams, labels = {}, {}
    for line in body.decode().splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            fams[m.group(1)] = m.group(2)
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?", line)
        names = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
        labels.setdefault(m.group(1), set()).update(names)
    out = {}
    for fam, kind in fams.items():
        series = [fam] + ([fam + s for s in ("_bucket", "_sum", "_count")]
                          if kind in ("histogram", "summary") else [])
        for s in series:
            out[s] = labels.get(s, set()) | ADDED
    return out


def targets(dash):
    """(panel title, expr) of every target of every panel."""
    for p in dash["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["expr"]


def names_in(expr):
    """(metrics with the labels their selectors name, labels of by/without
    clauses, functions called) of one expression."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)      # string literals
    e = re.sub(r"\[[^\]]*\]", "", e)                  # range selectors
    grouped = set()
    for m in re.finditer(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", e):
        grouped.update(x.strip() for x in m.group(1).split(",") if x.strip())
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", e)
    metrics, funcs = [], set()
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{([^}]*)\})?\s*(\()?",
                         e):
        name, sel, call = m.group(1), m.group(3), m.group(4)
        if name in KEYWORDS:
            continue
        if call and sel is None:
            funcs.add(name)
            continue
        labels = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*[!=]~?", sel or ""))
        metrics.append((name, labels))
    # label names inside braces were consumed with their selector; a bare
    # {label="x"} selector without a name would show as no metric at all
    return metrics, grouped, funcs


def body(procs):
    path = os.path.abspath(sys.argv[1])
    with open(path, encoding="utf-8") as f:
        dash = json.load(f)
    # 1. shape
    check(dash.get("title") and dash.get("uid"), "title and uid")
    ids = [p["id"] for p in dash["panels"]]
    check(len(ids) == len(set(ids)), f"panel ids repeat: {ids}")
    tvars = {v["name"]: v for v in dash["templating"]["list"]}
    check(tvars.get("datasource", {}).get("type") == "datasource" and
          tvars["datasource"].get("query") == "prometheus",
          "a Prometheus datasource variable named datasource")
    n_targets = 0
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        check(p.get("targets"), f"panel {p['title']!r} has no query")
        for t in [p] + p["targets"]:
            check(t.get("datasource", {}).get("uid") == "${datasource}",
                  f"panel {p['title']!r}: datasource is not ${{datasource}}")
        check(p.get("gridPos", {}).get("w", 0) > 0, f"{p['title']}: gridPos")
        n_targets += len(p["targets"])

    # 2. against the daemon
    init_model(procs)
    port = free_port()
    start_canopy(procs, port, "canopy.log")
    st, _, _ = request(port, "POST", "/v1/models/treelstm/infer",
                       b'{"tree": "(S (W the) (N cat))"}')
    check(st == 200, f"infer: {st}")
    have = exported(port)
    check("canopy_requests_total" in have, f"scrape: {sorted(have)[:5]}")
    used = set()
    exprs = list(targets(dash))
    for extra in tvars.values():
        q = extra.get("definition")
        if q:   # label_values(metric{...}, label): its metric must exist
            m = re.match(r"label_values\((\w+)", q)
            check(m and m.group(1) in have, f"variable {extra['name']}: {q}")
    for title, expr in exprs:
        metrics, grouped, funcs = names_in(expr)
        check(metrics, f"{title}: no metric in {expr}")
        bad = funcs - FUNCTIONS
        check(not bad, f"{title}: not PromQL functions: {bad} in {expr}")
        known = set()
        for name, labels in metrics:
            check(name in have, f"{title}: {name} is not exported by the "
                  f"daemon (its /metrics); expression: {expr}")
            used.add(re.sub(r"_(bucket|sum|count)$", "", name))
            check(labels <= have[name], f"{title}: {name} has no label "
                  f"{labels - have[name]} (it has {sorted(have[name])})")
            known |= have[name]
        check(grouped <= known, f"{title}: by/without labels "
              f"{grouped - known} are on none of its metrics: {expr}")
    print(f"grafana: {len(dash['panels'])} panels, {n_targets} queries, "
          f"{len(used)} metrics, every one exported by the daemon")

    # 4. coverage
    must = {"latency": "canopy_request_duration_seconds",
            "throughput": "canopy_instances_total",
            "batches against the bound": "canopy_lower_bound_batches_total",
            "queue": "canopy_queue_depth_instances",
            "errors": "canopy_requests_rejected_overloaded_total",
            "reloads": "canopy_model_loads_total",
            "memory": "canopy_arena_bytes"}
    for what, metric in must.items():
        check(any(metric in e for _, e in exprs), f"no panel on {what} "
              f"({metric})")

    # 3. syntax
    if shutil.which("promtool") is None:
        print("promtool not installed: PromQL syntax left unchecked")
        return
    rules = os.path.join(procs.dir, "dashboard-rules.yml")
    with open(rules, "w") as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, (_, expr) in enumerate(exprs):
            for k, v in VARS.items():
                expr = expr.replace(k, v)
            f.write(f"      - record: dashboard:expr{i}\n"
                    f"        expr: {json.dumps(expr)}\n")
    r = subprocess.run(["promtool", "check", "rules", rules],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"promtool check rules:\n{r.stdout}{r.stderr}")
    print(f"promtool: {len(exprs)} dashboard expressions parse")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(body, "deploy_grafana"))
