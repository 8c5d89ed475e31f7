"""A script written for onnxruntime, with the calls such scripts use most: the tests run it
through kiln with its import line changed to `import kiln as ort` and nothing else.

Usage: python3 onnxruntime_script.py MODEL.onnx OUT.npz
Runs the model (float32 inputs; symbolic dims 3) on seeded random inputs and saves the inputs
(as in_<name>) and outputs (out_<name>) to OUT.npz; prints what the session describes."""
import sys

import numpy as np
import onnxruntime as ort


def main():
    model_path, out_path = sys.argv[1], sys.argv[2]
    print("available providers:", ort.get_available_providers())

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model_path, sess_options=options,
                                   providers=["CPUExecutionProvider"])
    print("providers:", session.get_providers())

    meta = session.get_modelmeta()
    print(f"model: {meta.graph_name} by {meta.producer_name}, version {meta.version}, "
          f"domain {meta.domain}, metadata {sorted(meta.custom_metadata_map.items())}")

    rng = np.random.default_rng(0)
    feed = {}
    for node in session.get_inputs():
        print("input:", node.name, node.shape, node.type)
        assert node.type == "tensor(float)", node.type
        shape = [d if isinstance(d, int) else 3 for d in node.shape]
        feed[node.name] = rng.standard_normal(shape).astype(np.float32)
    output_names = [node.name for node in session.get_outputs()]
    for node in session.get_outputs():
        print("output:", node.name, node.shape, node.type)

    outputs = session.run(None, feed)
    assert len(outputs) == len(output_names)
    # One output by name, and the outputs in another order.
    (last,) = session.run([output_names[-1]], feed)
    assert np.array_equal(last, outputs[-1])
    reordered = session.run(output_names[::-1], feed)
    assert all(np.array_equal(a, b) for a, b in zip(reordered, outputs[::-1]))

    # A session from the model's bytes, with default options.
    with open(model_path, "rb") as f:
        from_bytes = ort.InferenceSession(f.read(), providers=["CPUExecutionProvider"])
    again = from_bytes.run(None, feed)
    assert all(np.array_equal(a, b) for a, b in zip(again, outputs))

    saved = {f"in_{k}": v for k, v in feed.items()}
    saved.update({f"out_{k}": v for k, v in zip(output_names, outputs)})
    np.savez(out_path, **saved)
    print("ok")


if __name__ == "__main__":
    main()
