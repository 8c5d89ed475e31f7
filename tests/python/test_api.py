"""kiln.compile, kiln.load, kiln.Model: inputs and outputs, dtypes, dynamic dims, conversions,
export, bench and errors, against numpy references (float32: |kiln - numpy| <= 1e-5 + 1e-4 *
|numpy|; float16, float64, integers and bool: exact, the ops being exact in each dtype)."""
import json
import os
import shutil
import subprocess
import threading
import time
import tracemalloc

import numpy as np
import pytest

import kiln
import models
from kiln import _kiln

RTOL, ATOL = 1e-4, 1e-5


def assert_close(actual, expected, name=""):
    assert actual.shape == expected.shape, name
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=name)


def check_classifier(outputs, x):
    expected = models.reference_classifier(x)
    assert set(outputs) == {"logits", "probs", "label"}
    assert outputs["logits"].dtype == np.float32 and outputs["label"].dtype == np.int64
    assert_close(outputs["logits"], expected["logits"], "logits")
    assert_close(outputs["probs"], expected["probs"], "probs")
    np.testing.assert_array_equal(outputs["label"], expected["label"])


def test_compile_from_path_bytes_and_model_proto(classifier_path, classifier):
    import onnx
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    check_classifier(classifier.run({"x": x}), x)
    with open(classifier_path, "rb") as f:
        data = f.read()
    check_classifier(kiln.compile(data).run({"x": x}), x)
    check_classifier(kiln.compile(bytearray(data))({"x": x}), x)
    check_classifier(kiln.compile(onnx.load(classifier_path)).run({"x": x}), x)
    import pathlib
    check_classifier(kiln.compile(pathlib.Path(classifier_path), autotune="off").run({"x": x}), x)


def test_the_library_says_its_target_and_the_variant_this_cpu_runs(classifier):
    assert classifier.target == "auto"
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split())
    v4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags
    assert classifier.variant == ("x86-64-v4" if v4 else "x86-64-v3")


def test_inputs_and_outputs_describe_the_model(classifier):
    (x,) = classifier.inputs
    assert (x.name, x.dtype, x.shape, x.type) == ("x", np.dtype(np.float32), ("batch", 16),
                                                  "tensor(float)")
    assert [(o.name, o.dtype.name, o.shape) for o in classifier.outputs] == [
        ("logits", "float32", ("batch", 5)), ("probs", "float32", ("batch", 5)),
        ("label", "int64", ("batch",))]
    assert "batch" in repr(classifier)


@pytest.mark.parametrize("batch", [1, 3, 8, 0])
def test_dynamic_batch(classifier, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    outputs = classifier.run({"x": x})
    assert outputs["logits"].shape == (batch, 5)
    check_classifier(outputs, x)


def test_every_dtype(model_dir):
    model = kiln.compile(models.make_dtypes(model_dir))
    assert [i.dtype for i in model.inputs] == [np.dtype(d) for d in models.DTYPES]
    assert {i.type for i in model.inputs} >= {"tensor(float)", "tensor(double)", "tensor(bool)",
                                             "tensor(float16)", "tensor(uint64)", "tensor(int8)"}
    for n in (4, 1):
        feeds = models.dtype_inputs(n, seed=n)
        outputs = model.run(feeds)
        for name, expected in models.reference_dtypes(feeds).items():
            assert outputs[name].dtype == expected.dtype, name
            np.testing.assert_array_equal(outputs[name], expected, err_msg=name)


def test_dynamic_dims_by_name(dynamic):
    assert dynamic.inputs[0].shape == ("batch", "seq", 4)
    assert dynamic.outputs[1].shape == ("batch", 4)
    rng = np.random.default_rng(2)
    s = rng.standard_normal(4).astype(np.float32)
    for shape in [(1, 1, 4), (2, 7, 4), (5, 3, 4), (3, 0, 4)]:
        x = rng.standard_normal(shape).astype(np.float32)
        outputs = dynamic.run({"x": x, "s": s})
        for name, expected in models.reference_dynamic(x, s).items():
            assert_close(outputs[name], expected, f"{name} at {shape}")


def test_dims_fix_symbols_when_compiling(model_dir):
    model = kiln.compile(models.make_dynamic(model_dir), dims={"batch": 2})
    assert model.inputs[0].shape == (2, "seq", 4)
    rng = np.random.default_rng(3)
    x, s = rng.standard_normal((2, 6, 4)).astype(np.float32), np.ones(4, np.float32)
    assert_close(model.run({"x": x, "s": s})["total"], models.reference_dynamic(x, s)["total"])
    with pytest.raises(kiln.KilnUserError, match="'x'"):
        model.run({"x": np.ones((3, 6, 4), np.float32), "s": s})
    with pytest.raises(kiln.KilnUserError, match="no symbolic dim 'nosuch'.*batch, seq"):
        kiln.compile(models.make_dynamic(model_dir), dims={"nosuch": 2})
    with pytest.raises(kiln.KilnUserError, match="negative"):
        kiln.compile(models.make_dynamic(model_dir), dims={"batch": -1})


class ArrayInterfaceOnly:
    """An object numpy reads through __array_interface__ alone."""

    def __init__(self, array):
        self._array = array
        self.__array_interface__ = array.__array_interface__


class DLPackOnly:
    """An object with DLPack alone, as a CPU torch tensor offers it."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_input_conversions(dynamic):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    s = rng.standard_normal(4).astype(np.float32)
    expected = models.reference_dynamic(x, s)["total"]
    variants = {
        "list": (x.tolist(), s.tolist()),
        "__array_interface__": (ArrayInterfaceOnly(x), ArrayInterfaceOnly(s)),
        "DLPack": (DLPackOnly(x), DLPackOnly(s)),
        "non-contiguous": (np.asfortranarray(x), s[::1]),
        "strided": (np.repeat(x, 2, axis=2)[:, :, ::2], np.concatenate([s, s])[:4]),
        "big-endian": (x.astype(">f4"), s.astype(">f4")),
    }
    for what, (xv, sv) in variants.items():
        assert_close(dynamic.run({"x": xv, "s": sv})["total"], expected, what)


def test_contiguous_inputs_are_not_copied(reduce_model):
    # numpy reports its allocations to tracemalloc: a copy of the 32 MiB input would show.
    x = np.ones((2048, 4096), np.float32)
    reduce_model.run({"x": x})  # first run: the arena and the pool
    tracemalloc.start()
    try:
        total = reduce_model.run({"x": x})["total"]
        _, contiguous_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        reduce_model.run({"x": x.T})  # a transposed view must be copied
        _, transposed_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total.shape == () and float(total) == 2048 * 4096
    assert contiguous_peak < 1 << 20, contiguous_peak
    assert transposed_peak >= x.nbytes, transposed_peak


def test_outputs_own_their_memory(classifier):
    x = np.random.default_rng(5).standard_normal((4, 16)).astype(np.float32)
    first = classifier.run({"x": x})
    kept = {k: v.copy() for k, v in first.items()}
    second = classifier.run({"x": -x})
    for name in first:
        assert not np.shares_memory(first[name], second[name])
        np.testing.assert_array_equal(first[name], kept[name])
        assert first[name].flags.writeable and first[name].flags.c_contiguous
    first["logits"][:] = 0  # writable, and nobody else's
    np.testing.assert_array_equal(second["logits"], classifier.run({"x": -x})["logits"])


def test_export_and_load(classifier, scratch):
    path = os.path.join(scratch, "exported", "classifier.so")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    classifier.export(path)
    loaded = kiln.load(path, threads=1)
    assert loaded.path == path
    assert [i.shape for i in loaded.inputs] == [("batch", 16)]
    x = np.random.default_rng(6).standard_normal((2, 16)).astype(np.float32)
    check_classifier(loaded.run({"x": x}), x)
    assert [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".kiln-export")] == []
    with pytest.raises(kiln.KilnUserError, match="cannot write"):
        classifier.export(os.path.join(scratch, "no-such-dir", "model.so"))


def test_bench_reports_the_figures_of_kiln_bench(classifier, classifier_path, scratch):
    figures = classifier.bench(iters=20, warmup=2, dims={"batch": 4})
    assert figures["iters"] == 20 and figures["warmup"] == 2 and figures["batch"] == 4
    assert 0 < figures["min_ms"] <= figures["p50_ms"] <= figures["p90_ms"] <= figures["p99_ms"]
    assert figures["samples_per_s"] == pytest.approx(4 * figures["throughput_per_s"])
    assert figures["throughput_per_s"] == pytest.approx(1000 / figures["mean_ms"])
    x = np.zeros((2, 16), np.float32)
    assert classifier.bench({"x": x}, iters=5, warmup=0)["batch"] == 2
    kiln_bin = os.environ.get("KILN_BIN")
    if kiln_bin:
        cli = subprocess.run([kiln_bin, "bench", classifier_path, "--json", "--iters", "5",
                              "--warmup", "1", "--cache-dir", os.environ["KILN_CACHE_DIR"]],
                             check=True, capture_output=True, text=True)
        assert set(json.loads(cli.stdout.strip().splitlines()[-1])) == set(figures)
    with pytest.raises(kiln.KilnUserError, match="iters"):
        classifier.bench(iters=0)


def test_errors_name_what_is_wrong(classifier, scratch):
    x = np.zeros((2, 16), np.float32)
    with pytest.raises(kiln.KilnUserError, match="float32.*float64|float64.*float32"):
        classifier.run({"x": x.astype(np.float64)})
    with pytest.raises(kiln.KilnUserError, match="'x'.*rank|rank.*'x'"):
        classifier.run({"x": np.zeros((2, 16, 1), np.float32)})
    with pytest.raises(kiln.KilnUserError, match="'x'"):
        classifier.run({"x": np.zeros((2, 15), np.float32)})
    with pytest.raises(kiln.KilnUserError, match="input 'x' is missing"):
        classifier.run({})
    with pytest.raises(kiln.KilnUserError, match="no input 'y'.*its inputs: x"):
        classifier.run({"x": x, "y": x})
    with pytest.raises(kiln.KilnUserError, match="dict"):
        classifier.run([x])
    with pytest.raises(kiln.KilnUserError, match="complex128"):
        classifier.run({"x": x.astype(np.complex128)})
    with pytest.raises(ValueError, match="no such file"):
        kiln.compile(os.path.join(scratch, "missing.onnx"))
    with pytest.raises(kiln.KilnUserError):
        kiln.compile(b"this is not an onnx model")
    with pytest.raises(kiln.KilnUserError, match="Frobnicate"):
        kiln.compile(models.unsupported_model_bytes())
    with pytest.raises(kiln.KilnUserError, match="autotune"):
        kiln.compile(b"", autotune="fast")
    with pytest.raises(kiln.KilnUserError, match="threads"):
        kiln.compile(b"", threads=-2)
    with pytest.raises(kiln.KilnUserError, match="expected a path"):
        kiln.compile(3.5)
    with pytest.raises(kiln.KilnUserError, match="cannot open|no such|cannot load"):
        kiln.load(os.path.join(scratch, "missing.so"))
    not_a_library = os.path.join(scratch, "not_a_library.so")
    with open(not_a_library, "w") as f:
        f.write("text")
    with pytest.raises(kiln.KilnUserError, match="not a model library"):
        kiln.load(not_a_library)


def test_cuda_is_not_available_yet():
    with pytest.raises(kiln.KilnError, match="no CUDA backend") as info:
        kiln.compile(b"", device="cuda")
    assert not isinstance(info.value, ValueError)
    with pytest.raises(kiln.KilnUserError, match="unknown device"):
        kiln.compile(b"", device="tpu")


def progress_during(call):
    """Runs `call` (one call into Kiln's C++) in another thread while this one wakes every
    millisecond, and returns how often this thread ran in the middle half of the call. Holding
    the GIL, the call would let it run at most at its edges (a switch just before it enters C++
    or after it returns), never in the middle."""
    window, errors, stamps = [], [], []

    def target():
        try:
            window.append(time.perf_counter())
            call()
            window.append(time.perf_counter())
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    thread = threading.Thread(target=target)
    thread.start()
    while thread.is_alive():
        stamps.append(time.perf_counter())
        time.sleep(0.001)
    thread.join()
    assert not errors, errors
    start, end = window
    quarter = (end - start) / 4
    return sum(start + quarter < t < end - quarter for t in stamps)


def test_gil_is_released_while_compiling_and_running(model_dir, scratch):
    # A compile and a run, each a single call into C++ long enough (a cold compile, which runs
    # the C++ compiler; a 2048^3 matrix product on one thread) for the scheduler to wake this
    # thread within its middle half.
    path = models.make_matmul(model_dir)
    cache = os.path.join(scratch, f"cold-cache-{os.getpid()}")
    compiled = []
    try:
        assert progress_during(
            lambda: compiled.append(_kiln.compile_path(path, "default", 1, cache, {}))) > 5
        matmul = kiln.Model(compiled[0])
        rng = np.random.default_rng(10)
        a, b = (rng.standard_normal((2048, 2048)).astype(np.float32) for _ in range(2))
        result = []
        assert progress_during(lambda: result.extend(matmul._native.run([a, b]))) > 5
        np.testing.assert_allclose(result[0][:64, :64], a[:64] @ b[:, :64], rtol=1e-3, atol=1e-3)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
