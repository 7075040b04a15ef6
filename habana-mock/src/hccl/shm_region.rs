//! The shared-memory mapping of one communicator whose ranks are processes of one host (the
//! data path of `shm_procs.rs`): 2 parities × n slots × [`SLOT_BYTES`], in `/dev/shm`.
//!
//! Owns: [`Region`] and the slot arithmetic. Must not touch: the algorithm and its barriers
//! (`shm_procs.rs`), the communicator (`comm.rs` holds a `Region` once set up).

/// Bytes of one rank's slot: the largest chunk reduced per round.
pub(crate) const SLOT_BYTES: usize = 4 << 20;

/// The mapping of one communicator, shared by its ranks' processes.
#[derive(Debug)]
pub(crate) struct Region {
    pub(super) map: memmap2::MmapMut,
    pub(super) n: usize,
    /// Rounds run so far (the parity of the next one selects the slots).
    pub(super) rounds: u64,
}

impl Region {
    pub(super) fn slot(&mut self, parity: u64, rank: usize) -> *mut u8 {
        let at = (parity as usize * self.n + rank) * SLOT_BYTES;
        // SAFETY: at + SLOT_BYTES <= 2 · n · SLOT_BYTES = the mapping's length (parity < 2,
        // rank < n), so the offset stays inside the mapping.
        unsafe { self.map.as_mut_ptr().add(at) }
    }
}
