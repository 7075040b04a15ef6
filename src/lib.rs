//! dropcompute: DropCompute (Giladi et al., NeurIPS 2023) for Intel Gaudi.
//!
//! See ARCHITECTURE.md for the layers and the data flow.

pub mod bench;
pub mod kernels;
pub mod mock;
pub mod synapse;
