//! A point-to-point point as a two-role placement: its server role on the
//! first host's agent, its client role on the second host's, through the
//! same sessions, reader threads and naming of failed hosts as a
//! workload's roles. This process only coordinates: it opens both roles,
//! starts each repetition on both, gathers what each end measured and
//! hands it to the runner ([`runner::measure_ends`]), which warms up,
//! calibrates, repeats and checks the bytes of each repetition as it does
//! for a client role in this process, so the records are the same.

use super::coordinator::{fix_unspecified, retarget, WorkloadCoordinator, WorkloadError};
use crate::bench::RepOutcome;
use crate::runner::{
    self, Method, PointEnds, PointMeasurement, RepMeasurement, RunError, ServerRep,
};
use netgap_core::host::HostFacts;
use netgap_core::spec::PointSpec;
use netgap_core::stats::LatencyHistogram;
use netgap_proto::message::{ClientRep, Phase, Reply};
use netgap_proto::session::ClientProgress;
use std::time::Duration;

/// The host whose agent plays the server role: the first, as in every run
/// over `--hosts`.
const SERVER: usize = 0;
/// The host whose agent plays the client role.
const CLIENT: usize = 1;
/// How long an agent may take to answer a request that moves no data.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the client's agent may say nothing while it runs a
/// repetition: it says it is alive every second.
const CLIENT_SILENCE: Duration = Duration::from_secs(3);
/// How long after the client role's end the server's answer may come
/// beyond the point's I/O timeout: its last bytes are on their way.
const DONE_GRACE: Duration = Duration::from_millis(250);
/// After one end failed, how long the other end's agent has to speak: one
/// that is alive says at once that its flow broke too, so one that says
/// nothing is the host that stopped, and is named.
const OTHER_END_WAIT: Duration = Duration::from_millis(500);
/// After the client role could not connect, how long the server's agent
/// has to speak: it waits 5 s for the point's connection and then says
/// why, so one silent past that has stopped.
const ACCEPT_END_WAIT: Duration = Duration::from_secs(6);

const TWO_HOSTS: &str =
    "a point-to-point test needs two hosts: the first serves, the second is the client";

impl WorkloadCoordinator {
    /// The facts of a point-to-point run's two hosts, from their agents'
    /// welcomes: `(client, server)`.
    pub(crate) fn pair_facts(&self) -> Result<(HostFacts, HostFacts), WorkloadError> {
        match (self.links.get(CLIENT), self.links.get(SERVER)) {
            (Some(c), Some(s)) => Ok((c.facts.clone(), s.facts.clone())),
            _ => Err(WorkloadError::Point(TWO_HOSTS.into())),
        }
    }

    /// Measures one point-to-point point with its server role on the first
    /// host's agent and its client role on the second's (on CPU
    /// `client_cpu` there, when given); `on_rep` is called after each
    /// measured repetition. A host that fails, dies or goes silent is
    /// named in the error.
    pub(crate) fn measure_pair(
        &mut self,
        spec: &PointSpec,
        method: &Method,
        client_cpu: Option<u32>,
        on_rep: &mut dyn FnMut(u32),
    ) -> Result<PointMeasurement, WorkloadError> {
        self.pair_facts()?;
        self.use_hosts(&[SERVER, CLIENT])?;
        let token = netgap_transport::preamble::new_token()
            .map_err(|e| WorkloadError::Point(e.to_string()))?;
        let open = self.links[SERVER].session.open(spec.clone(), token.clone());
        self.send(SERVER, &open)?;
        let reply = self.wait(SERVER, REPLY_TIMEOUT)?;
        let addr = self.links[SERVER]
            .session
            .on_listening(reply)
            .map_err(|e| self.host_error(SERVER, e.to_string()))?;
        // On a mesh the client host reaches the server over the link
        // between them, as every other run's flows do.
        let target = match self.links[CLIENT].host.via {
            Some((_, server_end)) => retarget(&addr, server_end),
            None => fix_unspecified(&addr, &self.links[SERVER].host),
        };
        let io_timeout = Duration::from_millis(u64::from(spec.io_timeout_ms));
        let open = self.links[CLIENT]
            .session
            .client_open(spec.clone(), token, target, client_cpu);
        self.send(CLIENT, &open)?;
        let reply = self.wait(CLIENT, REPLY_TIMEOUT + io_timeout)?;
        let path_choices = match self.links[CLIENT].session.on_client_connected(reply) {
            Ok(choices) => choices,
            // A server that stopped after announcing its listener leaves
            // the client's proof unanswered: the client fails, the server
            // is the host to name.
            Err(e) => return Err(self.blame(CLIENT, SERVER, e.to_string(), ACCEPT_END_WAIT)),
        };
        let reply = self.wait(SERVER, REPLY_TIMEOUT)?;
        self.links[SERVER]
            .session
            .on_accepted(reply)
            .map_err(|e| self.host_error(SERVER, e.to_string()))?;
        let mut ends = AgentEnds {
            coord: self,
            io_timeout,
            failed: None,
        };
        let measured = runner::measure_ends(&mut ends, method, on_rep);
        let failed = ends.failed.take();
        let mut m = match measured {
            Ok(m) => m,
            Err(e) => return Err(failed.unwrap_or_else(|| WorkloadError::Point(e.to_string()))),
        };
        for h in [CLIENT, SERVER] {
            let close = self.links[h].session.close();
            self.send(h, &close)?;
        }
        for h in [CLIENT, SERVER] {
            let reply = self.wait(h, REPLY_TIMEOUT)?;
            self.links[h]
                .session
                .on_closed(reply)
                .map_err(|e| self.host_error(h, e.to_string()))?;
        }
        m.path_choices = path_choices;
        Ok(m)
    }

    /// The error to report after host `failed` failed with `detail`: the
    /// other host is named instead when it stays silent for `within`
    /// (stopped: its end of the flow went quiet and made `failed`'s fail)
    /// or its session ends.
    fn blame(
        &mut self,
        failed: usize,
        other: usize,
        detail: String,
        within: Duration,
    ) -> WorkloadError {
        match self.next_from(&[other], within) {
            None => {
                let name = self.links[failed].host.name.clone();
                self.host_error(
                    other,
                    format!(
                        "its agent went silent (nothing heard for {within:?} after host {name} failed: {detail})"
                    ),
                )
            }
            Some((_, Err(lost))) => self.host_error(other, lost.to_string()),
            Some((_, Ok(_))) => self.host_error(failed, detail),
        }
    }

    /// The server's answer to a repetition, as the runner takes it.
    fn server_rep(&mut self, reply: Reply) -> Result<ServerRep, WorkloadError> {
        match self.links[SERVER].session.on_done(reply) {
            Ok((bytes_rx, bytes_tx, cpu, datagrams)) => Ok(ServerRep {
                bytes_rx,
                bytes_tx,
                cpu,
                datagrams,
            }),
            Err(e) => Err(self.blame(SERVER, CLIENT, e.to_string(), OTHER_END_WAIT)),
        }
    }

    /// One repetition on both agents: the server's role started first, as
    /// a client role in this process starts after it; the client's round
    /// trips go into `hist`.
    fn pair_rep(
        &mut self,
        iterations: u64,
        phase: Phase,
        io_timeout: Duration,
        hist: &mut LatencyHistogram,
    ) -> Result<RepMeasurement, WorkloadError> {
        let run = self.links[SERVER].session.run(iterations, phase);
        self.send(SERVER, &run)?;
        let run = self.links[CLIENT].session.client_run(iterations, phase);
        self.send(CLIENT, &run)?;
        let mut server = None;
        let client: ClientRep = loop {
            match self.next_from(&[CLIENT, SERVER], CLIENT_SILENCE) {
                None => {
                    return Err(self.host_error(
                        CLIENT,
                        format!("its agent went silent (nothing heard for {CLIENT_SILENCE:?} while it ran the client role)"),
                    ))
                }
                Some((CLIENT, Ok(reply))) => {
                    match self.links[CLIENT].session.on_client_result(reply) {
                        Ok(ClientProgress::Alive) => {}
                        Ok(ClientProgress::Buckets(b)) => {
                            for [v, n] in b {
                                hist.record_n_ns(v, n);
                            }
                        }
                        Ok(ClientProgress::Done(rep)) => break rep,
                        Err(e) => {
                            return Err(self.blame(CLIENT, SERVER, e.to_string(), OTHER_END_WAIT))
                        }
                    }
                }
                Some((CLIENT, Err(lost))) => return Err(self.host_error(CLIENT, lost.to_string())),
                Some((_, Ok(reply))) => server = Some(self.server_rep(reply)?),
                Some((_, Err(lost))) => return Err(self.host_error(SERVER, lost.to_string())),
            }
        };
        let server = match server {
            Some(s) => s,
            None => match self.next_from(&[SERVER], io_timeout + DONE_GRACE) {
                Some((_, Ok(reply))) => self.server_rep(reply)?,
                Some((_, Err(lost))) => return Err(self.host_error(SERVER, lost.to_string())),
                None => {
                    return Err(self.host_error(
                        SERVER,
                        format!(
                        "its agent went silent (no answer within {:?} of the client role's end)",
                        io_timeout + DONE_GRACE
                    ),
                    ))
                }
            },
        };
        Ok(RepMeasurement {
            client: RepOutcome {
                elapsed_ns: client.elapsed_ns,
                value: client.value,
                bytes_tx: client.bytes_tx,
                bytes_rx: client.bytes_rx,
                // The agent's CPU reading already holds its helpers'.
                helper_cpu_ns: 0,
            },
            client_cpu: client.cpu,
            client_datagrams: client.datagrams,
            server,
        })
    }
}

/// The two ends of a point on two agents, for the runner; the error that
/// ended a repetition is kept whole, naming its host.
struct AgentEnds<'a> {
    coord: &'a mut WorkloadCoordinator,
    io_timeout: Duration,
    failed: Option<WorkloadError>,
}

impl PointEnds for AgentEnds<'_> {
    fn rep(
        &mut self,
        iterations: u64,
        phase: Phase,
        hist: &mut LatencyHistogram,
    ) -> Result<RepMeasurement, RunError> {
        self.coord
            .pair_rep(iterations, phase, self.io_timeout, hist)
            .map_err(|e| {
                let line = e.to_string();
                self.failed = Some(e);
                RunError::Peer(line)
            })
    }
}
