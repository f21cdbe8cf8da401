//! Where the CPUs of a point's hosts went: the point's own threads, the
//! kernel's packet processing and other work.
//!
//! Every end reads its host's busy share and, of it, the softirq share
//! from `/proc/stat` over its repetitions, and the CPU time of its own
//! threads ([`crate::cpu::CpuUsage`]). On a testbed the hosts are network
//! namespaces of one machine: every end reads the same CPUs, every end's
//! threads count as the point's own, and the softirq share is the
//! emulator's own cost, its forwarding and shaping (with the hosts'
//! receive paths, which run in softirq too): on one machine, work that
//! real links and hosts would do elsewhere. Off a testbed each host is
//! judged on its own readings.
//!
//! What remains of the busy share is other work: other processes, which a
//! quieter host removes. The testbed's forwarding is no such work: a
//! quieter host does not remove it, and when it fills the CPUs the
//! emulator, not the links, binds the point ([`CpuLoad::forwarding_named`]).
//! The other way round, a stream held well below its limit while the CPUs
//! sat idle was held by the testbed's shaper
//! ([`crate::physics::shaper_held`]).
//!
//! The shares may overlap: without the kernel's IRQ time accounting
//! (`CONFIG_IRQ_TIME_ACCOUNTING`), the softirq a thread serves on its way
//! out (a send that forwards its packet through the testbed's bridges
//! before it returns) counts in that thread's CPU time too. Other work is
//! what is left after both, never below 0: an overlap understates it, never
//! blames it for what the point did. Plain data in, plain data out.

use crate::record::ResultRecord;
/// The load section of a record is part of the result model.
pub use crate::record::{BoundBy, CpuLoad};

/// The testbed's forwarding, in percent of all the machine's CPUs, from
/// which it is named as what bound a point (when it is at least the other
/// work): as much as the other work that makes a host contended
/// ([`crate::noise::CONTENDED_BUSY_PERCENT`]).
pub const FORWARDING_BOUND_PERCENT: f64 = 20.0;

/// Busy share of all CPUs from which a machine counts as saturated: no CPU
/// left for the point's ends or its forwarding to go faster.
pub const SATURATED_BUSY_PERCENT: f64 = 90.0;

/// One CPU reading of a host with the point's own threads on it (percent
/// of one core, summed over the ends there).
struct Reading {
    host: String,
    cores: u32,
    busy: f64,
    softirq: Option<f64>,
    own_of_core: f64,
}

impl Reading {
    fn load(self, hosts: Vec<String>, testbed: bool) -> CpuLoad {
        let own = self.own_of_core / f64::from(self.cores.max(1));
        let other = (self.busy - own - self.softirq.unwrap_or(0.0)).max(0.0);
        CpuLoad {
            hosts,
            cores: self.cores,
            busy_percent: self.busy,
            own_percent: own,
            softirq_percent: self.softirq,
            other_percent: other,
            testbed,
            bound_by: None,
        }
    }
}

impl CpuLoad {
    /// The load of `record`'s busiest host: on a testbed the machine its
    /// hosts share (the mean of its ends' readings, every end's threads its
    /// own);
    /// elsewhere the host with the most other work. `None` without CPU
    /// readings or with figures that are not finite.
    pub fn of_record(record: &ResultRecord) -> Option<CpuLoad> {
        let testbed = record
            .stack
            .as_ref()
            .is_some_and(|s| s.path.kind.as_deref() == Some("testbed"));
        let mut readings: Vec<Reading> = Vec::new();
        if let (Some(cpu), Some(host)) = (&record.cpu, &record.host) {
            let peer = record.peer_host.as_ref();
            let same_host = peer.is_none_or(|p| p.hostname == host.hostname);
            if same_host {
                // Both ends read one host: the busier reading, both ends'
                // threads.
                let busier = if cpu.remote.system_busy_percent > cpu.local.system_busy_percent {
                    &cpu.remote
                } else {
                    &cpu.local
                };
                readings.push(Reading {
                    host: host.hostname.clone(),
                    cores: host.cores,
                    busy: busier.system_busy_percent,
                    softirq: busier.softirq_percent,
                    own_of_core: cpu.local.process_percent + cpu.remote.process_percent,
                });
            } else {
                readings.push(Reading {
                    host: host.hostname.clone(),
                    cores: host.cores,
                    busy: cpu.local.system_busy_percent,
                    softirq: cpu.local.softirq_percent,
                    own_of_core: cpu.local.process_percent,
                });
                if let Some(p) = peer {
                    readings.push(Reading {
                        host: p.hostname.clone(),
                        cores: p.cores,
                        busy: cpu.remote.system_busy_percent,
                        softirq: cpu.remote.softirq_percent,
                        own_of_core: cpu.remote.process_percent,
                    });
                }
            }
        }
        for h in record.workload.iter().flat_map(|g| &g.hosts_cpu) {
            readings.push(Reading {
                host: h.host.clone(),
                cores: h.facts.as_ref().map_or(1, |f| f.cores),
                busy: h.cpu.system_busy_percent,
                softirq: h.cpu.softirq_percent,
                own_of_core: h.cpu.process_percent,
            });
        }
        readings.retain(|r| {
            r.busy.is_finite() && r.own_of_core.is_finite() && r.softirq.is_none_or(f64::is_finite)
        });
        if testbed {
            let mut hosts: Vec<String> = readings.iter().map(|r| r.host.clone()).collect();
            hosts.sort_unstable();
            hosts.dedup();
            // Every end read the same CPUs over about the same time: their
            // mean is the machine's, their threads all the point's own.
            let n = readings.len() as f64;
            let softirq: Option<Vec<f64>> = readings.iter().map(|r| r.softirq).collect();
            let machine = Reading {
                host: String::new(),
                cores: readings.iter().map(|r| r.cores).max()?,
                busy: readings.iter().map(|r| r.busy).sum::<f64>() / n,
                softirq: softirq.map(|v| v.iter().sum::<f64>() / n),
                own_of_core: readings.iter().map(|r| r.own_of_core).sum(),
            };
            return Some(machine.load(hosts, true));
        }
        readings
            .into_iter()
            .map(|r| {
                let host = r.host.clone();
                r.load(vec![host], false)
            })
            .max_by(|a, b| a.other_percent.total_cmp(&b.other_percent))
    }

    /// The testbed's forwarding (its softirq share) in percent of all the
    /// machine's CPUs; `None` off a testbed or without the reading.
    pub fn forwarding_percent(&self) -> Option<f64> {
        self.softirq_percent.filter(|_| self.testbed)
    }

    /// Whether the testbed's forwarding took enough of the CPUs to be named
    /// as what bound the point: [`FORWARDING_BOUND_PERCENT`] or more, and at
    /// least as much as other work.
    pub fn forwarding_named(&self) -> bool {
        self.forwarding_percent()
            .is_some_and(|f| f >= FORWARDING_BOUND_PERCENT && f >= self.other_percent)
    }

    /// Whether the CPUs were all but full ([`SATURATED_BUSY_PERCENT`]).
    pub fn saturated(&self) -> bool {
        self.busy_percent >= SATURATED_BUSY_PERCENT
    }

    /// Whose CPUs these are, for a sentence: `h1's CPUs`, or on a testbed
    /// `the testbed machine's CPUs`.
    pub fn whose_cpus(&self) -> String {
        match self.hosts.as_slice() {
            [host] if !self.testbed => format!("{host}'s CPUs"),
            _ => "the testbed machine's CPUs".to_string(),
        }
    }
}

/// The words that name the emulator as what bound a point whose testbed
/// forwarded with `forwarding_percent` of the machine's CPUs, with other
/// work's share beside it when that is worth saying too.
pub fn emulator_finding(forwarding_percent: f64, other_percent: Option<f64>) -> String {
    let other = other_percent.map_or_else(String::new, |o| format!(" (other work {o:.0}%)"));
    format!(
        "the testbed's forwarding used {forwarding_percent:.0}% of the CPUs{other}: the \
         emulator, not the links, bound this point"
    )
}

/// The remedy for a point the emulator bound: less for the one machine to
/// forward, or the stack measured across real hosts.
pub const EMULATOR_REMEDY: &str = "lower the links' rate (netgap testbed set --rate) or run \
     fewer links or flows at once, or measure across real hosts";

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use crate::cpu::CpuUsage;
    use crate::host::HostFacts;
    use crate::record::{CpuPair, HostCpu, RecordHead, WorkloadSection};
    use crate::spec::{Mode, TransportOptions};
    use crate::stack::{PathIdentity, Stack};

    fn usage(busy: f64, softirq: Option<f64>, own: f64) -> CpuUsage {
        CpuUsage {
            system_busy_percent: busy,
            process_percent: own,
            cpu_ns: 0,
            wall_ns: 0,
            softirq_percent: softirq,
        }
    }

    fn facts(name: &str) -> HostFacts {
        HostFacts {
            hostname: name.into(),
            cores: 2,
            ..HostFacts::default()
        }
    }

    fn on(r: ResultRecord, kind: &str) -> ResultRecord {
        r.with_stack(Stack::new(
            "tcp",
            Mode::Event,
            &TransportOptions::default(),
            PathIdentity {
                kind: Some(kind.into()),
                ..PathIdentity::default()
            },
            None,
        ))
    }

    fn point(local: CpuUsage, remote: CpuUsage, hosts: (&str, &str)) -> ResultRecord {
        let mut r = ResultRecord::new(RecordHead {
            test: "stream".into(),
            transport: "tcp".into(),
            mode: Mode::Event,
            size_bytes: 65536,
            metric: "bandwidth_gbps".into(),
            value: 1.0,
            time: "t".into(),
        });
        r.cpu = Some(CpuPair { local, remote });
        r.host = Some(facts(hosts.0));
        r.peer_host = Some(facts(hosts.1));
        r
    }

    fn near(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn on_a_testbed_every_end_is_the_points_own_and_softirq_is_the_forwarding() {
        // The multirail: a 2-CPU machine 99.9% busy, netgap's two
        // ends at 103% and 24% of a core, the rest forwarding.
        let r = on(
            point(
                usage(99.9, Some(33.0), 103.0),
                usage(99.5, Some(32.0), 24.0),
                ("h2", "h1"),
            ),
            "testbed",
        );
        let l = CpuLoad::of_record(&r).unwrap();
        assert_eq!(l.hosts, ["h1", "h2"]);
        assert!(l.testbed);
        assert!(near(l.own_percent, 63.5), "{l:?}");
        assert!(near(l.busy_percent, 99.7), "{l:?}");
        assert!(near(l.other_percent, 99.7 - 63.5 - 32.5), "{l:?}");
        assert_eq!(l.forwarding_percent(), Some(32.5));
        assert!(l.forwarding_named() && l.saturated());
        assert_eq!(l.whose_cpus(), "the testbed machine's CPUs");
    }

    #[test]
    fn other_work_beside_a_testbed_is_not_its_forwarding() {
        // A process spinning on both CPUs: little softirq, much other work.
        let r = on(
            point(
                usage(100.0, Some(4.0), 20.0),
                usage(100.0, Some(3.0), 10.0),
                ("h2", "h1"),
            ),
            "testbed",
        );
        let l = CpuLoad::of_record(&r).unwrap();
        assert!(near(l.other_percent, 100.0 - 15.0 - 3.5), "{l:?}");
        assert!(!l.forwarding_named());
        // Forwarding past the bar but less than the other work is not named.
        let r = on(
            point(
                usage(100.0, Some(25.0), 20.0),
                usage(100.0, Some(25.0), 10.0),
                ("h2", "h1"),
            ),
            "testbed",
        );
        let l = CpuLoad::of_record(&r).unwrap();
        assert!(l.other_percent > 25.0 && !l.forwarding_named(), "{l:?}");
    }

    #[test]
    fn off_a_testbed_softirq_is_neither_forwarding_nor_other_work() {
        // Two real hosts: each judged on its own reading.
        let r = on(
            point(
                usage(60.0, Some(30.0), 50.0),
                usage(90.0, Some(10.0), 40.0),
                ("a", "b"),
            ),
            "network",
        );
        let l = CpuLoad::of_record(&r).unwrap();
        assert_eq!(l.hosts, ["b"]);
        assert!(near(l.other_percent, 90.0 - 20.0 - 10.0), "{l:?}");
        assert_eq!(l.forwarding_percent(), None);
        assert!(!l.forwarding_named());
        assert_eq!(l.whose_cpus(), "b's CPUs");
        // Readings without the softirq share (older agents): all the rest
        // is other work, as before.
        let r = point(usage(90.0, None, 50.0), usage(90.0, None, 50.0), ("a", "a"));
        let l = CpuLoad::of_record(&r).unwrap();
        assert!(near(l.other_percent, 40.0), "{l:?}");
        // The overlap of softirq and own threads never makes other work
        // negative.
        let r = point(
            usage(50.0, Some(30.0), 60.0),
            usage(50.0, Some(30.0), 0.0),
            ("a", "a"),
        );
        assert_eq!(CpuLoad::of_record(&r).unwrap().other_percent, 0.0);
    }

    #[test]
    fn a_workload_on_a_testbed_counts_every_hosts_agent_as_its_own() {
        let host = |name: &str, role: &str, cpu: CpuUsage| HostCpu {
            host: name.into(),
            role: role.into(),
            cpu,
            peak_rss_kib: None,
            processes: None,
            facts: Some(facts(name)),
        };
        let mut r = point(usage(0.0, None, 0.0), usage(0.0, None, 0.0), ("h1", "h1"));
        r.cpu = None;
        let r = r.with_workload(WorkloadSection {
            clients: 3,
            client_hosts: Some(1),
            flows: Vec::new(),
            hosts_cpu: vec![
                host("h1", "server", usage(100.0, Some(44.0), 56.0)),
                host("h2", "client", usage(99.0, Some(43.0), 56.0)),
            ],
            links: Vec::new(),
            app: None,
        });
        let tb = CpuLoad::of_record(&on(r.clone(), "testbed")).unwrap();
        assert!(near(tb.own_percent, 56.0), "{tb:?}");
        assert!(near(tb.other_percent, 0.0), "{tb:?}");
        assert!(near(tb.softirq_percent.unwrap(), 43.5), "{tb:?}");
        assert!(tb.forwarding_named());
        let json = serde_json::to_value(&tb).unwrap();
        assert_eq!(json["testbed"], true);
        assert_eq!(json["softirq_percent"], 43.5);
        assert!(json.get("bound_by").is_none());
        let bound = CpuLoad {
            bound_by: Some(BoundBy::Emulator),
            ..tb
        };
        assert_eq!(
            serde_json::to_value(&bound).unwrap()["bound_by"],
            "emulator"
        );
        let held = CpuLoad {
            bound_by: Some(BoundBy::Shaper),
            ..bound
        };
        assert_eq!(serde_json::to_value(&held).unwrap()["bound_by"], "shaper");
        // The same readings from real hosts: each host is judged on its
        // own, and nothing is forwarding.
        let real = CpuLoad::of_record(&on(r, "network")).unwrap();
        assert!(near(real.other_percent, 100.0 - 28.0 - 44.0), "{real:?}");
        assert!(serde_json::to_value(&real)
            .unwrap()
            .get("testbed")
            .is_none());
    }
}
