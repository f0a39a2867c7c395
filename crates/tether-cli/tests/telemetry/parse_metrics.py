"""Reads a Prometheus text page on stdin with the reference parser
(prometheus_client) and prints its samples as one JSON object:
`{"name{k=v,...}": value}`, labels sorted. A page the parser refuses exits 1.
"""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main():
    samples = {}
    for family in text_string_to_metric_families(sys.stdin.read()):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}"] = s.value
    json.dump(samples, sys.stdout)


if __name__ == "__main__":
    main()
