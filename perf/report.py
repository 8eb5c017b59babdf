"""Turn a pytest-benchmark JSON file into a Markdown table of medians and
ratios against the torch side of each group.

    python perf/report.py perf/cpu.json
"""
import json
import sys
from collections import defaultdict


def main(path):
    data = json.load(open(path))
    groups = defaultdict(dict)
    for b in data["benchmarks"]:
        side = b["name"].rsplit("_", 1)[-1]
        groups[b["group"]][side] = b["stats"]["median"]
    info = data["machine_info"]
    print(f"machine: {info.get('cpu', {}).get('brand_raw', '?')}, {info.get('cpu', {}).get('count', '?')} cores; "
          f"python {info.get('python_version')}; date {data['datetime']}")
    print()
    print("| benchmark | triflux (median) | torch (median) | ratio triflux/torch | other |")
    print("| --- | --- | --- | --- | --- |")
    for group, sides in groups.items():
        t, p = sides.get("triflux"), sides.get("torch")
        others = ", ".join(f"{k}: {v * 1e6:.1f} µs" for k, v in sides.items() if k not in ("triflux", "torch"))
        ratio = f"{t / p:.2f}x" if t and p else "-"
        fmt = lambda v: "-" if v is None else (f"{v * 1e6:.1f} µs" if v < 1e-3 else f"{v * 1e3:.2f} ms")
        print(f"| {group} | {fmt(t)} | {fmt(p)} | {ratio} | {others} |")


if __name__ == "__main__":
    main(sys.argv[1])
