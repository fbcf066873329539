"""The exported C++ runs tangent products unchecked first, and the checked ones only when an output they reach holds a
NaN (export/optimistic.py): the values are the checked products' in every case.

Oracle: the jacobian written out by hand (tests/ad/test_forward.py's grid), ember's numpy interpreter, which
evaluates every tangent product checked, and the same C++ with the rerun taken out, which must show the NaNs that
the rerun removes."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from ember import ad
from ember.export import Arg, NumericalFunction, generate_module, render_module
from ember.export.native import find_cxx
from ember.export.optimistic import reached_outputs
from tests.ad.test_forward import grid_jacobian, grid_residual

CXX = find_cxx()


def grid_inputs() -> list[np.ndarray]:
    finite = np.linspace(-0.5, 0.5, 25).reshape(5, 5)
    infinite = finite.copy()
    infinite[1, 1] = np.inf
    both = infinite.copy()
    both[2, 3] = np.nan
    return [finite, infinite, both]


def test_a_jacobian_runs_plain_products_and_reruns_the_checked_ones_when_its_output_holds_a_nan():
    """The dense jacobian of the 5 x 5 grid residual loops over its 25 directions, so its products meet zero seeds
    at run time: with u = inf somewhere, the plain products make NaNs of the structural zeros beside it, and the
    checked rerun gives the oracle's entries bit for bit, as it does for finite inputs and for a NaN input."""
    f = ad.jacobian(NumericalFunction("grid", grid_residual, [Arg((5, 5))]))
    source = render_module("grid", [f])[1]
    checked, call = source.split("void call_checked(")[1].split("void call_raw(")
    assert "<true>(" in checked and "<false>(" not in checked
    assert "<false>(" in call and "if (ember_nan) call_checked(" in call and "<true>(" not in call
    f.compile()
    for u in grid_inputs():
        want = grid_jacobian(u)
        np.testing.assert_array_equal(f(u).reshape(25, 25), want)
        np.testing.assert_array_equal(f.interpret(u).reshape(25, 25), want)


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_without_the_rerun_the_plain_products_leave_nans_where_the_checked_ones_give_zero(tmp_path):
    """The same module with its rerun taken out: an infinite u gives NaN entries where the oracle has finite ones,
    so the rerun is what makes them right; finite inputs need no rerun."""
    f = ad.jacobian(NumericalFunction("grid", grid_residual, [Arg((5, 5))]))
    hpp, cpp = generate_module("grid", [f], str(tmp_path))
    with open(cpp) as fh: source = fh.read()
    assert source.count("if (ember_nan)") == 1
    with open(cpp, "w") as fh: fh.write(source.replace("if (ember_nan)", "if (false)"))
    main = tmp_path / "main.cpp"
    main.write_text('#include <cstdio>\n#include "grid.hpp"\nint main() {\n  double u[25], out[625];\n'
                    '  for (double& v : u) if (std::scanf("%lf", &v) != 1) return 1;\n'
                    '  auto ws = grid::grid_jac::make_ws();\n  grid::grid_jac::call_raw(u, out, ws->bytes);\n'
                    '  for (double v : out) std::printf("%.17g\\n", v);\n}\n')
    exe = str(tmp_path / "main")
    subprocess.run([CXX, "-std=c++17", "-O2", "-o", exe, str(main), cpp, f"-I{tmp_path}"], check=True)
    def run(u: np.ndarray) -> np.ndarray:
        text = "\n".join(repr(float(v)) for v in u.ravel())
        out = subprocess.run([exe], input=text, capture_output=True, text=True, check=True).stdout
        return np.array([float(v) for v in out.split()]).reshape(25, 25)
    finite, infinite, _ = grid_inputs()
    np.testing.assert_array_equal(run(finite), grid_jacobian(finite))
    plain, want = run(infinite), grid_jacobian(infinite)
    assert np.isnan(plain).sum() > 1 and np.isfinite(want[np.isnan(plain)]).sum() > 0


def test_only_the_outputs_a_product_reaches_are_tested():
    """A function of its value and its jacobian: the value has no tangent product on its way, so only the jacobian
    is tested for a NaN; a NaN in the value (x[0] < 0 in sqrt) reruns nothing and changes no entry."""
    f = NumericalFunction("f", lambda x: x[0].sqrt().stack(x[1] * 2.0) + x[1] * x.exp(), [Arg(2)])
    jac = ad.jacobian(f)
    both = NumericalFunction("both", lambda x: (f(x), jac(x)), [Arg(2)])
    source = render_module("both", [both])[1]
    call = source.split("void call_raw(")[1]
    assert "if (ember_nan) call_checked(" in call and "any_nan" not in call
    # the kernel's plain instance flags a NaN it stores into the jacobian (data1), not one in the value (data0)
    lines = source.split("void both_k0_")[1].split("\n}")[0].split("\n")
    stores = [(line.strip(), after.strip()) for line, after in zip(lines, lines[1:]) if line.strip().startswith("*(")]
    assert [a.startswith("ember_nan |=") for s, a in stores if s.startswith("*(data0")] == [False, False]
    assert all(a.startswith("ember_nan |=") for s, a in stores if s.startswith("*(data1") and "= 0.0;" not in s)
    both.compile()
    for x in (np.array([0.25, 3.0]), np.array([-1.0, 3.0]), np.array([0.0, np.inf])):
        got, want = both(x), both.interpret(x)
        for g, w in zip(got, want, strict=True): np.testing.assert_array_equal(g, w)


def test_a_jacobian_compared_or_maxed_keeps_its_products_checked():
    """A comparison or a max of a jacobian's entries can turn a NaN into a number: the plain products' NaN would
    then not show in the output, so such a function runs the checked products only."""
    f = NumericalFunction("f", lambda x: x[0].sqrt().stack(x[1] * 2.0) + x[1] * x.exp(), [Arg(2)])
    jac = ad.jacobian(f)
    compared = NumericalFunction("compared", lambda x: (jac(x) > 1.0).where(1.0, -1.0).sum(), [Arg(2)])
    maxed = NumericalFunction("maxed", lambda x: jac(x).max(), [Arg(2)])
    for g in (compared, maxed):
        assert reached_outputs(g.plan, {item.ast for item in g.plan.items}) is None
        call = render_module(g.name, [g])[1].split("void call_raw(")[1]
        assert "<false>" not in call and "any_nan" not in call and "call_checked" not in call
        g.compile()
        for x in (np.array([0.25, 3.0]), np.array([0.0, np.inf])):
            np.testing.assert_array_equal(g(x), g.interpret(x))


def test_a_function_without_tested_products_is_rendered_as_before():
    """No tangent product at all, or none left to test at run time (the sparse grid jacobian's stencil seeds fold to
    constants: its products are plain in both instances): no template, no NaN test, no rerun. A test of its 125
    outputs, scalar, cost a Bratu jacobian 40% of its time."""
    f = NumericalFunction("plain", lambda x: (x * x).sin().sum(), [Arg(4)])
    assert reached_outputs(f.plan, {item.ast for item in f.plan.items}) == []
    sparse = ad.spjacobian(NumericalFunction("grid", grid_residual, [Arg((5, 5))]))
    for g in (f, sparse):
        source = render_module("m", [g])[1]
        assert "template <bool" not in source and "any_nan" not in source and "call_checked" not in source


def test_a_small_output_is_flagged_as_stored_a_large_one_scanned():
    """Up to FLAG_LIMIT elements, the kernel flags a NaN beside each store (a scan after it cost a third of a small
    hessian's time); a vmapped jacobian of 200 x 25 x 25 entries is scanned after its kernel, vector by vector.
    Both give the interpreter's bits at an infinite input, where the plain products leave NaNs."""
    f = ad.jacobian(NumericalFunction("grid", grid_residual, [Arg((5, 5))]))
    many = ad.vmap(f, axis_size=200)
    small, large = (render_module(g.name, [g])[1].split("void call_raw(")[1] for g in (f, many))
    assert "if (ember_nan) call_checked(" in small and "any_nan" not in small
    assert "any_nan(out0, 125000)" in large and "ember_nan" not in large
    many.compile()
    u = np.stack([grid_inputs()[1]] * 200)
    np.testing.assert_array_equal(many(u), many.interpret(u))
