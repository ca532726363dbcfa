#!/usr/bin/env python3
"""Summarise an iscsi-test-cu log: per test, passed / skipped / failed.

CUnit prints a test that skipped itself as passed; the test's own output says [SKIPPED]. We
count such a test as skipped, a test whose outcome is FAILED (on its own line, or on the
"Test:" line itself) as failed, a test with no outcome before the next test (a crash, a cut
log) as failed too, and the rest as passed for real. Usage: cu-summary.py LOG [--json]
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
                if test is not None:
                    results[test] = "failed"  # no outcome: not a pass
                    test = None
                suite = m.group(1)
                continue
            m = re.match(r"^  Test: (\S+) \.\.\.(.*)$", line)
            if m:
                if test is not None:
                    results[test] = "failed"  # no outcome: not a pass
                test = f"{suite}.{m.group(1)}"
                rest = m.group(2)
                skipped = "[SKIPPED]" in rest
                r = rest.strip()
                if r.endswith("passed") or r.startswith("passed"):
                    results[test] = "skipped" if skipped else "passed"
                    test = None
                elif r.endswith("FAILED") or r.startswith("FAILED"):
                    results[test] = "failed"
                    test = None
                continue
            if test is None:
                continue
            if "[SKIPPED]" in line:
                skipped = True
            if line.startswith("FAILED"):
                results[test] = "failed"
                test = None
            elif line.rstrip().endswith("passed") or line.startswith("passed"):
                # CUnit's "passed" may be followed on the same line by the test's own log
                # (Reserve6.LUNReset logs the sense it expected after "passed").
                results[test] = "skipped" if skipped else "passed"
                test = None
    if test is not None:
        results[test] = "failed"  # the log ends inside a test
    return results


def cunit_totals(path):
    """CUnit's own Run Summary line for tests: (ran, failed), or None if the log has none."""
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"^\s+tests\s+(\d+)\s+(\d+)\s+(\S+)\s+(\d+)", line)
            if m:
                return int(m.group(2)), int(m.group(4))
    return None


def main():
    res = parse(sys.argv[1])
    counts = {k: sum(1 for v in res.values() if v == k) for k in ("passed", "skipped", "failed")}
    totals = cunit_totals(sys.argv[1])
    if totals is not None and totals != (len(res), counts["failed"]):
        # A test this parser lost or misread would otherwise vanish from every comparison.
        sys.exit(
            f"cu-summary: {sys.argv[1]}: CUnit ran {totals[0]} tests with {totals[1]} failed, "
            f"this parse found {len(res)} with {counts['failed']} failed"
        )
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
