#!/usr/bin/env python3
"""summary.py — count Criterion test cases in meson test logs and print the closing line.

Reads meson's testlog.json files; for each test program takes Criterion's
"Synthesis: Tested: T | Passing: P | Failing: F | Crashing: C" line from its output, and
counts its "[SKIP] suite::case: reason" lines (printed because every Criterion program runs
with --verbose).  Criterion leaves skipped cases out of "Tested", so they are neither passed
nor failed here: a skip is not a pass.  A program without a synthesis line counts as one
test: passed if meson says OK, or EXPECTEDFAIL (a should_fail test that failed, as a
usage error must), skipped if meson says SKIP, else failed.  Prints one line per
program, then "N passed, N failed, N skipped" last.
"""
import json, re, sys

SYN = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| Crashing: (\d+)")
SKIP = re.compile(r"^\[SKIP\] \S+::\S+", re.M)
passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        print(f"{path}: missing (build failed?)")
        failed += 1
        continue
    for line in lines:
        t = json.loads(line)
        out = (t.get("stdout") or "") + (t.get("stderr") or "")
        m = SYN.findall(out)
        res = t.get("result")
        where = f"{path.split('/')[0]:>10} {t['name']:<28} {res:<8}"
        if m:
            tested, p, f, c = map(int, m[-1])
            s = len(SKIP.findall(out))
            # a program that crashed after its synthesis, or timed out, is a failure too
            extra = 1 if res not in ("OK", "SKIP", "EXPECTEDFAIL") and f + c == 0 else 0
            passed += p
            failed += f + c + extra
            skipped += s
            print(f"{where} {p} passed, {f + c + extra} failed, {s} skipped")
        else:
            passed += res in ("OK", "EXPECTEDFAIL")
            skipped += res == "SKIP"
            failed += res not in ("OK", "EXPECTEDFAIL", "SKIP")
            print(f"{where} (no Criterion summary)")
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
