//! Joining a communicator from a launcher's bootstrap: rank 0 creates the unique id and serves it
//! over the authenticated rendezvous, the other ranks fetch it, then everyone calls
//! `hcclCommInitRank` (the bring-up of hccl_demo, with our rendezvous in place of MPI_Bcast).
//!
//! Owns: [`join`]. Must not touch: environment parsing (`bootstrap`) or the wire protocol
//! (`rendezvous`).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use super::bootstrap::{Bootstrap, Rendezvous};
use super::comm::{Comm, CommOptions};
use super::error::{HcclError, Result};
use super::local;
use super::rendezvous::{JobSecret, fetch, serve};
use super::types::UniqueId;
use crate::synapse::Device;

fn rendezvous_err(e: super::rendezvous::RendezvousError) -> HcclError {
    HcclError::Bootstrap(std::sync::Arc::new(e))
}

/// Joins the communicator described by `boot` on `device`: world size 1 needs nothing;
/// `HCCL_COMM_ID` means every rank passes a zeroed id (the vendor's mode); otherwise rank 0 serves
/// the id at the rendezvous address and the others fetch it, each step bounded by `timeout`;
/// one-host jobs without an address ([`Rendezvous::Local`]) do the same on `127.0.0.1:0`, the
/// address and a fresh secret passed through a private file (`super::local`).
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
        Rendezvous::Local { file } if rank == 0 => {
            let id = Comm::unique_id(device.runtime())?;
            let secret = JobSecret::random();
            let loopback = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
            let server = serve(loopback, secret.clone(), &id.to_bytes(), n, timeout).map_err(rendezvous_err)?;
            let published = local::publish(file, server.local_addr(), &secret).map_err(rendezvous_err)?;
            let comm = Comm::init_rank(device, n, &id, 0, opts);
            let served = server.wait().map_err(rendezvous_err);
            drop(published);
            let comm = comm?;
            served?;
            Ok(comm)
        }
        Rendezvous::Local { file } => {
            let started = std::time::Instant::now();
            let (addr, secret) = local::await_published(file, timeout).map_err(rendezvous_err)?;
            let left = timeout.saturating_sub(started.elapsed()).max(Duration::from_secs(1));
            let bytes = fetch(addr, &secret, rank, n, left).map_err(rendezvous_err)?;
            Comm::init_rank(device, n, &UniqueId::from_bytes(&bytes)?, rank, opts)
        }
    }
}
