#!/usr/bin/python3
"""Names as exporters write them (tests/names/make_names_model.py builds the model): the model
compiles and runs under `kiln run` for both values of its If's condition (outputs against numpy,
written to files named by the documented escaping, none outside the output directory), `kiln info`
and `kiln bench --shape/--input` take and show the original names, `kiln compile` builds a library
whose C API finds every input and output by its original name (tests/names/names_capi.cpp), and
two compiles give byte-identical sources.

Usage: test_names.py KILN NAMES_CAPI SCRATCH
"""
import filecmp
import json
import os
import shutil
import subprocess
import sys

import numpy as np

KILN, CAPI, SCRATCH = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
RTOL = ATOL = 1e-5  # float32 elementwise ops and one short sum


def fail(why):
    print("FAIL:", why, file=sys.stderr)
    sys.exit(1)


def run(args, **kw):
    print("$", " ".join(repr(a) for a in args), flush=True)
    p = subprocess.run(args, capture_output=True, text=True, errors="replace", **kw)
    print(p.stdout + p.stderr, end="")
    if p.returncode != 0:
        fail(f"{args[:2]} exited with {p.returncode}")
    return p.stdout


def escaped_file_name(name):
    """The escaping README documents for output files (support/identifier.h file_name)."""
    out = ""
    for k, byte in enumerate(name.encode("utf-8")):
        c = chr(byte)
        keep = (c.isascii() and c.isalnum()) or c in "_-[]" or (c == "." and k > 0)
        out += c if keep else "%%%02X" % byte
    return out or "%"


def main():
    shutil.rmtree(SCRATCH, ignore_errors=True)
    model_dir = os.path.join(SCRATCH, "model")
    os.makedirs(model_dir)
    subprocess.run(["/usr/bin/python3", os.path.join(HERE, "make_names_model.py"), model_dir],
                   check=True)
    with open(os.path.join(model_dir, "names.json"), encoding="utf-8") as f:
        names = json.load(f)
    model = os.path.join(model_dir, "model.onnx")
    cache = os.path.join(SCRATCH, "cache")
    x_name, y_name, c_name, z_name = names["inputs"]
    dim = names["dims"][0]

    info = run([KILN, "info", model])
    for shown in [x_name, y_name, dim]:
        if shown not in info:
            fail(f"kiln info does not show the original name {shown!r}")
    # Control characters never reach the terminal raw: z's name ends in \x01.
    if "\x01" in info or "z\\x01" not in info:
        fail(f"kiln info does not escape the control character of {z_name!r}:\n{info}")

    for cond in ("true", "false"):
        out_dir = os.path.join(SCRATCH, "out", cond, "inner")
        os.makedirs(out_dir)
        given = [f"{x_name}={model_dir}/inputs/0.npy", f"{y_name}={model_dir}/inputs/1.npy",
                 f"{c_name}={model_dir}/inputs/c_{cond}.npy", f"{z_name}={model_dir}/inputs/3.npy"]
        args = [KILN, "run", model, "--cache-dir", cache, "--output-dir", out_dir,
                "--dump", os.path.join(SCRATCH, "dump", cond)]
        for g in given:
            args += ["--input", g]
        run(args)
        for k, name in enumerate(names["outputs"]):
            path = os.path.join(out_dir, escaped_file_name(name) + ".npy")
            if not os.path.isfile(path):
                fail(f"output {name!r}: no file {path}")
            got = np.load(path)
            want = np.load(os.path.join(model_dir, "expected", cond, f"{k}.npy"))
            if got.shape != want.shape or not np.allclose(got, want, rtol=RTOL, atol=ATOL):
                fail(f"output {name!r} ({cond}) differs from numpy: {got} vs {want}")
        written = sorted(os.listdir(os.path.join(SCRATCH, "out", cond)))
        if written != ["inner"]:
            fail(f"kiln run wrote outside its output directory: {written}")

    # Two compiles of the same model give the same sources.
    for f in sorted(os.listdir(os.path.join(SCRATCH, "dump", "true"))):
        if f.startswith("5_") and not filecmp.cmp(os.path.join(SCRATCH, "dump", "true", f),
                                                   os.path.join(SCRATCH, "dump", "false", f),
                                                   shallow=False):
            fail(f"two compiles of one model gave different {f}")

    # kiln bench binds the input with '=' and ':' in its name by its original name.
    run([KILN, "bench", model, "--cache-dir", cache, "--iters", "2", "--warmup", "1",
         "--shape", f"{x_name}={names['batch']}x5", "--shape", f"{y_name}={names['batch']}x5",
         "--input", f"{c_name}={model_dir}/inputs/c_true.npy", "--shape", f"{z_name}=2x7"])

    library = os.path.join(SCRATCH, "names.so")
    run([KILN, "compile", model, "-o", library, "--cache-dir", cache])
    for cond in ("true", "false"):
        run([CAPI, library, model_dir, cond])
    print("names: ok")


if __name__ == "__main__":
    main()
