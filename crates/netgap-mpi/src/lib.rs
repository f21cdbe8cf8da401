//! netgap's MPI level: latency, bandwidth and bidirectional bandwidth
//! through a real MPI library (OSU's methods), measured with netgap's own
//! method and recorded like every other test, over the same paths as the
//! socket tests (shared memory on one machine, or the testbed's links).
//!
//! The coordinator side (plans, launching mpirun, reading rank 0's lines,
//! records) needs no MPI installed; the ranks themselves
//! (`rank`, behind the `mpi` feature) link the MPI library. `netgap run
//! mpi-latency,mpi-bw,mpi-bibw` starts `mpirun -np 2 netgap mpi-rank ...`;
//! rank 0 times the repetitions and writes them to its standard output,
//! which mpirun forwards here ([`wire`]); [`run`] turns them into records.
//! With `-t shm|xdp` the ranks run under netgap's preload sockets library
//! ([`library`]), their tcp BTL's connection moved onto its stack.

pub mod kind;
pub mod launch;
pub mod library;
pub mod plan;
#[cfg(feature = "mpi")]
pub mod rank;
pub mod run;
pub mod wire;

pub use kind::MpiTest;

/// Whether this netgap was built with the MPI ranks (the `mpi` feature).
pub const BUILT_IN: bool = cfg!(feature = "mpi");

/// Whether MPI tests can run here: built in, and `mpirun` on the PATH;
/// otherwise why not, as a sentence.
pub fn availability() -> Result<(), Unavailable> {
    if !BUILT_IN {
        return Err(Unavailable::NotBuiltIn);
    }
    if launch::mpirun_path().is_none() {
        return Err(Unavailable::NoMpirun);
    }
    Ok(())
}

/// Why the MPI tests cannot run here ([`availability`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// This netgap was built without the `mpi` feature.
    #[error("this netgap was built without MPI; build it with `cargo build --features mpi` (needs libopenmpi-dev, libclang-dev)")]
    NotBuiltIn,
    /// No `mpirun` on the PATH.
    #[error("mpirun is not on the PATH (apt-get install openmpi-bin)")]
    NoMpirun,
}
