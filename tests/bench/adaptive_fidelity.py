"""For tests/bench/adaptive_bench.sh: the realized token share of every source per span of
`dsprep inspect --mix --every N --csv` (a pack of the lineage) against the shares `[mix.adaptive]`
decided for those tokens (the lineage's decisions: each share holds from its token point on,
token-weighted over the span), and the decisions' trajectory of the first source. Prints JSON
lines.

    python3 adaptive_fidelity.py LINEAGE.json SPANS.csv
"""

import csv
import json
import sys


def main() -> None:
    lineage = json.load(open(sys.argv[1]))["lineage"]
    segment = lineage["segments"][-1]
    names = [s["name"] for s in segment["recipe"]["source"]]
    total = sum(s["weight"] for s in segment["recipe"]["source"])
    base = {s["name"]: s["weight"] / total for s in segment["recipe"]["source"]}
    # The shares in force from each token point on.
    points = [(0, base)] + [(d["at_tokens"], d["shares"]) for d in segment["decisions"]]

    def decided(t0: int, t1: int) -> dict:
        out = {n: 0.0 for n in names}
        for k, (at, shares) in enumerate(points):
            end = points[k + 1][0] if k + 1 < len(points) else t1
            lo, hi = max(at, t0), min(end, t1)
            if hi > lo:
                for n in names:
                    out[n] += shares.get(n, 0.0) * (hi - lo) / (t1 - t0)
        return out

    rows = list(csv.DictReader(open(sys.argv[2])))
    worst, spans, previous = 0.0, [], 0
    for row in rows:
        t = int(row["tokens"])
        want = decided(previous, t)
        got = {n: float(row[f"span:{n}"]) for n in names}
        dev = max(abs(got[n] - want[n]) for n in names) * 100
        worst = max(worst, dev) if t - previous >= 9_000_000 else worst  # a short last span aside
        spans.append({"to_tokens": t, "max_dev_points": round(dev, 3)})
        previous = t
    print(json.dumps({"bench": "fidelity", "spans": spans, "max_dev_points_full_spans": round(worst, 3)}))
    first = names[0]
    trajectory = [round(base[first], 4)] + [round(d["shares"][first], 4) for d in segment["decisions"]]
    held = sum(1 for d in segment["decisions"] if "held" in d)
    up10 = next((k for k, s in enumerate(trajectory) if s >= base[first] + 0.10), None)
    print(json.dumps({
        "bench": "trajectory", "source": first, "decisions": len(segment["decisions"]), "held": held,
        "share_by_decision": trajectory, "decisions_to_plus_10_points": up10,
    }))


if __name__ == "__main__":
    main()
