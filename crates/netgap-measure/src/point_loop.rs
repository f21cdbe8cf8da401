//! The one loop every command measures its points through: tell the
//! observer a point starts, measure it, write each record it gives to every
//! sink the moment it exists, and tell the observer it is done.
//!
//! `run`, `sweep`, `logp` and the workloads differ only in how they
//! measure a point (a sweep measures a suspect point again, LogP turns one
//! measurement into one parameter, a workload point drives several
//! agents); that is the closure they hand to [`run_points`]. Writing,
//! observing and counting happen here once, so an interrupted run of any
//! command keeps every record it measured.

use crate::sink::RecordSink;
use netgap_core::record::ResultRecord;
use netgap_core::spec::PointSpec;
use std::io;

/// Follows a run as it goes: the table, the progress bar.
pub trait Observer {
    /// A point is about to be measured; `index` counts from 0 of `total`.
    fn point_started(&mut self, _spec: &PointSpec, _index: usize, _total: usize) {}
    /// A measured repetition of the current point finished.
    fn rep_done(&mut self, _rep: u32) {}
    /// A record was measured and written to every sink.
    fn point_done(&mut self, _record: &ResultRecord) {}
}

/// A results file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing {path}: {source}")]
pub struct SinkError {
    /// The file.
    pub path: String,
    /// Underlying error.
    pub source: io::Error,
}

/// Writes `record` to every sink, in order; the first failure stops it.
pub(crate) fn write_to_sinks(
    sinks: &mut [Box<dyn RecordSink>],
    record: &ResultRecord,
) -> Result<(), SinkError> {
    for sink in sinks.iter_mut() {
        sink.append(record).map_err(|source| SinkError {
            path: sink.path().display().to_string(),
            source,
        })?;
    }
    Ok(())
}

/// Measures every point in order through `measure`, which returns the
/// point's records (none for a point it skips). Each record goes to every
/// sink and then to the observer as soon as `measure` returns it. Returns
/// how many records were written; on the first error, every record before it
/// is already in the sinks.
pub fn run_points<P, E>(
    points: &[P],
    spec_of: impl Fn(&P) -> &PointSpec,
    sinks: &mut [Box<dyn RecordSink>],
    observer: &mut dyn Observer,
    mut measure: impl FnMut(&P, &mut dyn Observer) -> Result<Vec<ResultRecord>, E>,
) -> Result<usize, E>
where
    E: From<SinkError>,
{
    let total = points.len();
    let mut written = 0;
    for (index, point) in points.iter().enumerate() {
        observer.point_started(spec_of(point), index, total);
        for record in measure(point, observer)? {
            write_to_sinks(sinks, &record)?;
            written += 1;
            observer.point_done(&record);
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::record;
    use std::path::{Path, PathBuf};

    /// A sink that keeps what it is given, or fails on the `fail_at`-th
    /// record.
    struct Memory {
        kept: Vec<f64>,
        fail_at: Option<usize>,
        path: PathBuf,
    }

    impl RecordSink for Memory {
        fn append(&mut self, record: &ResultRecord) -> io::Result<()> {
            if self.fail_at == Some(self.kept.len()) {
                return Err(io::Error::other("disk full"));
            }
            self.kept.push(record.value);
            Ok(())
        }
        fn path(&self) -> &Path {
            &self.path
        }
    }

    #[derive(Default)]
    struct Counting {
        started: Vec<usize>,
        done: usize,
    }

    impl Observer for Counting {
        fn point_started(&mut self, _spec: &PointSpec, index: usize, _total: usize) {
            self.started.push(index);
        }
        fn point_done(&mut self, _record: &ResultRecord) {
            self.done += 1;
        }
    }

    /// An observer that ignores everything.
    struct Quiet;

    impl Observer for Quiet {}

    #[derive(Debug, thiserror::Error)]
    enum Failure {
        #[error("point {0} failed")]
        Point(usize),
        #[error(transparent)]
        Sink(#[from] SinkError),
    }

    fn spec() -> PointSpec {
        PointSpec {
            test: "pingpong".into(),
            transport: "tcp".into(),
            mode: netgap_core::spec::Mode::Event,
            size_bytes: 1,
            options: Default::default(),
            server_cpu: None,
            io_timeout_ms: 1000,
            verify: false,
        }
    }

    #[test]
    fn every_record_reaches_every_sink_and_the_observer_in_order() {
        let points = [(spec(), 1.0), (spec(), 2.0), (spec(), 3.0)];
        let mut sinks: Vec<Box<dyn RecordSink>> = vec![
            Box::new(Memory {
                kept: Vec::new(),
                fail_at: None,
                path: "a".into(),
            }),
            Box::new(Memory {
                kept: Vec::new(),
                fail_at: None,
                path: "b".into(),
            }),
        ];
        let mut seen = Counting::default();
        // The second point gives two records, the third none.
        let written = run_points(
            &points,
            |p| &p.0,
            &mut sinks,
            &mut seen,
            |&(_, p), _| -> Result<_, Failure> {
                Ok(match p as u32 {
                    2 => vec![record(2.0), record(2.5)],
                    3 => vec![],
                    _ => vec![record(p)],
                })
            },
        )
        .expect("runs");
        assert_eq!(written, 3);
        assert_eq!(seen.started, vec![0, 1, 2]);
        assert_eq!(seen.done, 3);
    }

    #[test]
    fn a_failed_point_keeps_the_records_before_it() {
        let points = [(spec(), 1.0), (spec(), 2.0), (spec(), 3.0)];
        let mut sinks: Vec<Box<dyn RecordSink>> = vec![Box::new(Memory {
            kept: Vec::new(),
            fail_at: None,
            path: "a".into(),
        })];
        let mut seen = Counting::default();
        let err = run_points(
            &points,
            |p| &p.0,
            &mut sinks,
            &mut seen,
            |&(_, p), _| {
                if p == 2.0 {
                    Err(Failure::Point(2))
                } else {
                    Ok(vec![record(p)])
                }
            },
        )
        .expect_err("fails");
        assert_eq!(err.to_string(), "point 2 failed");
        assert_eq!(seen.done, 1);
    }

    #[test]
    fn a_sink_that_fails_names_its_file_and_stops_the_run() {
        let points = [(spec(), 1.0), (spec(), 2.0)];
        let mut sinks: Vec<Box<dyn RecordSink>> = vec![Box::new(Memory {
            kept: Vec::new(),
            fail_at: Some(1),
            path: "full.jsonl".into(),
        })];
        let err = run_points(
            &points,
            |p| &p.0,
            &mut sinks,
            &mut Quiet,
            |&(_, p), _| -> Result<_, Failure> { Ok(vec![record(p)]) },
        )
        .expect_err("fails");
        assert!(
            err.to_string().contains("full.jsonl") && err.to_string().contains("disk full"),
            "{err}"
        );
    }
}
