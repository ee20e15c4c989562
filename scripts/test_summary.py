"""The closing summary of scripts/test.sh: what ctest ran (passed, skipped with the test's own
reason, failed), pytest's counts, and every skip reason with how many tests it covers.

    python3 scripts/test_summary.py BUILD_DIR

Reads BUILD_DIR/ctest.log (ctest's console output, as test.sh tees it) and
BUILD_DIR/Testing/Temporary/LastTest.log (every test's own output, which ctest keeps).
"""
from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

RESULT = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.+\s*(\*{0,3}\w+)")
SKIP = re.compile(r"^SKIPPED \[(\d+)\] ([^:]+)(?::\d+)?: (.*)$")
COUNTS = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in ([\d.]+)s")


def test_outputs(last_test_log: str) -> dict[str, list[str]]:
    """{test name: its output lines} from ctest's LastTest.log."""
    out: dict[str, list[str]] = {}
    name, lines, inside = None, [], False
    for line in last_test_log.splitlines():
        m = re.match(r'^"(.+)" start time:', line)
        if m:
            name, lines, inside = m.group(1), [], False
        elif line.startswith("Output:") and name:
            inside = None                      # the dashed line follows
        elif inside is None:
            inside = True
        elif line == "<end of output>" and name:
            out[name], inside = lines, False
        elif inside:
            lines.append(line)
    return out


def summary(build_dir: Path) -> list[str]:
    ctest_log = build_dir / "ctest.log"
    last = build_dir / "Testing" / "Temporary" / "LastTest.log"
    outputs = test_outputs(last.read_text(errors="replace")) if last.is_file() else {}
    results = []
    if ctest_log.is_file():
        for line in ctest_log.read_text(errors="replace").splitlines():
            m = RESULT.match(line)
            if m:
                results.append((m.group(1), m.group(2).strip("*")))
    lines = []
    if results:
        n = Counter(r for _, r in results)
        parts = [f"{n.pop('Passed', 0)} passed"]
        failed = [t for t, r in results if r not in ("Passed", "Skipped")]
        parts.append(f"{len(failed)} failed")
        skipped = [t for t, r in results if r == "Skipped"]
        if skipped:
            why = []
            for t in skipped:
                said = [x for x in outputs.get(t, []) if x.strip()]
                why.append(f"{t}: {said[-1].strip()}" if said else t)
            parts.append(f"{len(skipped)} skipped ({'; '.join(why)})")
        lines.append("ctest: " + ", ".join(parts) + (f" -- failed: {', '.join(failed)}" if failed else ""))
    py = outputs.get("pytest")
    if py is not None:
        counts = next((m for m in map(COUNTS.match, reversed(py)) if m), None)
        if counts:
            c = dict((k, int(v)) for v, k in re.findall(r"(\d+) (\w+)", counts.group(1)))
            errors = c.get("error", 0) + c.get("errors", 0)
            lines.append(f"pytest: {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
                         f"{c.get('skipped', 0)} skipped")
            lines.append(f"pytest took {float(counts.group(2)):.0f} s"
                         + (f"; {errors} collection or fixture errors" if errors else ""))
        by_reason: Counter[str] = Counter()
        files: dict[str, set[str]] = defaultdict(set)
        for line in py:
            m = SKIP.match(line)
            if m:
                by_reason[m.group(3)] += int(m.group(1))
                files[m.group(3)].add(Path(m.group(2)).name)
        if by_reason:
            lines.append("pytest skips, by reason (tests, files: reason):")
            for reason, k in by_reason.most_common():
                lines.append(f"  {k:5d} in {len(files[reason]):2d} file{'s' if len(files[reason]) != 1 else ' '}: "
                             f"{reason}")
    return lines


if __name__ == "__main__":
    for line in summary(Path(sys.argv[1] if len(sys.argv) > 1 else "build")):
        print(line)
