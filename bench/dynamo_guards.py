"""Dynamo's own guard evaluation, for the same guards as guard_dispatch_bench.

The function is the one guard_dispatch_bench's hand-built variants describe:

    def forward(x, y, n):
        return (x * y[:, None]).sum() + n

compiled with torch.compile(backend=<no-op>) so that Dynamo keeps one cache
entry per call signature:

    static    dynamic=False, x: float32[2+i, 16], y: float32[2+i], n=0
    symbolic  x: float32[s0, 4+i], y: float32[s0], n=0, with dimension 0 of x
              and y marked dynamic (maybe_mark_dynamic): one size symbol s0
              shared by x.size(0) and y.size(0), x.size(1) static per entry

for i in 0..N-1 and N in 1, 8, 64. Then, with torch 2.11's cache-entry API
(torch._C._dynamo.eval_frame._debug_get_cache_entry_list(code): the entries
most recent first, each with `guard_manager`, a GuardManagerWrapper whose
`root` is the C++ RootGuardManager), it times:

    hit_first   entries[0]'s guards hold (Dynamo's MRU entry)
    hit_last    the entries in list order until the last holds
    miss        every entry's guards fail
    explain     the miss's per-entry check_verbose (Dynamo's recompile reason)

Guards are evaluated with `root.check(f_locals)`, the C++ call Dynamo's
frame evaluation makes (run_root_guard_manager), reached from Python through
pybind11. The cost of calling a pybind11 function of torch that does next
to nothing (torch._C._dynamo.guards.check_type_id) is measured too and
reported as `pybind_call_ns`, and the timing loop's closure call as
`closure_call_ns`; the `*_net_ns` fields subtract one closure call and one
pybind call per check(), leaving the guard evaluation itself (what Dynamo's
frame evaluation pays, since it calls the C++ root guard manager directly).

Output: JSON on stdout (and --out FILE). Run with the project's venv:

    taskset -c 1 .venv/bin/python bench/dynamo_guards.py --out /tmp/dynamo.json
"""

import argparse
import json
import platform
import statistics
import sys
import time

import torch
import torch._dynamo
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list


def forward(x, y, n):
    return (x * y[:, None]).sum() + n


def noop_backend(gm, example_inputs):
    return gm.forward


def static_args(i):
    return (torch.randn(2 + i, 16), torch.randn(2 + i), 0)


def symbolic_args(i):
    x, y = torch.randn(8, 4 + i), torch.randn(8)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    torch._dynamo.maybe_mark_dynamic(y, 0)
    return (x, y, 0)


def missing_args(kind):
    if kind == "static":
        return (torch.randn(1000, 16), torch.randn(1000), 0)
    return (torch.randn(8, 1000), torch.randn(8), 0)


def f_locals(args):
    x, y, n = args
    return {"x": x, "y": y, "n": n}


def time_ns(fn, iterations, repeats):
    """Median over `repeats` of the mean ns per call of `fn` over `iterations`."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(iterations):
            fn()
        samples.append((time.perf_counter_ns() - start) / iterations)
    return statistics.median(samples)


def compile_frame(kind, n):
    torch._dynamo.reset()
    # A fresh function object per frame; a shared code object would share
    # Dynamo's cache.
    code = forward.__code__.replace()
    fn = type(forward)(code, forward.__globals__, "forward")
    compiled = torch.compile(fn, backend=noop_backend, dynamic=False)
    make = static_args if kind == "static" else symbolic_args
    calls = [make(i) for i in range(n)]
    for args in calls:
        compiled(*args)
    entries = _debug_get_cache_entry_list(code)
    if len(entries) != n:
        raise RuntimeError(f"{kind}/{n}: Dynamo holds {len(entries)} cache entries, not {n}")
    return fn, compiled, entries, calls


def matching_entry(entries, loc):
    hits = [i for i, e in enumerate(entries) if e.guard_manager.root.check(loc)]
    return hits


def bench_frame(kind, n, iterations, repeats, closure_ns, pybind_ns):
    _, _, entries, calls = compile_frame(kind, n)
    roots = [e.guard_manager.root for e in entries]
    locs = [f_locals(a) for a in calls]
    # Which call matches which entry (entries are most recent first).
    first_loc = next(l for l in locs if matching_entry(entries, l) == [0])
    last_loc = next(l for l in locs if matching_entry(entries, l) == [n - 1])
    miss_loc = f_locals(missing_args(kind))
    if matching_entry(entries, miss_loc):
        raise RuntimeError("the missing call matches an entry")

    first_check = roots[0].check

    def hit_first():
        first_check(first_loc)

    def scan(loc):
        for r in roots:
            if r.check(loc):
                return True
        return False

    def hit_last():
        scan(last_loc)

    def miss():
        scan(miss_loc)

    managers = [e.guard_manager for e in entries]

    def explain():
        for m in managers:
            m.check_verbose(miss_loc)

    result = {"kind": kind, "variants": n}
    result["hit_first_ns"] = time_ns(hit_first, iterations, repeats)
    result["hit_last_ns"] = time_ns(hit_last, max(iterations // n, 1000), repeats)
    result["miss_ns"] = time_ns(miss, max(iterations // n, 1000), repeats)
    result["explain_ns"] = time_ns(explain, max(iterations // (20 * n), 200), repeats)
    result["hit_first_net_ns"] = result["hit_first_ns"] - closure_ns - pybind_ns
    result["hit_last_net_ns"] = result["hit_last_ns"] - closure_ns - n * pybind_ns
    result["miss_net_ns"] = result["miss_ns"] - closure_ns - n * pybind_ns

    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", default="1,8,64")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--cpp-symbolic-shape-guards", action="store_true",
                        help="torch._dynamo.config.enable_cpp_symbolic_shape_guards "
                             "(off by default in 2.11: shape-environment guards such as "
                             "x.size(0) == y.size(0) are then Python lambdas)")
    args = parser.parse_args()

    torch._dynamo.config.enable_cpp_symbolic_shape_guards = args.cpp_symbolic_shape_guards
    torch._dynamo.config.recompile_limit = 1000
    torch._dynamo.config.accumulated_recompile_limit = 100000
    torch.set_grad_enabled(False)

    from torch._C._dynamo.guards import check_type_id

    loc = {"x": 0, "y": 0, "n": 0}
    dict_id = id(dict)
    # The closure call itself is in every timed function; measure it bare.
    closure_ns = time_ns(lambda: None, args.iterations, args.repeats)
    pybind_ns = time_ns(lambda: check_type_id(loc, dict_id), args.iterations,
                        args.repeats) - closure_ns

    results = []
    for kind in ("static", "symbolic"):
        for n in (int(v) for v in args.variants.split(",")):
            r = bench_frame(kind, n, args.iterations, args.repeats, closure_ns, pybind_ns)
            print(json.dumps(r), file=sys.stderr)
            results.append(r)

    out = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
        "cpp_symbolic_shape_guards": args.cpp_symbolic_shape_guards,
        "pybind_call_ns": pybind_ns,
        "closure_call_ns": closure_ns,
        "note": "*_ns include one Python closure call (closure_call_ns) and, per "
                "check(), one pybind call (pybind_call_ns); *_net_ns subtract them",
        "results": results,
    }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
