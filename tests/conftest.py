"""Test-wide settings: every NumericalFunction's first call also runs the numpy interpreter and checks that its
results are the native code's bit for bit (INTERPRET=2, see ember/export/interpreter.py)."""

import os

os.environ.setdefault("INTERPRET", "2")
