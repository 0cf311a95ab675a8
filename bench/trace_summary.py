"""Tabulates a Chrome trace written by a refit benchmark (REFIT_BENCH_TRACE=file.json) by op name:
calls, total and self CPU time per step, like torch.profiler's key_averages().

  python bench/trace_summary.py file.json [steps] [rows]"""
import collections, json, sys

events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
rows = int(sys.argv[3]) if len(sys.argv) > 3 else 30
# Self time: an event's duration minus its direct children's (events nest per thread).
by_thread = collections.defaultdict(list)
for e in events:
    by_thread[e["tid"]].append(e)
total, self_time, calls = collections.Counter(), collections.Counter(), collections.Counter()
for evs in by_thread.values():
    evs.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in evs:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        if stack:
            self_time[stack[-1]["name"]] -= e["dur"]
        total[e["name"]] += e["dur"]
        self_time[e["name"]] += e["dur"]
        calls[e["name"]] += 1
        stack.append(e)
all_self = sum(self_time.values())
print(f"{'op':60s} {'calls/step':>10s} {'self us/step':>12s} {'total us/step':>13s}")
for name, s in self_time.most_common(rows):
    print(f"{name[:60]:60s} {calls[name] / steps:10.1f} {s / steps:12.1f} {total[name] / steps:13.1f}")
print(f"self time per step, all ops: {all_self / steps / 1000:.2f} ms")
