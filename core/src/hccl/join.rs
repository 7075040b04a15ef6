//! Joining a communicator from a launcher's bootstrap: rank 0 creates the unique id and serves it
//! over the authenticated rendezvous, the other ranks fetch it, then everyone calls
//! `hcclCommInitRank` (the bring-up of hccl_demo, with our rendezvous in place of MPI_Bcast).
//!
//! Owns: [`join`]. Must not touch: environment parsing (`bootstrap`) or the wire protocol
//! (`rendezvous`).

use std::time::Duration;

use super::bootstrap::{Bootstrap, Rendezvous};
use super::comm::{Comm, CommOptions};
use super::error::{HcclError, Result};
use super::rendezvous::{fetch, serve};
use super::types::UniqueId;
use crate::synapse::Device;

fn rendezvous_err(e: super::rendezvous::RendezvousError) -> HcclError {
    HcclError::Bootstrap(std::sync::Arc::new(e))
}

/// Joins the communicator described by `boot` on `device`: world size 1 needs nothing;
/// `HCCL_COMM_ID` means every rank passes a zeroed id (the vendor's mode); otherwise rank 0 serves
/// the id at the rendezvous address and the others fetch it, each step bounded by `timeout`.
///
/// # Errors
/// [`HcclError::Bootstrap`] when the rendezvous fails (timeout, refused secret, unreachable rank
/// 0); the errors of [`Comm::init_rank`].
pub fn join(device: &Device, boot: &Bootstrap, timeout: Duration, opts: CommOptions) -> Result<Comm> {
    let (rank, n) = (boot.rank, boot.world_size);
    match &boot.rendezvous {
        Rendezvous::None => Comm::init_rank(device, n, &Comm::unique_id(device.runtime())?, rank, opts),
        Rendezvous::HcclCommId(_) => Comm::init_rank(device, n, &UniqueId::zeroed(), rank, opts),
        Rendezvous::Tcp { addr, secret } if rank == 0 => {
            let id = Comm::unique_id(device.runtime())?;
            let server = serve(*addr, secret.clone(), &id.to_bytes(), n, timeout).map_err(rendezvous_err)?;
            let comm = Comm::init_rank(device, n, &id, 0, opts)?;
            server.wait().map_err(rendezvous_err)?;
            Ok(comm)
        }
        Rendezvous::Tcp { addr, secret } => {
            let bytes = fetch(*addr, secret, rank, n, timeout).map_err(rendezvous_err)?;
            Comm::init_rank(device, n, &UniqueId::from_bytes(&bytes)?, rank, opts)
        }
    }
}
