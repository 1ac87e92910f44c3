"""Code touched per request, read from two callgrind profiles made with `--dump-instr=yes`.

Instruction counts say how much work a request is; they do not say how much code it runs
through. A proxy's request path is mostly straight-line code (each instruction runs once or
twice), and on a core that other processes used since the last request, that code comes from
L2 or further: the number of distinct instructions, and the 64-byte cache lines they sit on,
is what a cold request has to fetch. Like the instruction count, it is differenced between a
run of `few` and a run of `many` requests: an instruction counts when it ran at least once for
every two requests of the difference, so start-up, shutdown and rare paths drop out.

Used by per-request.py; `python3 bench/footprint.py FEW.out MANY.out N` reads two kept
profiles (N requests apart) by itself.
"""

import collections
import re
import sys

LINE = 64
# `ob=(3) /path` names an object once; later `ob=(3)` refers to it. `cob=` shares the table.
_OBJ = re.compile(r"(c?)ob=\((\d+)\)(?: (.*))?")


def _position(field, last):
    """An instruction address from a cost line's first field (absolute, relative or `*`)."""
    if field == "*":
        return last
    if field[0] in "+-":
        step = int(field[1:], 0)
        return last + step if field[0] == "+" else last - step
    return int(field, 0)


def executed(path):
    """Times each instruction ran, keyed by (object, address): self costs only."""
    counts = collections.Counter()
    names = {}
    obj = None
    last = 0
    after_call = False
    with open(path) as f:
        for line in f:
            if after_call:
                # The line after `calls=` is the call site with the callee's inclusive cost:
                # it moves the position but is not this instruction's own count.
                after_call = False
                last = _position(line.split()[0], last)
                continue
            if line.startswith("calls="):
                after_call = True
                continue
            m = _OBJ.match(line)
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3).strip()
                if not m.group(1):
                    obj = names.get(m.group(2))
                continue
            if not line or line[0] not in "0123456789+-*":
                continue
            fields = line.split()
            last = _position(fields[0], last)
            # positions: instr line, then the event count (Ir).
            if len(fields) >= 3:
                counts[(obj, last)] += int(fields[2])
    return counts


def per_request(few_path, many_path, requests):
    """(distinct instructions, cache lines) run for every two requests of the difference."""
    few = executed(few_path)
    many = executed(many_path)
    hot = [key for key, n in many.items() if (n - few.get(key, 0)) * 2 >= requests]
    lines = {(obj, addr // LINE) for obj, addr in hot}
    return len(hot), len(lines)


def describe(instructions, lines):
    return (f"{instructions:,} distinct instructions on {lines:,} cache lines "
            f"({lines * LINE / 1024:,.0f} KiB)")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: footprint.py FEW.out MANY.out REQUESTS_BETWEEN")
    print(describe(*per_request(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
