#!/usr/bin/env python3
"""Summarise an iscsi-test-cu log: per test, passed / skipped / failed.

CUnit prints a test that skipped itself as passed; the test's own output says [SKIPPED]. We
count such a test as skipped, a test whose outcome line is FAILED as failed, and the rest as
passed for real. Usage: cu-summary.py LOG [--json]
"""
import json
import re
import sys


def parse(path):
    results = {}
    suite = test = None
    skipped = False
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"^Suite: (\S+)", line)
            if m:
                suite = m.group(1)
                continue
            m = re.match(r"^  Test: (\S+) \.\.\.(.*)$", line)
            if m:
                test = f"{suite}.{m.group(1)}"
                rest = m.group(2)
                skipped = "[SKIPPED]" in rest
                if rest.rstrip().endswith("passed"):
                    results[test] = "skipped" if skipped else "passed"
                    test = None
                continue
            if test is None:
                continue
            if "[SKIPPED]" in line:
                skipped = True
            if line.startswith("FAILED"):
                results[test] = "failed"
                test = None
            elif line.rstrip().endswith("passed"):
                results[test] = "skipped" if skipped else "passed"
                test = None
    return results


def main():
    res = parse(sys.argv[1])
    counts = {k: sum(1 for v in res.values() if v == k) for k in ("passed", "skipped", "failed")}
    if "--json" in sys.argv:
        json.dump({"counts": counts, "tests": res}, sys.stdout, indent=1, sort_keys=True)
        print()
    else:
        print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
        for t, v in sorted(res.items()):
            if v == "failed":
                print(f"  FAILED {t}")


if __name__ == "__main__":
    main()
