#!/usr/bin/env bash
# Issue 14: latency under load. Kiln and ONNX Runtime 1.30 on a tiny MLP and a ResNet-18-shaped
# CNN (make_models.py), each idle, with one busy process per core ("busy") and with one and a
# half busy processes per core ("over"; busy processes are `while :; do :; done` shells),
# alternating engine by engine within each round. Each engine is timed in two modes:
#   tight  runs back to back (a batch job, or a server that always has a request waiting);
#   paced  a fixed untimed sleep before each run (kiln bench / ort_bench --wait-ms), as a server
#          between requests: the same wait for both engines, the larger of their idle p50s
#          measured first, so each engine is busy about half the time or less.
# Beside them, the "floor" engine (floor.cpp): one thread's arithmetic loop as long as Kiln's idle
# p50 of the model, timed the same way. It touches no memory and starts no threads, so its p99/p50
# is the machine's own spread at that length (preemption, interrupts, the hypervisor): on a VM a
# 0.03 ms loop's idle p99 can be twice its p50 or more, whatever runs in it. With 2 or more
# threads, "floor-par" runs the same loop on every thread at once, in chunks the threads take as
# Kiln's pool shares a loop, each thread pinned to its own CPU: the spread of a run that needs all
# its threads, where a thread off its CPU leaves the others its chunks. And before any load,
# wake.cpp times waking a sleeping thread on another CPU (printed with the summary).
# Prints per model, mode, engine and load the p50 and p99 (medians over the rounds) and the
# loaded/idle p50 ratio, then issue 14's checks read off those medians (yes/no per model, mode
# and load). It prints; it asserts nothing.
#
# Usage: bench/load/run.sh [BUILD_DIR]   (`make bench-load` builds kiln and runs it)
# Environment:
#   CPUS                 CPU list everything is pinned to (taskset -c), e.g. CPUS=2,3 reads a
#                        bigger host as a 2-core machine; default: every CPU of this process
#   BENCH_LOAD_THREADS   threads per engine (default: the number of CPUs in CPUS)
#   BENCH_LOAD_ROUNDS    rounds per load (3); BENCH_LOAD_ITERS_MLP (400), BENCH_LOAD_ITERS_CNN (15)
#   BENCH_LOAD_MODELS    ("mlp resnet18"); BENCH_LOAD_LOADS ("idle busy over")
#   BENCH_LOAD_MODES     ("tight paced"); BENCH_LOAD_WAIT_MS: the paced wait for every model
#                        (default: per model, the larger idle p50 of the engines, measured first)
#   BENCH_LOAD_ORT       node (onnxruntime-node from npm, as bench/ort), python (onnxruntime's
#                        Python API, for hosts without Node.js) or auto (node when node and npm are
#                        on PATH, else python)
#   KILN                 the kiln to time (default BUILD_DIR/bin/kiln)
#   KILN_BASE            another kiln timed beside it as "kiln-base" (e.g. a build before a change)
#   PYTHON               a python3 with onnx and numpy (default /usr/bin/python3)
#   BENCH_LOAD_FLOOR     0 leaves the floor engines out (default 1); CXX builds them (default g++)
# Everything it writes is under BUILD_DIR/bench-load/ (models, code caches, model libraries,
# results.jsonl).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR="$(realpath "${1:-build}")"
HERE=bench/load
KILN="${KILN:-$BUILD_DIR/bin/kiln}"
KILN_BASE="${KILN_BASE:-}"
WORK="$BUILD_DIR/bench-load"
PYTHON="${PYTHON:-/usr/bin/python3}"
CPUS="${CPUS:-$(taskset -pc $$ | sed 's/.*: //')}"
# The number of CPUs in the list (ranges such as 0-3 included).
NCPU=$(taskset -c "$CPUS" nproc)
THREADS="${BENCH_LOAD_THREADS:-$NCPU}"
ROUNDS="${BENCH_LOAD_ROUNDS:-3}"
ITERS_MLP="${BENCH_LOAD_ITERS_MLP:-400}"
ITERS_CNN="${BENCH_LOAD_ITERS_CNN:-15}"
MODELS="${BENCH_LOAD_MODELS:-mlp resnet18}"
LOADS="${BENCH_LOAD_LOADS:-idle busy over}"
MODES="${BENCH_LOAD_MODES:-tight paced}"
ORT="${BENCH_LOAD_ORT:-auto}"
ORT_VERSION=1.30.0
FLOOR="${BENCH_LOAD_FLOOR:-1}"
mkdir -p "$WORK"
[ -x "$KILN" ] || { echo "bench-load: no $KILN; build it first (make build)" >&2; exit 1; }
pin() { taskset -c "$CPUS" "$@"; }

# --- ONNX Runtime ------------------------------------------------------------------------------
if [ "$ORT" = auto ]; then
  if command -v node >/dev/null && command -v npm >/dev/null; then ORT=node; else ORT=python; fi
fi
if [ "$ORT" = node ]; then
  ORT_DIR="$BUILD_DIR/bench-ort/onnxruntime-node"  # shared with bench/ort/run.sh
  installed="$(cat "$ORT_DIR/node_modules/onnxruntime-node/package.json" 2>/dev/null |
    "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["version"])' 2>/dev/null || true)"
  if [ "$installed" != "$ORT_VERSION" ]; then
    echo "bench-load: installing onnxruntime-node@$ORT_VERSION into $ORT_DIR"
    mkdir -p "$ORT_DIR"
    echo '{"name": "kiln-bench-ort", "private": true}' >"$ORT_DIR/package.json"
    ONNXRUNTIME_NODE_INSTALL=skip npm install --prefix "$ORT_DIR" --no-audit --no-fund \
      --loglevel=error "onnxruntime-node@$ORT_VERSION"
  fi
  export NODE_PATH="$ORT_DIR/node_modules"
  ort_version="$ORT_VERSION (onnxruntime-node)"
else
  ort_version="$("$PYTHON" -c 'import onnxruntime; print(onnxruntime.__version__)') (Python API)"
fi

# --- models ------------------------------------------------------------------------------------
MODEL_DIR="$WORK/models"
stamp="$(sha256sum "$HERE/make_models.py" bench/ort/make_models.py | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$MODEL_DIR/stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "bench-load: building the models into $MODEL_DIR"
  rm -rf "$MODEL_DIR"
  "$PYTHON" "$HERE/make_models.py" "$MODEL_DIR"
  echo "$stamp" >"$MODEL_DIR/stamp"
fi
iters() { case "$1" in mlp) echo "$ITERS_MLP" ;; *) echo "$ITERS_CNN" ;; esac; }
warmup() { echo $(($(iters "$1") / 5 + 2)); }
input_arg() { echo "input=$MODEL_DIR/$1.input.npy"; }

ENGINES="kiln ort"
FLOOR_BIN="$WORK/floor"
if [ "$FLOOR" != 0 ]; then
  "${CXX:-g++}" -O2 -std=c++17 -pthread -Iinclude "$HERE/floor.cpp" -o "$FLOOR_BIN.tmp"
  mv "$FLOOR_BIN.tmp" "$FLOOR_BIN"
fi
# What waking a sleeping thread on another CPU costs here (wake.cpp), measured before any load
# starts: where it is tens of microseconds (some VMs), a pool worker that sleeps between requests
# costs a small model's run more than it saves, so Kiln's workers poll and under load get their
# fair share of the cores. Printed with the summary.
WAKE_JSON=""
if [ "$NCPU" -ge 2 ]; then
  "${CXX:-g++}" -O2 -std=c++17 -pthread -Iinclude "$HERE/wake.cpp" -o "$WORK/wake.tmp"
  mv "$WORK/wake.tmp" "$WORK/wake"
  read -r WAKE_A WAKE_B < <(pin "$PYTHON" -c 'import os; print(*sorted(os.sched_getaffinity(0))[:2])')
  WAKE_JSON="$("$WORK/wake" "$WAKE_A" "$WAKE_B")" || WAKE_JSON=""  # informational only
fi
library() { echo "$WORK/lib/$1-$2.so"; }  # library ENGINE MODEL
mkdir -p "$WORK/lib"
[ -n "$KILN_BASE" ] && ENGINES="kiln kiln-base ort"
BASE_PACES=0
[ -n "$KILN_BASE" ] && "$KILN_BASE" bench --help 2>&1 | grep -q -- --wait-ms && BASE_PACES=1
run_engine() {  # run_engine ENGINE MODEL ITERS WARMUP [WAIT_MS]: one JSON line
  local engine="$1" model="$2" wait="${5:-0}"
  # --wait-ms only for paced runs, so a KILN_BASE from before the option still times tight runs.
  local pace=()
  [ "$wait" != 0 ] && pace=(--wait-ms "$wait")
  case "$engine" in
    kiln | kiln-base)
      local kiln="$KILN"
      [ "$engine" = kiln-base ] && kiln="$KILN_BASE"
      pin "$kiln" bench "$(library "$engine" "$model")" --json --threads "$THREADS" --iters "$3" \
        --warmup "$4" "${pace[@]}" --input "$(input_arg "$model")"
      ;;
    floor | floor-par)
      eval "local steps=\$STEPS_$model"
      local floor_threads=1
      [ "$engine" = floor-par ] && floor_threads="$THREADS"
      pin "$FLOOR_BIN" --steps "$steps" --threads "$floor_threads" --iters "$3" --warmup "$4" \
        "${pace[@]}"
      ;;
    ort)
      if [ "$ORT" = node ]; then
        pin node bench/ort/ort_bench.js "$MODEL_DIR/$model.onnx" --threads "$THREADS" \
          --iters "$3" --warmup "$4" "${pace[@]}" --input "$(input_arg "$model")"
      else
        pin "$PYTHON" "$HERE/ort_bench.py" "$MODEL_DIR/$model.onnx" --threads "$THREADS" \
          --iters "$3" --warmup "$4" "${pace[@]}" --input "$(input_arg "$model")"
      fi
      ;;
  esac
}

# --- busy processes ----------------------------------------------------------------------------
BUSY_PIDS=()
start_busy() {  # start_busy COUNT
  for _ in $(seq 1 "$1"); do
    # taskset itself (not a shell function, whose subshell would outlive a kill) execs the shell.
    taskset -c "$CPUS" sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &
    BUSY_PIDS+=($!)
  done
}
stop_busy() {
  for pid in "${BUSY_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${BUSY_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  BUSY_PIDS=()
}
trap stop_busy EXIT
busy_count() {
  case "$1" in idle) echo 0 ;; busy) echo "$NCPU" ;; over) echo $(((3 * NCPU + 1) / 2)) ;; esac
}

RESULTS="$WORK/results.jsonl"
: >"$RESULTS"
echo "== bench-load: engines $ENGINES; ONNX Runtime $ort_version; CPUs $CPUS ($NCPU)," \
  "$THREADS threads each; $ROUNDS rounds; CPU: $(lscpu | sed -n 's/^Model name: *//p')"
# Compiled once, idle, before anything is timed, into model libraries (kiln compile, for this
# CPU, with the thread count the runs ask for), so a timed run only loads its library.
for engine in $ENGINES; do
  [ "$engine" = ort ] && continue
  kiln="$KILN"
  [ "$engine" = kiln-base ] && kiln="$KILN_BASE"
  for m in $MODELS; do
    OMP_NUM_THREADS="$THREADS" "$kiln" compile "$MODEL_DIR/$m.onnx" --target native \
      --cache-dir "$WORK/cache-$engine" -o "$(library "$engine" "$m")" >/dev/null
  done
done
# The paced wait of each model, the same for every engine: the larger of the engines' idle p50s
# (short tight runs, untimed by the summary), so no engine is busy more than about half the time.
# Kept in WAIT_<model>. The floor's loop length, as long as Kiln's idle p50, in STEPS_<model>.
# Each engine's p50 is the lower of two such runs: the first run on a fresh machine can be
# several times slower (an Intel Xeon KVM host: Kiln's MLP about 0.19 ms, then 0.024).
p50_of() { "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["p50_ms"])'; }
idle_p50() {  # idle_p50 ENGINE MODEL: the lower p50 of two short tight runs
  local first second
  first="$(run_engine "$1" "$2" $(($(iters "$2") / 2 + 1)) "$(warmup "$2")" | p50_of)"
  second="$(run_engine "$1" "$2" $(($(iters "$2") / 2 + 1)) "$(warmup "$2")" | p50_of)"
  "$PYTHON" -c 'import sys; print("%.4f" % min(map(float, sys.argv[1:])))' "$first" "$second"
}
for m in $MODELS; do
  wait_ms=0
  p50s=""
  for engine in $ENGINES; do
    [ -n "${BENCH_LOAD_WAIT_MS:-}" ] && [ "$engine" != kiln ] && continue
    p50="$(idle_p50 "$engine" "$m")"
    p50s="$p50s${p50s:+, }$engine $p50"
    if [ "$engine" = kiln ] && [ "$FLOOR" != 0 ]; then
      eval "STEPS_$m=$(pin "$FLOOR_BIN" --calibrate "$p50")"
    fi
    wait_ms="$("$PYTHON" -c 'import sys; print("%.4f" % max(map(float, sys.argv[1:])))' \
      "$wait_ms" "$p50")"
  done
  wait_ms="${BENCH_LOAD_WAIT_MS:-$wait_ms}"
  eval "WAIT_$m=$wait_ms"
  echo "== paced wait for $m: $wait_ms ms before each run (idle p50s: $p50s ms)"
done
[ "$FLOOR" != 0 ] && ENGINES="$ENGINES floor"
if [ "$FLOOR" != 0 ] && [ "$THREADS" -gt 1 ] && [ "$THREADS" -le "$NCPU" ]; then
  ENGINES="$ENGINES floor-par"
fi
for load in $LOADS; do
  count=$(busy_count "$load")
  start_busy "$count"
  sleep 1
  echo "== load $load: $count busy processes on CPUs $CPUS"
  for r in $(seq 1 "$ROUNDS"); do
    for m in $MODELS; do
      order="$ENGINES"
      [ $((r % 2)) -eq 0 ] && order="$(echo "$ENGINES" | tr ' ' '\n' | tac | tr '\n' ' ')"
      for mode in $MODES; do
        wait_ms=0
        [ "$mode" = paced ] && eval "wait_ms=\$WAIT_$m"
        for engine in $order; do
          # A KILN_BASE built before `kiln bench --wait-ms` times the tight loop only.
          [ "$mode" = paced ] && [ "$engine" = kiln-base ] && [ "$BASE_PACES" = 0 ] && continue
          line="$(run_engine "$engine" "$m" "$(iters "$m")" "$(warmup "$m")" "$wait_ms")"
          echo "$line" | "$PYTHON" -c 'import json, sys
j = json.load(sys.stdin)
j.update(engine=sys.argv[1], name=sys.argv[2], load=sys.argv[3], round=int(sys.argv[4]),
         mode=sys.argv[5])
print(json.dumps(j))
print("   %-9s %-6s %-10s round %d: p50 %.4f ms, p99 %.4f ms"
      % (j["name"], j["mode"], j["engine"], j["round"], j["p50_ms"], j["p99_ms"]),
      file=sys.stderr)' "$engine" "$m" "$load" "$r" "$mode" >>"$RESULTS"
        done
      done
    done
  done
  stop_busy
done

# --- summary -----------------------------------------------------------------------------------
echo "== summary (medians over rounds; loaded/idle = loaded p50 / idle p50 of the same mode;" \
  "paced = a fixed wait before each run; floor = one thread's arithmetic loop as long as Kiln's" \
  "idle p50, the machine's own p99/p50 at that length; floor-par = that loop on each of the" \
  "threads at once, in chunks they share; results in $RESULTS)"
"$PYTHON" - "$RESULTS" "$WAKE_JSON" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
groups = {}
for r in rows:
    groups.setdefault((r["name"], r.get("mode", "tight"), r["engine"], r["load"]), []).append(r)
modes = ["tight", "paced"]
loads = ["idle", "busy", "over"]

def figure(name, mode, engine, load, field):
    """The median of `field` over the rounds, or None when that case did not run."""
    rs = groups.get((name, mode, engine, load))
    return statistics.median(r[field] for r in rs) if rs else None

def ratio(name, mode, engine, load):
    """Loaded p50 over idle p50 of the same mode."""
    p50, idle = (figure(name, mode, engine, l, "p50_ms") for l in (load, "idle"))
    return p50 / idle if p50 and idle else None

def spread(name, mode, engine, load):
    """p99 over p50."""
    p50, p99 = (figure(name, mode, engine, load, f) for f in ("p50_ms", "p99_ms"))
    return p99 / p50 if p50 and p99 else None

fmt = lambda x, spec=".2f": format(x, spec) if x is not None else "-"
print(f"{'model':9} {'mode':6} {'engine':10} {'load':5} {'p50 ms':>10} {'p99 ms':>10} {'p99/p50':>8} {'loaded/idle':>11}")
for name, mode, engine, load in sorted(
        groups, key=lambda k: (k[0], modes.index(k[1]), loads.index(k[3]), k[2])):
    print(f"{name:9} {mode:6} {engine:10} {load:5} "
          f"{fmt(figure(name, mode, engine, load, 'p50_ms'), '.4f'):>10} "
          f"{fmt(figure(name, mode, engine, load, 'p99_ms'), '.4f'):>10} "
          f"{fmt(spread(name, mode, engine, load)):>8} {fmt(ratio(name, mode, engine, load)):>11}")

# Issue 14's checks, read off the medians above: Kiln's loaded/idle p50 ratio no worse than ONNX
# Runtime's, and Kiln's loaded p99 under twice its p50, beside the floors' p99/p50 at the same load
# (the floor at 2 or more says the machine alone spreads a run of that length so much; floor-par
# at 2 or more, that it spreads so much a run that needs all its threads); with KILN_BASE, Kiln's
# idle p50 against kiln-base's (within 5 %). Last, for reading the ratios: Kiln's loaded p50 over
# ONNX Runtime's at the same load (an engine slow idle has a low loaded/idle ratio).
verdict = lambda ok: "-" if ok is None else "yes" if ok else "no"
cases = sorted({(k[0], k[1]) for k in groups}, key=lambda c: (c[0], modes.index(c[1])))
print("== issue 14's checks (loaded/idle p50: Kiln no worse than ONNX Runtime; Kiln's p99/p50 under 2,"
      " beside the floors')")
print(f"{'model':9} {'mode':6} {'load':5} {'kiln l/i':>9} {'ort l/i':>8} {'ok':>4} "
      f"{'kiln p99/p50':>13} {'floor':>6} {'floor-par':>10} {'ok':>4} {'p50 kiln/ort':>13}")
for name, mode in cases:
    for load in loads[1:]:
        if (name, mode, "kiln", load) not in groups:
            continue
        k, o = ratio(name, mode, "kiln", load), ratio(name, mode, "ort", load)
        s = spread(name, mode, "kiln", load)
        f, fp = (spread(name, mode, e, load) for e in ("floor", "floor-par"))
        kp, op = (figure(name, mode, e, load, "p50_ms") for e in ("kiln", "ort"))
        print(f"{name:9} {mode:6} {load:5} {fmt(k):>9} {fmt(o):>8} "
              f"{verdict(None if k is None or o is None else k <= o):>4} {fmt(s):>13} {fmt(f):>6} "
              f"{fmt(fp):>10} {verdict(None if s is None else s < 2):>4} "
              f"{fmt(kp / op if kp and op else None):>13}")
for name, mode in cases:
    new, base = (figure(name, mode, e, "idle", "p50_ms") for e in ("kiln", "kiln-base"))
    if new and base:
        print(f"{name} {mode}: Kiln's idle p50 {new:.4f} ms, kiln-base's {base:.4f} ms "
              f"({(new / base - 1) * 100:+.1f} %; within 5 %: {verdict(new <= base * 1.05)})")
if len(sys.argv) > 2 and sys.argv[2]:
    w = json.loads(sys.argv[2])
    print(f"== machine: waking a sleeping thread on another CPU costs the waker {w['waker_us_p50']:.1f} us, "
          f"and the thread runs {w['woken_us_p50']:.1f} us after the wake began (medians of "
          f"{w['wakes']} wakes after {w['gap_us']} us of sleep; bench/load/wake.cpp)")
PY
