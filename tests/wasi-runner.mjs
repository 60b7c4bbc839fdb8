// Runs a wasm32-wasip1 test binary under Node's WASI: cargo's runner for that target.
// Imports other than WASI (proxy-wasm host calls linked in but never called by the pure
// core's tests) trap with their name if a test ever reaches one.
import { readFile } from "node:fs/promises";
import { WASI } from "node:wasi";
import process from "node:process";

const [, , wasmPath, ...args] = process.argv;
const wasi = new WASI({ version: "preview1", args: [wasmPath, ...args], env: process.env, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(wasmPath));
const imports = { wasi_snapshot_preview1: wasi.wasiImport };
for (const { module: from, name, kind } of WebAssembly.Module.imports(module)) {
  if (from === "wasi_snapshot_preview1" || kind !== "function") continue;
  imports[from] ??= {};
  imports[from][name] = () => {
    throw new Error(`${from}.${name} is not provided by the test runner`);
  };
}
const instance = await WebAssembly.instantiate(module, imports);
// The filter's own `_initialize` (proxy-wasm's entry point) is linked in too; a command
// module is started through `_start` alone.
const { memory, _start } = instance.exports;
process.exitCode = wasi.start({ exports: { memory, _start } });
