// Runs an ONNX model with ONNX Runtime (onnxruntime-node, CPU execution provider) on inputs given
// as JSON, for tests/python/test_onnxruntime.py.
//
// Usage: node ort_node_run.js MODEL.onnx INPUTS.json OUTPUTS.json
// INPUTS.json: {"name": {"dims": [...], "data": [...]}} (float32); OUTPUTS.json gets every
// output as {"name": {"type": "float32", "dims": [...], "data": [...]}} (int64 as numbers).
// NODE_PATH must find onnxruntime-node.
'use strict';
const fs = require('fs');
const ort = require('onnxruntime-node');

async function main() {
  const [model, inputsFile, outputsFile] = process.argv.slice(2);
  const given = JSON.parse(fs.readFileSync(inputsFile, 'utf8'));
  const session = await ort.InferenceSession.create(model, {executionProviders: ['cpu']});
  const feeds = {};
  for (const [name, t] of Object.entries(given))
    feeds[name] = new ort.Tensor('float32', Float32Array.from(t.data), t.dims);
  const results = await session.run(feeds);
  const out = {};
  for (const [name, t] of Object.entries(results))
    out[name] = {type: t.type, dims: t.dims, data: Array.from(t.data, Number)};
  fs.writeFileSync(outputsFile, JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
