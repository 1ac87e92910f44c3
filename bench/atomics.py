"""Locked read-modify-write instructions per request, by the source they come from, read from
two callgrind profiles (made with `--dump-instr=yes`) of a build with line tables.

Every `lock`-prefixed instruction, and every `xchg` with memory (locked without the prefix),
orders the memory operations around it and costs some tens of cycles even when no other core
holds the line: reference counts (`Arc`, `bytes`), locks, and atomic counters all compile to
them. nginx's single-threaded workers run almost none per request. The executed ones are found
by matching the profiles' instruction addresses against the binary's disassembly (`objdump`),
and each is read back to the code it was inlined from (`addr2line -i`): it is counted for the
crate of the innermost frame outside the standard library, and a reference count in legate's
own code (the standard library's `Arc`, inlined there) as such. Like the totals, the counts are
differenced between a run of `few` and one of `many` requests. Only the binary's own code is
read: glibc's locked instructions (its allocator's, in a process with threads) are not counted.

It needs the same build as byfile.py:

    RUSTFLAGS="-Cdebuginfo=line-tables-only -Cstrip=none" CARGO_TARGET_DIR=/tmp/lines \\
        cargo build --release
    python3 bench/per-request.py --bin /tmp/lines/release/legate --tool callgrind --atomics

`python3 bench/atomics.py BINARY FEW.out MANY.out N` reads two kept profiles by itself.
"""

import collections
import importlib.util
import os
import re
import subprocess
import sys

# Loaded by path, as per-request.py loads it: the profile is read the way footprint.py reads it.
_spec = importlib.util.spec_from_file_location(
    "footprint", os.path.join(os.path.dirname(os.path.abspath(__file__)), "footprint.py"))
footprint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(footprint)

# `lock add`, `lock cmpxchg`, … and `xchg reg, mem` (a register-to-register `xchg` has no
# memory operand: no parenthesis in AT&T syntax).
_LOCKED = re.compile(r"^\s*([0-9a-f]+):\s+(lock\b.*|xchg\b.*\(.*)$")
_CRATE = re.compile(r"/registry/src/[^/]+/([A-Za-z0-9_\-]+?)-\d[^/]*/")
_STD = "/rustc/"
# A location with a line number (`file:12`, maybe with ` (discriminator 3)` after it).
_LINE = re.compile(r":[1-9]\d*(?: \(discriminator \d+\))?$")


def locked_addresses(binary):
    """The addresses of the binary's locked instructions."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary],
                         capture_output=True, text=True, check=True).stdout
    return {int(m.group(1), 16) for m in map(_LOCKED.match, out.splitlines()) if m}


def executed(path, binary):
    """Times each of the binary's instructions ran (footprint.py's reading of the profile)."""
    name = os.path.realpath(binary)
    return {addr: n for (obj, addr), n in footprint.executed(path).items()
            if obj and os.path.realpath(obj) == name}


def inline_chains(binary, addresses):
    """Each address's inlined frames, innermost first, as (function, file:line)."""
    if not addresses:
        return {}
    out = subprocess.run(["addr2line", "-i", "-f", "-C", "-a", "-e", binary],
                         input="\n".join(hex(a) for a in addresses), capture_output=True,
                         text=True, check=True).stdout
    chains, current, lines = {}, None, []
    for line in out.splitlines():
        if line.startswith("0x"):
            current = int(line, 16)
            chains[current], lines = [], []
            continue
        lines.append(line)
        if len(lines) == 2:
            chains[current].append(tuple(lines))
            lines = []
    return chains


def source(frames):
    """Where a locked instruction comes from: a crate, or legate's `Arc` counts, or its own."""
    outside = [loc for _, loc in frames if _STD not in loc]
    if not outside:
        return "(standard library only)"
    crate = _CRATE.search(outside[0])
    if crate:
        return crate.group(1)
    if any("alloc/src/sync.rs" in loc for _, loc in frames if _STD in loc):
        return "Arc counts in legate's code"
    return "legate's own code (other atomics)"


def per_request(binary, few_path, many_path, n):
    """Locked instructions per request by source, largest first, and their total."""
    few, many = executed(few_path, binary), executed(many_path, binary)
    locked = locked_addresses(binary)
    ran = {a: (many[a] - few.get(a, 0)) / n for a in locked if many.get(a, 0) > few.get(a, 0)}
    chains = inline_chains(binary, sorted(ran))
    # Without line tables addr2line gives no line (`??:0`, or `unit:?`) for any address, and
    # each would be counted as legate's own: said so instead of a table that looks right and
    # is not.
    if ran and not any(_LINE.search(loc) for frames in chains.values() for _, loc in frames):
        sys.exit(f"{binary} has no line tables: build it as the docstring says "
                 "(RUSTFLAGS=\"-Cdebuginfo=line-tables-only -Cstrip=none\")")
    rows = collections.Counter()
    for address, count in ran.items():
        rows[source(chains.get(address, []))] += count
    return rows.most_common(), sum(ran.values())


def describe(rows, total, limit=12):
    out = [f"{total:10,.1f}  locked instructions per request"]
    out += [f"{count:10,.1f}  {name}" for name, count in rows[:limit]]
    rest = sum(count for _, count in rows[limit:])
    if rest:
        out.append(f"{rest:10,.1f}  ({len(rows) - limit} more)")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: atomics.py BINARY FEW.out MANY.out N")
    print(describe(*per_request(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))))
