//! The pure policy core: everything SPEC.md decides, with no proxy-wasm dependency.
//!
//! | SPEC section | module |
//! |---|---|
//! | 2. Inputs (headers, `nvext`) | [`pins`], [`json`] |
//! | 2. Which paths take the two-hop flow | [`paths`] |
//! | 2, 4. Other paths: passed on, never carrying KV transfer parameters | [`passthrough`] |
//! | 3. Per-hop resolution, exact pins | [`resolve`] |
//! | 3. Errors and their answers | [`error`] |
//! | 3–4. Which worker answers are failures of the hop | [`answers`] |
//! | 4. The two-hop flow and its bodies | [`rewrite`] |
//! | 5. Session affinity, unpinned choice | [`select`] |
//! | Passive health shared by all threads | [`health`] |
//! | 6. Registry and plugin configuration | [`registry`] |
//! | 7. Headers a client may not send | [`headers`] |

pub mod answers;
pub mod error;
pub mod headers;
pub mod health;
pub mod json;
pub mod passthrough;
pub mod paths;
pub mod pins;
pub mod registry;
pub mod resolve;
pub mod rewrite;
pub mod select;

/// The attribute the core's unit tests are marked with (`use crate::policy::testing::test;`):
/// libtest's `#[test]` natively and on wasm32-wasip1, wasm-bindgen-test's on
/// wasm32-unknown-unknown, where the same tests run in Node.
#[cfg(test)]
mod testing {
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    pub(super) use core::prelude::v1::test;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    pub(super) use wasm_bindgen_test::wasm_bindgen_test as test;
}
