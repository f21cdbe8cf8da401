//! netgap's integration tests, one module per subject, linked into one test
//! binary (`cargo test --test it`; one module: `cargo test --test it web::`).
//!
//! The tests of one binary share its process, and run two or more at a
//! time: none changes the environment, the current directory, signal
//! dispositions or the umask of the process; each uses its own temporary
//! directory, testbed name (`common::testbed::Testbed`), addresses and
//! ports; and a test that measures its own process (`flows_scale`) runs
//! its body in a child process of its own (`common::child_test`).
//!
//! A system test that cannot run here (no root, no namespaces, a program
//! missing) says why and passes, except where CI requires the system tests
//! (`NETGAP_REQUIRE_SYSTEM_TESTS=1`): then it fails (`common::skip`).

mod common;

mod agent_log;
mod agent_pair;
mod auth;
mod buffers;
mod cli;
mod compare;
mod conformance;
mod emulator;
mod flags;
mod flows_scale;
mod forwarding;
mod gather;
mod hardening;
mod hostlists;
mod import;
/// Built with the `mpi` feature: `cargo test --features mpi --test it mpi::`.
#[cfg(feature = "mpi")]
mod mpi;
/// The default build's MPI tests: known, and refused in one line.
#[cfg(not(feature = "mpi"))]
mod mpi_absent;
mod mptcp;
mod multihost;
mod physics;
mod pio;
mod pipeline;
mod preload;
mod preload_apps;
mod preload_conformance;
/// Built with the `xdp` feature: the library's direct connections.
#[cfg(feature = "xdp")]
mod preload_direct;
mod preload_hostile;
#[cfg(feature = "mpi")]
mod preload_mpi;
mod preload_pipeline;
#[cfg(feature = "xdp")]
mod preload_xdp;
#[cfg(feature = "xdp")]
mod preload_xdp_crossed;
#[cfg(feature = "xdp")]
mod preload_xdp_hostile;
#[cfg(feature = "xdp")]
mod preload_xdp_runs;
/// Built with the `xdp` feature: the relay serving direct connections.
#[cfg(feature = "xdp")]
mod relay_direct;
mod report;
mod report_chromium;
mod results_files;
mod runner;
mod scale;
mod shaper;
/// A real Slurm cluster on the testbed (slurm-wlm, munge) and mpirun.
mod slurm;
mod stopped_peer;
mod study;
mod sweep;
mod testbed;
mod testbed_multihost;
mod testbed_queues;
mod web;
mod workload_cpu;
/// Built with the `xdp` feature: `cargo test --features xdp --test it xdp::`.
#[cfg(feature = "xdp")]
mod xdp;
/// Built with the `xdp` feature: the staged workloads over xdp.
#[cfg(feature = "xdp")]
mod xdp_staged;
