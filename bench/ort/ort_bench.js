// Times one ONNX model with ONNX Runtime (onnxruntime-node, CPU execution provider), as
// `kiln bench --json` times it with Kiln, for bench/ort/run.sh.
//
// Usage: node ort_bench.js MODEL.onnx [--threads N] [--iters N] [--warmup N] [--wait-ms MS]
//                          [--input NAME=FILE.npy ...] [--output-dir DIR] [--profile PREFIX]
// --wait-ms sleeps that long (untimed) before each run, as `kiln bench --wait-ms` does.
// --profile has ONNX Runtime record every run (warm-up included) in a JSON trace whose file name
// starts with PREFIX; the output's "profile" names it (bench/ort/layers.py reads it). Profiling
// costs time: its p50 is not the bench's.
// NODE_PATH must find onnxruntime-node (run.sh installs it under the build directory).
// Inputs not given are seeded random float32 values in [-1, 1) (symbolic dims 1). With
// --output-dir, one more run writes each output to DIR/<name>.npy (float32 only). Prints one JSON
// object: model, threads, iters, warmup, load_s, min_ms, p50_ms, p90_ms, p99_ms, mean_ms,
// throughput_per_s (nearest-rank percentiles, as kiln bench).
'use strict';
const fs = require('fs');
const path = require('path');
const ort = require('onnxruntime-node');

function parseArgs(argv) {
  const args = {threads: 2, iters: 100, warmup: 10, waitMs: 0, inputs: {}, outputDir: null,
                profile: null, model: null};
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === '--threads') args.threads = parseInt(value(), 10);
    else if (a === '--iters') args.iters = parseInt(value(), 10);
    else if (a === '--warmup') args.warmup = parseInt(value(), 10);
    else if (a === '--wait-ms') args.waitMs = parseFloat(value());
    else if (a === '--output-dir') args.outputDir = value();
    else if (a === '--profile') args.profile = value();
    else if (a === '--input') {
      const [name, file] = value().split('=');
      args.inputs[name] = file;
    } else if (!a.startsWith('--') && args.model === null) args.model = a;
    else throw new Error(`unknown argument ${a}`);
  }
  if (args.model === null) throw new Error('usage: node ort_bench.js MODEL.onnx [options]');
  return args;
}

// .npy (version 1 or 2, little-endian float32 or int64, C order) to an ort.Tensor.
function readNpy(file) {
  const buf = fs.readFileSync(file);
  if (buf.toString('latin1', 1, 6) !== 'NUMPY') throw new Error(`${file}: not a .npy file`);
  const major = buf[6];
  const headerLen = major === 1 ? buf.readUInt16LE(8) : buf.readUInt32LE(8);
  const start = (major === 1 ? 10 : 12) + headerLen;
  const header = buf.toString('latin1', major === 1 ? 10 : 12, start);
  const int64 = /'descr':\s*'<i8'/.test(header);
  if ((!int64 && !/'descr':\s*'<f4'/.test(header)) || /'fortran_order':\s*True/.test(header))
    throw new Error(`${file}: expected a C-order float32 or int64 array, header ${header.trim()}`);
  const shape = header.match(/'shape':\s*\(([^)]*)\)/)[1].split(',').map((s) => s.trim())
                    .filter((s) => s !== '').map(Number);
  const bytes = buf.buffer.slice(buf.byteOffset + start, buf.byteOffset + buf.length);
  if (int64) return new ort.Tensor('int64', new BigInt64Array(bytes), shape);
  return new ort.Tensor('float32', new Float32Array(bytes), shape);
}

function writeNpy(file, tensor) {
  if (tensor.type !== 'float32') throw new Error(`output ${file}: only float32 is written`);
  const shape = tensor.dims.length === 1 ? `(${tensor.dims[0]},)` : `(${tensor.dims.join(', ')})`;
  let header = `{'descr': '<f4', 'fortran_order': False, 'shape': ${shape}, }`;
  header += ' '.repeat(64 - ((10 + header.length + 1) % 64)) + '\n';
  const prefix = Buffer.alloc(10);
  prefix.write('\x93NUMPY', 0, 'latin1');
  prefix[6] = 1;
  prefix[7] = 0;
  prefix.writeUInt16LE(header.length, 8);
  const data = Buffer.from(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength);
  fs.writeFileSync(file, Buffer.concat([prefix, Buffer.from(header, 'latin1'), data]));
}

// A seeded uniform [-1, 1) float32 tensor (xorshift64*), for inputs not given.
function randomTensor(dims, seed) {
  const n = dims.reduce((a, b) => a * b, 1);
  const data = new Float32Array(n);
  let s = BigInt(seed) * 0x9E3779B97F4A7C15n + 1n;
  const mask = (1n << 64n) - 1n;
  for (let i = 0; i < n; ++i) {
    s ^= s >> 12n; s ^= (s << 25n) & mask; s ^= s >> 27n;
    const r = Number(((s * 0x2545F4914F6CDD1Dn) & mask) >> 11n) / 2 ** 53;
    data[i] = 2 * r - 1;
  }
  return new ort.Tensor('float32', data, dims);
}

function percentile(sorted, p) {
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(Math.max(rank, 1), sorted.length) - 1];
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const loadStart = process.hrtime.bigint();
  const session = await ort.InferenceSession.create(args.model, {
    executionProviders: ['cpu'],
    intraOpNumThreads: args.threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
    ...(args.profile === null ? {} : {enableProfiling: true, profileFilePrefix: args.profile}),
  });
  const loadSeconds = Number(process.hrtime.bigint() - loadStart) / 1e9;

  const feeds = {};
  session.inputNames.forEach((name, k) => {
    if (name in args.inputs) {
      feeds[name] = readNpy(args.inputs[name]);
      return;
    }
    const meta = session.inputMetadata ? session.inputMetadata[k] : null;
    if (!meta || !meta.isTensor || meta.type !== 'float32')
      throw new Error(`input ${name}: give it with --input (only float32 inputs are made here)`);
    feeds[name] = randomTensor(meta.shape.map((d) => (typeof d === 'number' ? d : 1)), k);
  });

  if (args.outputDir !== null) {
    const outputs = await session.run(feeds);
    fs.mkdirSync(args.outputDir, {recursive: true});
    for (const name of session.outputNames) {
      writeNpy(path.join(args.outputDir, `${name.replace(/[^A-Za-z0-9_.-]/g, '_')}.npy`),
               outputs[name]);
    }
  }
  // A blocking sleep (Atomics.wait), so the wait is the same plain sleep of the calling thread as
  // kiln bench's, with no event-loop timer in between.
  const sleeper = new Int32Array(new SharedArrayBuffer(4));
  const pause = () => {
    if (args.waitMs > 0) Atomics.wait(sleeper, 0, 0, args.waitMs);
  };
  for (let i = 0; i < args.warmup; ++i) {
    pause();
    await session.run(feeds);
  }
  const ms = [];
  for (let i = 0; i < args.iters; ++i) {
    pause();
    const start = process.hrtime.bigint();
    await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  ms.sort((a, b) => a - b);
  const mean = ms.reduce((a, b) => a + b, 0) / ms.length;
  let profile = {};
  if (args.profile !== null) {
    // endProfiling writes PREFIX_<date and time>.json; the newest file of that prefix is this one.
    session.endProfiling();
    const dir = path.dirname(args.profile), base = path.basename(args.profile);
    const files = fs.readdirSync(dir)
                      .filter((f) => f.startsWith(base) && f.endsWith('.json'))
                      .map((f) => path.join(dir, f))
                      .sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
    profile = {profile: files.length > 0 ? files[0] : null};
  }
  console.log(JSON.stringify({
    model: args.model,
    runtime: `onnxruntime ${ort.env.versions.common}`,
    threads: args.threads,
    iters: args.iters,
    warmup: args.warmup,
    wait_ms: args.waitMs,
    load_s: loadSeconds,
    min_ms: ms[0],
    p50_ms: percentile(ms, 50),
    p90_ms: percentile(ms, 90),
    p99_ms: percentile(ms, 99),
    mean_ms: mean,
    throughput_per_s: 1000 / mean,
    ...profile,
  }));
}

main().catch((e) => {
  console.error(`ort_bench: error: ${e.message}`);
  process.exit(2);
});
