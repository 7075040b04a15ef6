//! dropcompute: DropCompute (Giladi et al., NeurIPS 2023) for Intel Gaudi.
//!
//! See ARCHITECTURE.md for the layers and the data flow.

pub mod commands;
pub mod policy;
pub mod sim;
pub mod trace;
pub mod tune;
