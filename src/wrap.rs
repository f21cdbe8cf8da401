//! `netgap wrap`: runs a program with netgap's preload sockets library
//! (`libnetgap_preload.so`), which moves the program's TCP connections to
//! peers on this host that run the library too onto shared memory, and
//! (`-t xdp`) those to other hosts onto xdp: direct, each on an AF_XDP
//! socket of the program's own that the hosts' relays (`netgap relay`)
//! set up, or through the relays (`--relayed`, or where they refuse): the
//! same library, where the relay's presence decides.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;
use thiserror::Error;

use netgap_transport::Programs;
use netgap_workload::preload::preload_value;
pub use netgap_workload::preload::{library_path, relay_present, LIBRARY_ENV, LIBRARY_FILE};

/// Why a program could not be wrapped.
#[derive(Debug, Error)]
pub enum WrapError {
    /// A stack the library does not provide.
    #[error(
        "wrap: stack {stack:?} is not provided by the preload library (it provides: {provided})"
    )]
    Stack {
        /// The stack asked for.
        stack: String,
        /// The stacks it provides.
        provided: String,
    },
    /// `--relayed` off xdp, where there are no relays.
    #[error(
        "wrap: --relayed applies to -t xdp alone (connections to other hosts), not to {stack}"
    )]
    Relayed {
        /// The stack asked for.
        stack: String,
    },
    /// No program given.
    #[error("wrap: no program given (netgap wrap -t shm -- PROGRAM ARGS)")]
    NoProgram,
    /// The library is not where it should be.
    #[error("wrap: {0}")]
    Missing(#[from] netgap_workload::preload::LibraryMissing),
    /// The program could not be started.
    #[error("wrap: cannot run {program}: {source}")]
    Exec {
        /// The program as given.
        program: String,
        /// What `execvp` said.
        source: std::io::Error,
    },
}

/// Replaces this process with `command` (program and arguments) under the
/// library for `stack`, its connections to other hosts kept on the relays
/// if `relayed`; returns only on failure.
pub fn exec(stack: &str, relayed: bool, command: &[OsString]) -> WrapError {
    let programs = netgap_transport::programs(stack);
    if !programs.under_library() {
        let provided: Vec<&str> = netgap_transport::registry()
            .iter()
            .filter(|t| t.capabilities().programs.under_library())
            .map(|t| t.name())
            .collect();
        return WrapError::Stack {
            stack: stack.to_string(),
            provided: provided.join(", "),
        };
    }
    if relayed && programs != Programs::LibraryWithRelay {
        return WrapError::Relayed {
            stack: stack.to_string(),
        };
    }
    if programs == Programs::LibraryWithRelay && !relay_present() {
        eprintln!("netgap wrap: no relay of root's runs in this network namespace (start `netgap relay`): connections to other hosts stay on the kernel's TCP");
    }
    let Some((program, args)) = command.split_first() else {
        return WrapError::NoProgram;
    };
    let library = match library_path() {
        Ok(l) => l,
        Err(e) => return e.into(),
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_PRELOAD", preload_value(&library))
        .env(netgap_workload::preload::STACK_ENV, stack);
    if relayed {
        cmd.env(netgap_workload::preload::DIRECT_ENV, "0");
    }
    let source = cmd.exec();
    WrapError::Exec {
        program: program.to_string_lossy().into_owned(),
        source,
    }
}
