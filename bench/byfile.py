"""Instructions per request by the source they were compiled from, read from two callgrind
profiles of a build with line tables.

With whole-program LTO most of a request runs inside a few large functions into which hyper,
tokio, `http` and legate's own helpers were inlined, so callgrind's per-function table names
the caller, not the code. Its per-line records do not lose that: each cost line belongs to the
source file of the instruction (`fl=`, and `fi=`/`fe=` for inlined code), whatever function it
was inlined into. Summed by file, legate's own modules and the standard library's show by path
and every dependency as one row per crate; code without line information (glibc's allocator and `memcpy`, the vDSO) is one
row. Like the totals, the costs are differenced between a run of `few` and one of `many`
requests.

It needs a release build with line tables (the same one `bench/copies.py --lines` uses):

    RUSTFLAGS="-Cdebuginfo=line-tables-only -Cstrip=none" CARGO_TARGET_DIR=/tmp/lines \\
        cargo build --release
    python3 bench/per-request.py --bin /tmp/lines/release/legate --tool callgrind --by-file 30

Used by per-request.py; `python3 bench/byfile.py FEW.out MANY.out N [ROWS]` reads two kept
profiles (N requests apart) by itself.
"""

import collections
import re
import sys

# `fl=(3) /path` names a file once; later `fl=(3)` refers to it. All five keys share the table,
# and only the first three say where the following costs belong (`cfi=`/`cfl=` name a callee).
_FILE = re.compile(r"(fl|fi|fe|cfi|cfl)=\((\d+)\)(?: (.*))?")
_POSITIONS = re.compile(r"^positions: (.*)", re.M)
_CRATE = re.compile(r"/registry/src/[^/]+/([A-Za-z0-9_\-]+?)-\d[^/]*/")
_STD = re.compile(r"/library/((?:core|alloc|std|proc_macro)/.*)$")
_OWN = re.compile(r"(?:^|/)(src/.*\.rs)$")


def by_file(path):
    """Self cost of each source file named in one profile (inlined code by its own file)."""
    with open(path, errors="replace") as f:
        text = f.read()
    m = _POSITIONS.search(text)
    # The cost follows the position fields: `line`, or `instr line` with --dump-instr=yes.
    cost_field = len(m.group(1).split()) if m else 1
    names, costs = {}, collections.Counter()
    current, after_call = "?", False
    for line in text.splitlines():
        if not line:
            continue
        head = line[0]
        if head.isdigit() or head in "+-*":
            if after_call:
                after_call = False  # a call's inclusive cost, counted where the callee runs
                continue
            fields = line.split()
            if len(fields) > cost_field:
                costs[current] += int(fields[cost_field])
            continue
        after_call = line.startswith("calls=")
        named = _FILE.match(line)
        if named:
            key, number, name = named.groups()
            if name:
                names[number] = name
            if key in ("fl", "fi", "fe"):
                current = names.get(number, "?")
    return costs


def group(path):
    """legate's own files by path, a dependency by crate, the standard library by file (its
    generic code is inlined everywhere: `ptr` moves, `Option` combinators, atomics, hashing)."""
    crate = _CRATE.search(path)
    if crate:
        return crate.group(1)
    std = _STD.search(path)
    if std:
        return "std: " + std.group(1)
    own = _OWN.search(path)
    if own and "/registry/" not in path and "/rustc/" not in path:
        return own.group(1)
    return "no line information (libc, vDSO, runtime start)"


def per_request(few_path, many_path, n):
    """Instructions per request by group, largest first."""
    few, many = by_file(few_path), by_file(many_path)
    rows = collections.Counter()
    for name in set(few) | set(many):
        rows[group(name)] += many[name] - few[name]
    return [(g, c / n) for g, c in rows.most_common() if c > 0]


def describe(rows, limit):
    out = [f"{cost:10,.0f}  {name}" for name, cost in rows[:limit]]
    rest = sum(cost for _, cost in rows[limit:])
    if rest:
        out.append(f"{rest:10,.0f}  ({len(rows) - limit} more)")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: byfile.py FEW.out MANY.out N [ROWS]")
    limit = int(sys.argv[4]) if len(sys.argv) == 5 else 30
    print(describe(per_request(sys.argv[1], sys.argv[2], int(sys.argv[3])), limit))
