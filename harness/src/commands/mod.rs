//! The subcommands of `pinroute-harness`, one module each.

pub mod envoy_config;
