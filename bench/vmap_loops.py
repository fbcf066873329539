"""Loops stay loops: the C++ for ember.ad.vmap of one cart-pole RK4 stage over N stages, N = 10, 100, 1000.

Run: python bench/vmap_loops.py. Prints the generated source's size, g++ -O2 compile time and how many loops run
over N: the source differs only in the number N, so its size and compile time do not grow with N.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

import cartpole  # noqa: E402

import ember.ad  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.export import Arg, NumericalFunction, generate_module  # noqa: E402


def stage(state: Tensor, force: Tensor) -> Tensor:
    """One RK4 step of the cart-pole: the function a multiple-shooting transcription evaluates at every stage."""
    return Tensor.stack(*cartpole.rk4_step(tuple(state[i] for i in range(4)), force, Tensor.sin, Tensor.cos))


def main() -> None:
    f = NumericalFunction("stage", stage, [Arg(4), Arg(())])
    print("| N | source bytes | g++ -O2 s | loops over N |\n| ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as folder:
        for n in (10, 100, 1000):
            _, source = generate_module("stages", [ember.ad.vmap(f, axis_size=n)], folder)
            text = open(source).read()
            start = time.perf_counter()
            subprocess.run(["g++", "-std=c++17", "-O2", "-c", source, "-o", os.path.join(folder, "stages.o")],
                           check=True)
            print(f"| {n} | {len(text)} | {time.perf_counter() - start:.2f} | {text.count(f'< {n};')} |")


if __name__ == "__main__":
    main()
