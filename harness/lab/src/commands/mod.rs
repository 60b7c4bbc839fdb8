//! The subcommands of `pinroute-lab`, one module each.

pub mod bench;
pub mod dashboard;
pub mod soak;
