"""Names the exported C++ cannot take: function and module names are rejected, argument names renamed `in<i>`.

Oracle: g++ compiles the generated module with a main that calls it, and prints what the Python call returns.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ember.export import Arg, NumericalFunction, generate_module
from ember.export.cpp_names import CPP_KEYWORDS, cpp_arg_names, cpp_name_problem
from ember.export.native import find_cxx

needs_cxx = pytest.mark.skipif(find_cxx() is None, reason="no C++ compiler (apt-get install g++)")

KEYWORD, RESERVED = "is a C++ keyword", "is reserved for the C++ implementation"
TAKEN, NOT_ASCII = "is a name the generated C++ already uses", "is not an ASCII identifier"
REJECTED_FUNCTION_NAMES = [
    ("class", KEYWORD), ("int", KEYWORD), ("new", KEYWORD), ("delete", KEYWORD), ("float", KEYWORD),
    ("return", KEYWORD), ("namespace", KEYWORD), ("xor_eq", KEYWORD), ("requires", KEYWORD), ("_Upper", RESERVED),
    ("__x", RESERVED), ("__linux__", RESERVED), ("std", TAKEN), ("errno", TAKEN), ("NAN", TAKEN), ("int32_t", TAKEN),
    ("Buffer", TAKEN), ("α", NOT_ASCII),
]


def weighted_sum(*xs: object) -> object:
    total = xs[0]
    for i, x in enumerate(xs[1:], start=2): total = total + x * i  # type: ignore[operator]  (Tensors)
    return total


@pytest.mark.parametrize("name, reason", REJECTED_FUNCTION_NAMES)
def test_a_function_named_what_cpp_cannot_take_is_rejected(name: str, reason: str):
    with pytest.raises(ValueError, match=re.escape(f"NumericalFunction: name '{name}' {reason}") + ".*choose another"):
        NumericalFunction(name, weighted_sum, [Arg(())])


def test_the_suggested_name_is_accepted():
    with pytest.raises(ValueError) as info:
        NumericalFunction("class", weighted_sum, [Arg(())])
    suggestion = str(info.value).rsplit("e.g. ", 1)[1].strip("'")
    assert suggestion == "class_" and cpp_name_problem(suggestion) is None


@pytest.mark.parametrize("module", ["class", "_private", "__m", "std"])
def test_a_module_named_what_cpp_cannot_take_is_rejected(module: str, tmp_path: Path):
    f = NumericalFunction("fine", weighted_sum, [Arg(())])
    with pytest.raises(ValueError, match=f"generate_module: name '{module}' "):
        generate_module(module, [f], str(tmp_path))


def test_every_cpp17_keyword_is_known():
    """The standard's table of keywords ([lex.key]) and alternative tokens, spelled out once more here."""
    standard = """alignas alignof asm auto bool break case catch char char16_t char32_t class const constexpr
    const_cast continue decltype default delete do double dynamic_cast else enum explicit export extern false float for
    friend goto if inline int long mutable namespace new noexcept nullptr operator private protected public register
    reinterpret_cast return short signed sizeof static static_assert static_cast struct switch template this
    thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while
    and and_eq bitand bitor compl not not_eq or or_eq xor xor_eq""".split()
    assert set(standard) <= CPP_KEYWORDS


def test_argument_names_are_kept_where_they_can_be_and_renamed_by_position_where_not():
    names = ["class", "x", "x_t", "in1", "y", "y", "_Upper", "call_raw", "out", "f_k0_E", "ws", "_private", "a__b"]
    assert cpp_arg_names(names, "f") == ["in0", "x", "in2", "in3", "y", "in5", "in6", "in7", "in8", "in9", "in10",
                                         "_private", "in12"]


@needs_cxx
def test_a_derivative_of_a_function_whose_name_ends_in_an_underscore_exports(tmp_path: Path):
    from ember.ad import gradient
    f = NumericalFunction("class_", lambda x: (x * x).sum(), [Arg(3)])
    g = gradient(f)
    assert g.name == "class__grad"
    generate_module("grads", [f, g], str(tmp_path))
    done = subprocess.run([find_cxx() or "g++", "-std=c++17", "-Wall", "-Werror", "-c", "-o", str(tmp_path / "g.o"),
                           str(tmp_path / "grads.cpp")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(g(np.array([1.0, 2.0, 3.0])), [2.0, 4.0, 6.0])


KEYWORD_ARGS = ["class", "int", "new", "x", "delete", "float", "__y", "_Upper", "return", "x_t", "errno", "ws"]

MAIN = """#include <cstdio>
#include "{module}.hpp"
int main() {{
  {module}::{name}::Workspace ws;
  {module}::{name}::init_ws(ws);
  const double in[{n}] = {{{values}}};
  double out = 0;
  {module}::{name}::call_raw({pointers}&out, ws.bytes);
  std::printf("%.17g\\n", out);
}}
"""


def compile_and_run(f: NumericalFunction, values: list[float], tmp_path: Path) -> float:
    """Generate a module holding `f`, compile it with a main calling it on scalar `values`, run, return its output."""
    hpp, cpp = generate_module("names", [f], str(tmp_path))
    main = tmp_path / "main.cpp"
    pointers = "".join(f"&in[{i}], " for i in range(len(values)))
    main.write_text(MAIN.format(module="names", name=f.name, n=len(values), values=", ".join(map(repr, values)),
                                pointers=pointers))
    exe = tmp_path / "main"
    cxx = find_cxx()
    assert cxx is not None
    done = subprocess.run([cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic", "-o", str(exe), str(main),
                           cpp], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + Path(hpp).read_text()
    return float(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)


@needs_cxx
def test_keyword_argument_names_compile_and_give_the_python_result(tmp_path: Path):
    f = NumericalFunction("kw", weighted_sum, [Arg(())] * len(KEYWORD_ARGS), arg_names=KEYWORD_ARGS)
    values = [0.5 + i for i in range(len(KEYWORD_ARGS))]
    want = float(f(*[np.float64(v) for v in values]))
    assert want == sum(v * max(i + 1, 1) if i else v for i, v in enumerate(values))
    assert compile_and_run(f, values, tmp_path) == want
    header = (tmp_path / "names.hpp").read_text()
    assert "const in0_t& in0" in header and "const x_t& x" in header and "const in9_t& in9" in header


def python_keywords_of_cpp(new: object, this: object, template: object, auto: object, delete: object) -> object:
    return weighted_sum(new, this, template, auto, delete)


@needs_cxx
def test_parameter_names_taken_from_the_python_signature_are_renamed_too(tmp_path: Path):
    f = NumericalFunction("sig", python_keywords_of_cpp, [Arg(())] * 5)
    assert f.arg_names == ["new", "this", "template", "auto", "delete"]
    values = [1.0, 2.0, 3.0, 4.0, 5.0]
    want = float(f(*values))
    assert want == 1 + 2 * 2 + 3 * 3 + 4 * 4 + 5 * 5
    assert compile_and_run(f, values, tmp_path) == want
