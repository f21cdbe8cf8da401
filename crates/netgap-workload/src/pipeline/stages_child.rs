//! The program side of `--stages program` (`netgap pipeline-stages`): a
//! role's stages on the kernel's TCP sockets, stepped by its agent over
//! standard input and output (see [`super::program`]). Under the preload
//! library, every socket call here is the library's to carry.

use super::program::{Said, StagesJob, StagesReport, COMMAND};
use super::{open_stages, PipeParams, Wire};
use crate::role::{OpenRole as _, RoleError, Stop};
use std::io::{BufRead as _, Write as _};
use std::sync::Arc;

/// Why the stages' program failed, one line beginning with its command.
#[derive(Debug, thiserror::Error)]
pub enum StagesError {
    /// Its standard input could not be read.
    #[error("{COMMAND}: reading from the agent: {0}")]
    Read(std::io::Error),
    /// Its standard input ended before the agent said what it waited for.
    #[error("{COMMAND}: the agent's input ended before {0}")]
    Ended(&'static str),
    /// The job does not parse.
    #[error("{COMMAND}: the job: {0}")]
    Job(serde_json::Error),
    /// The role's parameters do not parse.
    #[error("{COMMAND}: the role's parameters: {0}")]
    Params(serde_json::Error),
    /// The agent said something other than what the phase expects.
    #[error("{COMMAND}: the agent said {got:?} where {want:?} was due")]
    Unexpected {
        /// What the phase expects.
        want: &'static str,
        /// What came, control characters escaped.
        got: String,
    },
    /// This build has no tcp transport.
    #[error("{COMMAND}: this build has no tcp transport")]
    NoTcp,
    /// The role failed.
    #[error("{COMMAND}: {0}")]
    Role(RoleError),
    /// A line to the agent could not be written.
    #[error("{COMMAND}: writing to the agent: {0}")]
    Write(std::io::Error),
    /// A line to the agent could not be made.
    #[error("{COMMAND}: the line to the agent: {0}")]
    Encode(serde_json::Error),
}

/// Runs a role's stages as its agent steps them: the body of the hidden
/// `netgap pipeline-stages` command, which an agent starts (under the
/// preload library over shm or xdp).
pub fn run_stages_child() -> Result<(), StagesError> {
    let mut input = std::io::stdin().lock();
    let mut line = String::new();
    let mut next = |what: &'static str| -> Result<String, StagesError> {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) => Err(StagesError::Ended(what)),
            Ok(_) => Ok(line.trim_end().to_string()),
            Err(e) => Err(StagesError::Read(e)),
        }
    };
    let job: StagesJob = serde_json::from_str(&next("the job")?).map_err(StagesError::Job)?;
    let params: PipeParams =
        serde_json::from_value(job.spec.params.clone()).map_err(StagesError::Params)?;
    let graph = params
        .check(job.spec.point.size_bytes)
        .map_err(|e| StagesError::Role(e.into()))?;
    let tcp = netgap_transport::find("tcp").ok_or(StagesError::NoTcp)?;
    let rate = Arc::new(netgap_transport::rate::RateBudget::new(job.rate_gbps));
    // The agent kills the program when its role is stopped.
    let stop = Stop::new();
    let open = open_stages(
        &job.spec,
        params,
        graph,
        Wire {
            transport: tcp,
            ip: job.listen_ip,
            token: &job.token,
            rate: &rate,
        },
        &stop,
    )
    .map_err(StagesError::Role)?;
    say(&Said::Listening(open.addrs()))?;
    expect(&next("ready")?, "ready")?;
    let ready = Box::new(open).ready().map_err(StagesError::Role)?;
    say(&Said::Ready)?;
    expect(&next("go")?, "go")?;
    let r = ready.run().map_err(StagesError::Role)?;
    say(&Said::Done(Box::new(StagesReport {
        flows: r.flows,
        buckets: r.buckets,
        outcome: r.outcome,
    })))?;
    // Exits when the agent closes its input, once it has read this
    // process's CPU time.
    while next("its end").is_ok() {}
    Ok(())
}

fn expect(got: &str, want: &'static str) -> Result<(), StagesError> {
    if got == want {
        return Ok(());
    }
    Err(StagesError::Unexpected {
        want,
        got: netgap_core::text::escape_control(got)
            .chars()
            .take(80)
            .collect(),
    })
}

/// One line to the agent.
fn say(said: &Said) -> Result<(), StagesError> {
    let mut text = serde_json::to_vec(said).map_err(StagesError::Encode)?;
    text.push(b'\n');
    let mut out = std::io::stdout().lock();
    out.write_all(&text)
        .and_then(|()| out.flush())
        .map_err(StagesError::Write)
}
