"""kiln.InferenceSession as onnxruntime's: a script written for onnxruntime runs unchanged but
for its import line (onnxruntime_script.py), its outputs compared with numpy's and, when
onnxruntime-node is installed (make bench-ort installs it under BUILD_DIR/bench-ort; or
KILN_ORT_NODE_MODULES), with ONNX Runtime's on the same inputs; and each call of the session."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kiln
import models

HERE = os.path.dirname(os.path.abspath(__file__))
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def script_outputs(classifier_path, scratch):
    """Runs onnxruntime_script.py through kiln: its one import line changed, nothing else."""
    with open(os.path.join(HERE, "onnxruntime_script.py")) as f:
        text = f.read()
    assert text.count("import onnxruntime as ort\n") == 1
    script = os.path.join(scratch, "onnxruntime_script_kiln.py")
    with open(script, "w") as f:
        f.write(text.replace("import onnxruntime as ort\n", "import kiln as ort\n"))
    out = os.path.join(scratch, "onnxruntime_script_kiln.npz")
    run = subprocess.run([sys.executable, script, classifier_path, out], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "input: x ['batch', 16] tensor(float)" in run.stdout
    assert "output: label ['batch'] tensor(int64)" in run.stdout
    assert "model: classifier by kiln-python-tests, version 3, domain org.kiln.tests, metadata " \
        "[('author', 'kiln'), ('purpose', 'tests')]" in run.stdout
    assert "providers: ['CPUExecutionProvider']" in run.stdout
    with np.load(out) as saved:
        return dict(saved)


def test_onnxruntime_script_matches_numpy(script_outputs):
    x = script_outputs["in_x"]
    assert x.shape == (3, 16)
    expected = models.reference_classifier(x)
    np.testing.assert_allclose(script_outputs["out_logits"], expected["logits"], RTOL, ATOL)
    np.testing.assert_allclose(script_outputs["out_probs"], expected["probs"], RTOL, ATOL)
    np.testing.assert_array_equal(script_outputs["out_label"], expected["label"])


def ort_node_modules():
    candidates = [os.environ.get("KILN_ORT_NODE_MODULES", "")]
    if os.environ.get("KILN_BUILD_DIR"):
        candidates.append(os.path.join(os.environ["KILN_BUILD_DIR"], "bench-ort",
                                       "onnxruntime-node", "node_modules"))
    for path in candidates:
        if path and os.path.isdir(os.path.join(path, "onnxruntime-node")):
            return path
    return None


def test_onnxruntime_script_matches_onnxruntime_node(script_outputs, classifier_path, scratch):
    modules = ort_node_modules()
    if modules is None or shutil.which("node") is None:
        pytest.skip("onnxruntime-node is not installed (make bench-ort installs it); compared "
                    "with numpy only")
    inputs = os.path.join(scratch, "ort_inputs.json")
    outputs = os.path.join(scratch, "ort_outputs.json")
    x = script_outputs["in_x"]
    with open(inputs, "w") as f:
        json.dump({"x": {"dims": list(x.shape), "data": x.ravel().tolist()}}, f)
    env = dict(os.environ, NODE_PATH=modules)
    run = subprocess.run(["node", os.path.join(HERE, "ort_node_run.js"), classifier_path, inputs,
                          outputs], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    with open(outputs) as f:
        ort_outputs = json.load(f)
    assert set(ort_outputs) == {"logits", "probs", "label"}
    for name, t in ort_outputs.items():
        expected = np.array(t["data"]).reshape(t["dims"])
        actual = script_outputs[f"out_{name}"]
        assert actual.shape == expected.shape, name
        if name == "label":
            np.testing.assert_array_equal(actual, expected)
        else:
            np.testing.assert_allclose(actual, expected, RTOL, ATOL, err_msg=name)


def test_onnxruntime_script_unchanged_with_onnxruntime(script_outputs, classifier_path, scratch):
    """Where the Python onnxruntime is installed, the script itself, unchanged, agrees."""
    pytest.importorskip("onnxruntime")
    out = os.path.join(scratch, "onnxruntime_script_ort.npz")
    subprocess.run([sys.executable, os.path.join(HERE, "onnxruntime_script.py"), classifier_path,
                    out], check=True, timeout=120)
    with np.load(out) as saved:
        for name, value in saved.items():
            np.testing.assert_allclose(script_outputs[name], value, RTOL, ATOL, err_msg=name)


@pytest.fixture(scope="module")
def session(classifier_path):
    return kiln.InferenceSession(classifier_path)


def test_session_describes_inputs_outputs_and_model(session):
    (x,) = session.get_inputs()
    assert (x.name, x.shape, x.type) == ("x", ["batch", 16], "tensor(float)")
    assert [(o.name, o.shape, o.type) for o in session.get_outputs()] == [
        ("logits", ["batch", 5], "tensor(float)"), ("probs", ["batch", 5], "tensor(float)"),
        ("label", ["batch"], "tensor(int64)")]
    meta = session.get_modelmeta()
    assert (meta.producer_name, meta.graph_name, meta.domain, meta.version) == (
        "kiln-python-tests", "classifier", "org.kiln.tests", 3)
    assert meta.description == "the classifier of tests/python"
    assert meta.graph_description == "a two-layer classifier"
    assert meta.custom_metadata_map == {"author": "kiln", "purpose": "tests"}
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert kiln.get_available_providers() == ["CPUExecutionProvider"]


def test_session_run_selects_outputs(session):
    x = np.random.default_rng(9).standard_normal((2, 16)).astype(np.float32)
    expected = models.reference_classifier(x)
    logits, probs, label = session.run(None, {"x": x})
    np.testing.assert_allclose(probs, expected["probs"], RTOL, ATOL)
    (only,) = session.run(["label"], {"x": x})
    np.testing.assert_array_equal(only, expected["label"])
    assert len(session.run([], {"x": x})) == 3
    with pytest.raises(kiln.KilnUserError, match="no output 'nope'"):
        session.run(["nope"], {"x": x})
    with pytest.raises(kiln.KilnUserError, match="input 'x' is missing"):
        session.run(None, {})


def test_session_options_and_providers(classifier_path):
    options = kiln.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = kiln.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = kiln.InferenceSession(classifier_path, options, ["CPUExecutionProvider"])
    assert session.get_session_options().intra_op_num_threads == 1
    assert len(session.run(None, {"x": np.zeros((1, 16), np.float32)})) == 3
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"):
        kiln.InferenceSession(classifier_path,
                              providers=[("CUDAExecutionProvider", {}), "CPUExecutionProvider"])
    with pytest.raises(kiln.KilnError, match="CPUExecutionProvider only"):
        kiln.InferenceSession(classifier_path, providers=["CUDAExecutionProvider"])
    with pytest.raises(kiln.KilnUserError, match="intra_op_num_threads"):
        options.intra_op_num_threads = -1


def test_unsupported_parts_of_onnxruntime_are_named(session, classifier_path):
    options = kiln.SessionOptions()
    with pytest.raises(kiln.KilnError, match="SessionOptions.enable_profiling is not supported"):
        options.enable_profiling = True
    with pytest.raises(kiln.KilnError, match="SessionOptions.execution_mode is not supported"):
        options.execution_mode
    with pytest.raises(kiln.KilnError, match="InferenceSession.run_with_iobinding is not supp"):
        session.run_with_iobinding
    assert not hasattr(session, "io_binding")
    with pytest.raises(kiln.KilnError, match="kiln.OrtValue is not supported"):
        kiln.OrtValue
    with pytest.raises(kiln.KilnError, match="run_options"):
        session.run(None, {"x": np.zeros((1, 16), np.float32)}, run_options=object())
    with pytest.raises(kiln.KilnError, match="'disabled_optimizers' is not supported"):
        kiln.InferenceSession(classifier_path, disabled_optimizers=["x"])
    with pytest.raises(kiln.KilnUserError, match="expected a model path"):
        kiln.InferenceSession(42)
