#!/usr/bin/python3
"""Diffs the sources Kiln generates between a given commit and the working tree ("process
replay"): a refactor of the back end must leave every generated file byte-identical, or explain
each difference.

Usage (from the repository root):

  scripts/codegen_diff.py BASE_COMMIT [--base-kiln PATH] [--head-kiln PATH] [--jobs N]
                          [--cases N] [--keep DIR]

BASE_COMMIT is built in a temporary git worktree (cmake + ninja, ccache when present) unless
--base-kiln names a kiln binary built from it; the working tree's kiln is build/bin/kiln unless
--head-kiln says otherwise. Every model of the ONNX 1.12 backend suite
(/usr/share/libonnx-testdata/data, with its first test data set as the inputs, so that shape
inputs are specialized as the suite runner does) and every model of
tests/golden/make_golden_models.py is compiled with `kiln run --dump` by both binaries; the C++
compiler is replaced by /bin/false, so only the generated sources are written (no kernel is
built or run). The summary says how many models were compared and, for every generated file that
differs or exists on one side only, which; the exit status is 0 when everything is identical,
1 otherwise. --cases N takes the first N suite cases only (a quick check). With --keep DIR the
dumps stay in DIR, and a later run with --keep DIR --reuse-base takes the base side of every
model dumped completely there instead of running the base kiln again (which it still needs,
--base-kiln or the build, for the others).
"""
import argparse
import concurrent.futures
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUITE = Path("/usr/share/libonnx-testdata/data")
GOLDEN_SCRIPT = ROOT / "tests" / "golden" / "make_golden_models.py"
PYTHON = "/usr/bin/python3"  # Debian's, which has onnx and numpy
# The generated sources: the wrapper, the kernel units, template units (gemm0.cpp, conv0.cpp).
SOURCE_PREFIX = "5_"
DONE = ".done"  # marks a model's dump as complete (--reuse-base)


def build_base(commit, work):
    """Builds kiln at `commit` in a temporary worktree under `work`; returns the binary."""
    tree = work / "base-tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), commit],
                   check=True, stdout=subprocess.DEVNULL)
    configure = ["cmake", "-S", str(tree), "-B", str(tree / "build"), "-G", "Ninja",
                 "-DCMAKE_BUILD_TYPE=Release"]
    if shutil.which("ccache"):
        configure.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    jobs = os.environ.get("JOBS", "2")
    subprocess.run(["nice", "cmake", "--build", str(tree / "build"), "-j", jobs, "--target",
                    "kiln"], check=True, stdout=subprocess.DEVNULL)
    return tree / "build" / "bin" / "kiln"


def suite_cases(limit):
    cases = []
    for suite in ("node", "pytorch-converted", "pytorch-operator", "simple"):
        folder = SUITE / suite
        if not folder.is_dir():
            continue
        for case in sorted(folder.iterdir()):
            if (case / "model.onnx").exists():
                cases.append(case)
    return cases[:limit] if limit else cases


def input_arguments(case):
    """--input NAME=FILE for every input of the case's first data set."""
    import onnx  # Debian's python3-onnx
    model = onnx.load(str(case / "model.onnx"), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    sets = sorted(p for p in case.iterdir() if p.name.startswith("test_data_set_"))
    args = []
    if not sets:
        return args
    for k, name in enumerate(names):
        path = sets[0] / f"input_{k}.pb"
        if path.exists():
            args += ["--input", f"{name}={path}"]
    return args


def golden_models(work):
    """Writes every golden model into `work`; returns their paths."""
    sys.path.insert(0, str(GOLDEN_SCRIPT.parent))
    import make_golden_models  # noqa: E402 (the golden tests' own generator)
    paths = []
    folder = work / "golden-models"
    folder.mkdir(parents=True, exist_ok=True)
    for name in sorted(make_golden_models.MODELS):
        path = folder / f"{name}.onnx"
        subprocess.run([PYTHON, str(GOLDEN_SCRIPT), name, str(path)], check=True)
        paths.append(path)
    return paths


def dump(kiln, model, args, out, scratch):
    """`kiln run --dump` with a failing C++ compiler: the sources are written, nothing built."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CXX="/bin/false", KILN_CACHE_DIR=str(scratch / "cache"),
               KILN_AUTOTUNE_CACHE=str(scratch / "autotune"), KILN_AUTOTUNE="default")
    env.pop("KILN_LOG", None)
    subprocess.run([str(kiln), "run", str(model), "--dump", str(out), "--output-dir",
                    str(scratch / "outputs")] + args, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=600)


def sources(folder):
    if not folder.is_dir():
        return {}
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith(SOURCE_PREFIX)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base")
    parser.add_argument("--base-kiln")
    parser.add_argument("--head-kiln", default=str(ROOT / "build" / "bin" / "kiln"))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cases", type=int, default=0)
    parser.add_argument("--keep", help="keep the dumps in this folder")
    parser.add_argument("--reuse-base", action="store_true",
                        help="take the base dumps already in --keep's folder")
    parser.add_argument("--diff-lines", type=int, default=40,
                        help="lines of unified diff shown per changed file")
    options = parser.parse_args()

    work = Path(options.keep) if options.keep else Path(tempfile.mkdtemp(prefix="codegen-diff-"))
    work.mkdir(parents=True, exist_ok=True)
    base_tree = None
    try:
        if options.reuse_base and not options.keep:
            parser.error("--reuse-base needs --keep")
        if options.base_kiln:
            base_kiln = Path(options.base_kiln).resolve()
        else:
            base_kiln = build_base(options.base, work)
            base_tree = work / "base-tree"
        head_kiln = Path(options.head_kiln).resolve()
        models = [(f"suite/{c.parent.name}/{c.name}", c / "model.onnx", input_arguments(c))
                  for c in suite_cases(options.cases)]
        models += [(f"golden/{p.stem}", p, []) for p in golden_models(work)]

        def run(entry):
            name, model, args = entry
            result = {}
            for side, kiln in (("base", base_kiln), ("head", head_kiln)):
                folder = work / side / name
                scratch = work / "scratch" / side / name
                if side == "base" and options.reuse_base and (folder / DONE).exists():
                    result[side] = sources(folder)
                    continue
                shutil.rmtree(folder, ignore_errors=True)
                try:
                    dump(kiln, model, args, folder, scratch)
                except subprocess.TimeoutExpired:
                    pass
                (folder / DONE).touch()
                shutil.rmtree(scratch, ignore_errors=True)
                result[side] = sources(folder)
            return name, result

        with concurrent.futures.ThreadPoolExecutor(options.jobs) as pool:
            results = sorted(pool.map(run, models))

        identical, changed, empty = 0, [], 0
        for name, r in results:
            base, head = r["base"], r["head"]
            if not base and not head:
                empty += 1  # lowering refused the model at both commits
                continue
            diffs = []
            for f in sorted(set(base) | set(head)):
                if f not in base:
                    diffs.append((f, "only in the working tree", None))
                elif f not in head:
                    diffs.append((f, "only in the base", None))
                elif base[f] != head[f]:
                    lines = list(difflib.unified_diff(
                        base[f].decode(errors="replace").splitlines(),
                        head[f].decode(errors="replace").splitlines(), "base/" + f, "head/" + f,
                        lineterm="", n=1))
                    diffs.append((f, "differs", lines))
            if diffs:
                changed.append((name, diffs))
            else:
                identical += 1
        print(f"codegen diff {options.base} -> working tree: {len(results)} models "
              f"({len(results) - empty} generating code, {empty} refused at both)")
        print(f"  byte-identical: {identical}")
        print(f"  with changed files: {len(changed)}")
        for name, diffs in changed:
            for f, what, lines in diffs:
                print(f"  {name}: {f} {what}")
                for line in (lines or [])[:options.diff_lines]:
                    print("      " + line)
        return 0 if not changed else 1
    finally:
        if base_tree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(base_tree)], stdout=subprocess.DEVNULL)
        if not options.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
