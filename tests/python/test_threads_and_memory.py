"""Concurrent runs of one model from Python threads, and resident memory over many runs."""
import concurrent.futures

import numpy as np

import models


def test_concurrent_runs_from_threads(classifier):
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((b % 5 + 1, 16)).astype(np.float32) for b in range(16)]

    def work(k):
        x = inputs[k % len(inputs)]
        expected = models.reference_classifier(x)
        for _ in range(50):
            out = classifier.run({"x": x})
            np.testing.assert_allclose(out["probs"], expected["probs"], rtol=1e-4, atol=1e-5)
            np.testing.assert_array_equal(out["label"], expected["label"])
        return k

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        assert sorted(pool.map(work, range(32))) == list(range(32))


def resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_resident_memory_stays_flat_over_10000_runs(classifier):
    # Batch 64: the outputs of one run take 3 KiB, so leaking them would show as 30 MiB.
    x = np.random.default_rng(8).standard_normal((64, 16)).astype(np.float32)
    for _ in range(500):  # the arena, the pool, numpy's and Python's caches
        classifier.run({"x": x})
    before = resident_bytes()
    for _ in range(10_000):
        out = classifier.run({"x": x})
    grown = resident_bytes() - before
    np.testing.assert_allclose(out["probs"], models.reference_classifier(x)["probs"], rtol=1e-4,
                               atol=1e-5)
    assert grown < 5 << 20, f"resident memory grew by {grown / (1 << 20):.1f} MiB"
