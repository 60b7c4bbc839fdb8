// The import module `env` of wasm32-unknown-unknown test binaries, for wasm-bindgen's test
// runner in Node (found through NODE_PATH, which `pinroute-harness test` sets). The binaries
// link the filter, whose proxy-wasm host calls are imported from `env`; the policy core's
// tests never call one, so each traps with its name if a test ever reaches it.
module.exports = new Proxy(
  {},
  {
    get: (_, name) => () => {
      throw new Error(`env.${String(name)} is not provided by the test runner`);
    },
  },
);
