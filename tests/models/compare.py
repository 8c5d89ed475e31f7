#!/usr/bin/python3
"""Compares an output of `kiln run` with numpy's expected values.

Usage: /usr/bin/python3 compare.py EXPECTED.npy ACTUAL.npy [ATOL]

Passes (exit 0) when dtypes and shapes are equal and every element satisfies
|actual - expected| <= ATOL + RTOL * |expected| (numpy.allclose with the float32 tolerances
below; a NaN matches only a NaN); otherwise prints the worst elements and exits 1. A model whose
convolutions run as Winograd passes ATOL 1e-4: the error of its transforms scales with the
layer's outputs (about 1e-5 of max |y|), not with each element.
"""
import sys

import numpy as np

RTOL = 1e-4
ATOL = 1e-5


def main(expected_path, actual_path, atol=ATOL):
    expected = np.load(expected_path)
    actual = np.load(actual_path)
    if actual.dtype != expected.dtype:
        print(f"{actual_path}: dtype {actual.dtype}, expected {expected.dtype}")
        return 1
    if actual.shape != expected.shape:
        print(f"{actual_path}: shape {list(actual.shape)}, expected {list(expected.shape)}")
        return 1
    close = np.isclose(actual, expected, rtol=RTOL, atol=atol, equal_nan=True)
    if close.all():
        err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
        print(f"{actual_path}: {actual.size} values within rtol={RTOL} atol={atol} "
              f"(max abs error {err.max() if err.size else 0:.3g})")
        return 0
    bad = np.argwhere(~close)
    print(f"{actual_path}: {len(bad)} of {actual.size} values differ (rtol={RTOL} atol={atol})")
    for index in bad[:10]:
        i = tuple(index)
        print(f"  at {list(i)}: got {actual[i]!r}, expected {expected[i]!r}")
    return 1


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:])))
