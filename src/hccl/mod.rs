//! HCCL: the safe wrapper over the collective library (exported by libSynapse.so, or by the
//! mock), and how the ranks of a job find each other.
//!
//! Owns: launcher bootstrap ([`bootstrap`]: rank, world size, local rank and rendezvous from
//! the environment) and the TCP rendezvous that hands rank 0's unique id to the other ranks
//! ([`rendezvous`]). The communicator and collectives are added here by their own modules.
//! Must not touch: the Synapse device layer (`crate::synapse`) beyond reading its module-id
//! rule, or the mock's internals.

pub mod bootstrap;
pub mod rendezvous;
