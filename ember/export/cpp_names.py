"""Which names the exported C++ may use: a NumericalFunction's and a module's name become C++ namespaces (rejected
when C++ cannot take them), argument names become C++ parameters (renamed `in<i>` when it cannot).

Python accepts as identifiers many names C++ does not: its keywords (`class`, `new`, `int`, `float`, `this`), names
reserved for the compiler and library (`__x`, `_Upper`), macros of the headers the code includes (`errno`, `NAN`)
and the names the generated code defines itself (`Buffer`, `call_raw`, `int32_t` in kernels).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# C++17's keywords and alternative tokens ([lex.key], [lex.digraph]), and C++20's, so that the code still compiles
# under a newer standard; `final`, `override`, `import` and `module` are identifiers with a special meaning, not
# keywords.
CPP_KEYWORDS = frozenset("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
char16_t char32_t class co_await co_return co_yield compl concept const const_cast consteval constexpr constinit
continue decltype default delete do double dynamic_cast else enum explicit export extern false float for friend goto
if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
register reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template
this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while xor
xor_eq""".split())

# Names in scope where the generated code uses a function's or a module's name: the standard namespace, what the
# module defines (Buffer, the helpers kernels call, EMBER_KERNEL) and the types kernels name unqualified, macros of
# <cmath>, <cstring>, <cstdint> and <cerrno> (g++ defines _GNU_SOURCE, so math.h's M_* constants are macros too).
CPP_TAKEN = frozenset("""std Buffer bit_cast bf16_load bf16_bits bf16_round EMBER_KERNEL int8_t int16_t int32_t
int64_t uint8_t uint16_t uint32_t uint64_t intptr_t uintptr_t size_t ptrdiff_t max_align_t nullptr_t errno assert
offsetof NULL EOF NAN INFINITY HUGE_VAL HUGE_VALF HUGE_VALL EDOM ERANGE EILSEQ math_errhandling MATH_ERRNO
MATH_ERREXCEPT FP_NAN FP_INFINITE FP_ZERO FP_NORMAL FP_SUBNORMAL FP_ILOGB0 FP_ILOGBNAN FP_FAST_FMA FP_FAST_FMAF
FP_FAST_FMAL M_E M_LOG2E M_LOG10E M_LN2 M_LN10 M_PI M_PI_2 M_PI_4 M_1_PI M_2_PI M_2_SQRTPI M_SQRT2 M_SQRT1_2""".split())

# Names a function's namespace defines, which its call() and call_raw() parameters must not hide.
FUNCTION_SCOPE = frozenset("""ws data size rank nnz sparse_rows sparse_cols colors indptr indices Workspace init_ws
make_ws call call_raw""".split())

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GENERATED_ARG = re.compile(r"(in\d.*|out.*)")  # the renamed arguments' names, and the outputs', with theirs


def cpp_name_problem(name: str, global_scope: bool = False, strict: bool = False) -> str | None:
    """Why `name` cannot name a C++ namespace or parameter in ember's generated code, or None when it can. At
    `global_scope` (a module's namespace) a leading underscore is reserved as well.

    The standard reserves every name that starts with `__` or `_` and a capital, or holds `__` anywhere; compilers
    and libraries define names of the first two kinds (`__linux__`, `_Float16`, `_GLIBCXX_...`), none of the third.
    A function name may hold `__` (unless `strict`): `f_`'s jacobian is `f__jac` (ember/ad), which no compiler
    rejects; argument names, renamed at no cost, are checked `strict`ly."""
    if not _IDENTIFIER.fullmatch(name): return "is not an ASCII identifier"
    if name in CPP_KEYWORDS: return "is a C++ keyword"
    if name.startswith("__") or re.match(r"_[A-Z]", name) or (strict and "__" in name):
        return "is reserved for the C++ implementation, as names starting with __ or with _ and a capital are"
    if global_scope and name.startswith("_"): return "starts with an underscore, reserved at C++ global scope"
    if name in CPP_TAKEN: return "is a name the generated C++ already uses (a standard macro, type or helper)"
    return None


def check_cpp_name(name: str, what: str, global_scope: bool = False) -> None:
    """Raise ValueError naming `what` when `name` cannot be a C++ namespace (see cpp_name_problem)."""
    if (problem := cpp_name_problem(name, global_scope)) is not None:
        suggestion = re.sub(r"\W", "_", name.strip("_")) or "f"
        suggestion = suggestion if cpp_name_problem(suggestion, global_scope) is None else suggestion + "_"
        raise ValueError(f"{what}: name {name!r} {problem}; it names a C++ namespace in the exported code; "
                         f"choose another, e.g. {suggestion!r}")


def cpp_arg_names(names: Sequence[str], function: str) -> list[str]:
    """C++ parameter names for arguments called `names`: each as given where C++ takes it and it clashes with no
    other name of the function's namespace (another argument, its `<name>_t` type and `<name>_size` constant, the
    kernels `<function>_k...`); else `in<i>`, its position, which no kept name can equal."""
    taken = set(FUNCTION_SCOPE)
    chosen: list[str | None] = []
    for name in names:
        derived = {name, f"{name}_t", f"{name}_size"}
        ok = (cpp_name_problem(name, strict=True) is None and not _GENERATED_ARG.fullmatch(name) and not derived & taken
              and not name.startswith((f"{function}_k", f"{function}_const")))
        chosen.append(name if ok else None)
        if ok: taken |= derived
    return [name if name is not None else f"in{i}" for i, name in enumerate(chosen)]
