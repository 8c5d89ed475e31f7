#!/usr/bin/python3
"""Compares every .npy in EXPECTED_DIR with the file of the same name in ACTUAL_DIR.

Usage: /usr/bin/python3 compare_outputs.py EXPECTED_DIR ACTUAL_DIR
Same dtype and shape; floats within np.allclose(actual, expected, rtol=1e-5, atol=1e-6),
integers equal. Exits 1 naming the first difference.
"""
import os
import sys

import numpy as np

RTOL, ATOL = 1e-5, 1e-6


def main():
    expected_dir, actual_dir = sys.argv[1], sys.argv[2]
    names = sorted(n for n in os.listdir(expected_dir) if n.endswith(".npy"))
    if not names:
        sys.exit(f"no .npy outputs in {expected_dir}")
    for name in names:
        expected = np.load(os.path.join(expected_dir, name))
        path = os.path.join(actual_dir, name)
        if not os.path.exists(path):
            sys.exit(f"{name}: missing in {actual_dir}")
        actual = np.load(path)
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            sys.exit(f"{name}: expected {expected.dtype}{list(expected.shape)}, "
                     f"found {actual.dtype}{list(actual.shape)}")
        if np.issubdtype(expected.dtype, np.floating):
            same = np.allclose(actual, expected, rtol=RTOL, atol=ATOL)
        else:
            same = np.array_equal(actual, expected)
        if not same:
            diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max()
            sys.exit(f"{name}: values differ (max abs difference {diff})")
        print(f"{name}: {actual.dtype}{list(actual.shape)} matches")


if __name__ == "__main__":
    main()
