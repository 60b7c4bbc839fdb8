//! The subcommands of `pinroute-harness`, one module each.

pub mod envoy_config;
pub mod sim_worker;
pub mod test;
pub mod up;
