"""Long straight-line kernels cut into pieces: functions of at most PIECE_STATEMENTS statements, for the C++ compiler.

Why: g++ -O2 allocates registers over a whole function, in time that grows much faster than its length when
thousands of values are live at once, as in an unrolled derivative (every primal value read by every direction).
A 3-interval quadrotor MPC Lagrangian hessian rendered as one function of 19,000 statements took 31 s to compile,
58% of it in LRA's hard register assignment; its statements in functions of 500 took 7.4 s. What one piece hands
the next goes through an array in memory (a call the compiler may not inline: each piece is allocated alone), a
store and a load per value, a small part of such a function's work.

Before: a kernel rendered by the CppRenderer: its signature `... void name(params) {`, the body one statement a line,
  two spaces of indent per loop level.
After: the same kernel where every run of more than SPLIT_FROM statements at one depth (declarations `const T x =
  ...;`, stores and flags set, at the top or in a loop's body) is replaced by calls of `name_partN`, each holding
  PIECE_STATEMENTS of them, defined before it. A value a piece reads from earlier code comes from `carry_<type>[i]`,
  written where it is defined (or by the kernel, for a value defined before the run); the kernel reads back what the
  code after the run uses. The pieces take the kernel's own parameters, the counters of the loops around the run and
  the carry arrays; in a kernel with tangent products each is a template on CHECKED as the kernel is. A run that
  names an accumulator array or a type outside CARRIED_TYPES and the vector types is left whole. (The N = 50 MPC
  hessian's loop body of 6,400 statements: 5.9 -> 3.6 s to compile, 0.80-1.02x the time.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SPLIT_FROM = 4000  # top-level statements in a row from which a kernel is cut: a folded quadrotor's 5,100 build in
# 3.7 s, not 4.8, and run 0.88-0.94x the time; the N = 50 MPC jacobian's 4,600 run as fast (0.92-1.11x, median 1.0)
PIECE_STATEMENTS = 500  # statements per piece (19,000 statements: 31 s in one function, 9.2 s by 1000, 7.4 s by 500)
CARRIED_TYPES = frozenset({"double", "float", "bool", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t",
                           "uint16_t", "uint32_t", "uint64_t"})
VECTOR_TYPE = re.compile(r"^[fiu]\d+x\d+$")  # generate_module's vector_bytes: f64x8, its masks i64x8 (cvector.c_type)
DECLARATION = re.compile(r"^(?P<pad> +)const (?P<type>\w+) (?P<name>\w+) = (?P<expr>.*);$")
STORE = re.compile(r"^(?P<pad> +)(?:if \(.*\) )?(?:\*.* = .*|\w+ \|= .*|store_\w+\(.*\));$")  # (a store, a vector's,
# or a flag set: cpp.py)
LOOP = re.compile(r"^ *for \((?P<type>\w+) (?P<name>\w+) = .*\) \{$")
VALUE = re.compile(r"\b(?:t|val|acc)\d+\b")
ARGS = "\0arguments\0"  # in a call until the carry arrays are known, with the piece's number
CALL = re.compile(re.escape(ARGS) + r"(\d+)\)")


@dataclass(frozen=True)
class Run:
    """Lines [start, end) of a kernel's body: declarations and stores at one depth, inside the loops `loops`."""

    start: int
    end: int
    pad: str  # their indent
    loops: tuple[str, ...]  # the loop counters in scope, as parameters (`const int32_t r0`)


@dataclass(frozen=True)
class Piece:
    """A function cut from a kernel: its name, its source, and its parameter list (for its checked instance)."""

    name: str
    source: str
    params: str


def cut_into_pieces(source: str, name: str, template: str) -> tuple[str, list[Piece]]:
    """(the kernel's source with its long runs replaced by calls, the pieces it calls); `template` is the template
    parameter's name for a kernel with tangent products, else "". A kernel with no long run comes back as it is."""
    lines = source.split("\n")
    head = next((i for i, line in enumerate(lines) if f" {name}(" in line and line.endswith(") {")), None)
    if head is None or lines[-1] != "}": return source, []
    params = lines[head][lines[head].index(f" {name}(") + len(name) + 2:-len(") {")]
    body = lines[head + 1:-1]
    runs = long_runs(body)
    if not runs: return source, []
    types = {m["name"]: m["type"] for line in body if (m := DECLARATION.match(line))}
    made_pieces: list[tuple[str, list[str], tuple[str, ...]]] = []  # (name, lines, loop counters)
    slots: dict[str, int] = {}  # a carried value's index in the array of its type
    counts: dict[str, int] = {}

    def slot(value: str) -> str:
        if value not in slots:
            slots[value] = counts.get(types[value], 0)
            counts[types[value]] = slots[value] + 1
        return f"carry_{types[value]}[{slots[value]}]"

    out: list[str] = []
    done = 0
    for run in runs:
        out += body[done:run.start]
        pad = run.pad
        chunks = [body[i:min(i + PIECE_STATEMENTS, run.end)] for i in range(run.start, run.end, PIECE_STATEMENTS)]
        made = [{d for line in chunk if (d := defined(line))} for chunk in chunks]
        reads = [sorted({v for line in chunk for v in used(line) if v in types} - mine, key=natural)
                 for chunk, mine in zip(chunks, made, strict=True)]
        after = {v for line in body[run.end:] for v in used(line)}
        wanted = after.union(*reads)  # what some later piece, or the code after the run, reads
        inside = set().union(*made)
        earlier = set().union(*reads) - inside  # defined before the run: the kernel hands them over
        out += [f"{pad}{slot(v)} = {v};" for v in sorted(earlier, key=natural)]
        for k, chunk in enumerate(chunks):
            code = [f"  const {types[v]} {v} = {slot(v)};" for v in reads[k]]
            for line in chunk:
                code.append(f"  {line[len(pad):]}")
                if (d := defined(line)) is not None and d in wanted: code.append(f"  {slot(d)} = {d};")
            part = f"{name}_part{len(made_pieces)}"
            out.append(f"{pad}{part}<{template}>({ARGS}{len(made_pieces)});" if template else
                       f"{pad}{part}({ARGS}{len(made_pieces)});")
            made_pieces.append((part, code, run.loops))
        out += [f"{pad}const {types[v]} {v} = {slot(v)};" for v in sorted(inside & after, key=natural)]
        done = run.end
    out += body[done:]
    carries = sorted(counts)
    kernel_args = [p.split()[-1] for p in params.split(", ") if p]
    prefix = f"template <bool {template}>\n" if template else ""
    args = [", ".join([*kernel_args, *(loop.split()[-1] for loop in loops), *(f"carry_{t}" for t in carries)])
            for _, _, loops in made_pieces]
    out = [CALL.sub(lambda m: args[int(m[1])] + ")", line) if ARGS in line else line for line in out]
    pieces = []
    for part, code, loops in made_pieces:
        every = ", ".join([*([params] if params else []), *loops, *(f"{t}* __restrict carry_{t}" for t in carries)])
        # a piece reads some of the kernel's parameters only: the others are [[maybe_unused]] (-Wextra -Werror)
        marked = ", ".join(f"[[maybe_unused]] {p}" for p in every.split(", ")) if every else ""
        pieces.append(Piece(part, f"{prefix}static EMBER_KERNEL EMBER_PIECE void {part}({marked}) {{\n" +
                            "\n".join(code) + "\n}", every))
    declared = [f"  {t} carry_{t}[{n}];" for t, n in sorted(counts.items())]
    return "\n".join([*lines[:head + 1], *declared, *out, "}"]), pieces


def long_runs(body: list[str]) -> list[Run]:
    """Each run of more than SPLIT_FROM declarations and stores at one depth (outside or inside loops) that can be
    cut."""
    runs: list[Run] = []
    loops: list[str] = []
    start, pad = None, ""
    for i, line in enumerate([*body, ""]):
        m = DECLARATION.match(line) or STORE.match(line)
        if m and start is not None and m["pad"] == pad: continue
        if start is not None and i - start > SPLIT_FROM and cuttable(body[start:i]):
            runs.append(Run(start, i, pad, tuple(loops)))
        start, pad = (i, m["pad"]) if m else (None, "")
        if (loop := LOOP.match(line)): loops.append(f"const {loop['type']} {loop['name']}")
        elif line.strip() == "}" and loops: loops.pop()
    return runs


def cuttable(run: list[str]) -> bool:
    """No accumulator arrays (a piece would need the array itself), every declared type one the carries hold."""
    return not any("acc" in v for line in run for v in VALUE.findall(line)) and \
        all(m["type"] in CARRIED_TYPES or VECTOR_TYPE.match(m["type"]) for line in run
            if (m := DECLARATION.match(line)))


def defined(line: str) -> str | None:
    return m["name"] if (m := DECLARATION.match(line)) else None


def used(line: str) -> set[str]:
    m = DECLARATION.match(line)
    return set(VALUE.findall(m["expr"] if m else line))


def natural(value: str) -> tuple[str, int]:
    digits = value.lstrip("tval")
    return value[:len(value) - len(digits)], int(digits)
