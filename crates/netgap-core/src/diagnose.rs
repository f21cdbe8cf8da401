//! The diagnosis of a finished record: what the measurement layer adds to
//! a [`ResultRecord`] once its maker has filled every section it has.
//!
//! A record is plain data ([`crate::record`]); judging it needs the
//! models of [`crate::noise`] (why its repetitions vary),
//! [`crate::physics`] (what its path allows) and [`crate::load`] (where
//! its CPUs went), all of which read records. Keeping the judgement here,
//! over a record that is already whole, lets the result model stand alone:
//! reading a record back never judges it, and whoever makes one (the
//! runner, sweep, LogP, the workload and MPI runs) calls [`diagnose`] once
//! it is finished.

use crate::load::{BoundBy, CpuLoad};
use crate::noise::NoiseKind;
use crate::record::ResultRecord;

/// Judges the finished `record` and writes what was found into it: its
/// warnings, from the diagnosis of its noise
/// ([`crate::noise::diagnose_record`], which reads its repetitions, the
/// CPU of every end and placement); its physics
/// ([`crate::physics::assess`], when it has a stack), a fault adding its
/// sentence to the warnings; and the load of its CPUs
/// ([`CpuLoad::of_record`]), naming the emulator as what bound the point
/// when the noise came from the testbed's forwarding or a bandwidth below
/// its limit did ([`crate::physics::emulator_bound`], with its sentence),
/// else the shaper when a stream stayed below its limit on idle CPUs
/// ([`crate::physics::shaper_held`], with its sentence).
///
/// The warnings are replaced, not added to: a maker that adds warnings of
/// its own adds them after this call. Judging a record twice gives the
/// same record.
pub fn diagnose(record: &mut ResultRecord) {
    let noise = crate::noise::diagnose_record(record);
    if record.stack.is_some() {
        record.physics = crate::physics::assess(record);
    }
    let mut load = CpuLoad::of_record(record);
    let bound = load
        .as_ref()
        .and_then(|l| crate::physics::emulator_bound(record, l));
    let noisy_by_emulator = noise
        .as_ref()
        .is_some_and(|d| d.kind == NoiseKind::Emulator);
    let by_emulator = noisy_by_emulator || bound.is_some();
    // The emulator, when named, is the one finding.
    let held = load
        .as_ref()
        .filter(|_| !by_emulator)
        .and_then(|l| crate::physics::shaper_held(record, l));
    if let Some(l) = load.as_mut() {
        l.bound_by = if by_emulator {
            Some(BoundBy::Emulator)
        } else {
            held.map(|_| BoundBy::Shaper)
        };
    }
    record.cpu_load = load;
    record.warnings = noise.map(|d| d.sentence).into_iter().collect();
    // A noisy point whose noise named the emulator says it once.
    if let Some(b) = bound.filter(|_| !noisy_by_emulator) {
        let sentence = crate::physics::bound_sentence(record, &b);
        record.warnings.push(sentence);
    }
    if let Some(h) = held {
        let sentence = crate::physics::held_sentence(record, &h);
        record.warnings.push(sentence);
    }
    if let Some(f) = record.fault() {
        let sentence = crate::physics::fault_sentence(record, f);
        record.warnings.push(sentence);
    }
    let past = record.physics.as_ref().and_then(|p| {
        Some(crate::physics::past_forwarding_sentence(
            record,
            p.payload_limit_gbps?,
            p.past_forwarding_gbps?,
        ))
    });
    record.warnings.extend(past);
}

/// Judges the physics of a record read back from a file again, by this
/// netgap's model: for readers that set records of several versions side
/// by side (the report, `compare`), so a record from an older netgap (one
/// without a physics section), or one edited, past its path's limit is a
/// fault there too. A fault adds its sentence to the warnings unless the
/// record says it already. Nothing else is judged again: the record's own
/// warnings and CPU load stand as its maker wrote them. A record without a
/// stack is left as it is.
pub fn reassess_physics(record: &mut ResultRecord) {
    if record.stack.is_none() {
        return;
    }
    record.physics = crate::physics::assess(record);
    if let Some(f) = record.fault() {
        let sentence = crate::physics::fault_sentence(record, f);
        if !record.warnings.contains(&sentence) {
            record.warnings.push(sentence);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::head;
    use crate::record::RecordHead;
    use crate::spec::{Mode, TransportOptions};
    use crate::stack::{PathIdentity, Stack};

    fn diagnosed(mut r: ResultRecord) -> ResultRecord {
        diagnose(&mut r);
        r
    }

    #[test]
    fn the_stack_brings_the_physics_section_with_its_limit_or_null() {
        let plain = serde_json::to_value(diagnosed(ResultRecord::new(head()))).expect("encoded");
        assert!(plain.get("physics").is_none(), "{plain}");
        let stack = |path: PathIdentity| {
            Stack::new("tcp", Mode::Event, &TransportOptions::default(), path, None)
                .with_framing(Some(crate::framing::Framing::Tcp))
        };
        let loopback = diagnosed(ResultRecord::new(head()).with_stack(stack(PathIdentity {
            kind: Some("loopback".into()),
            mtu_bytes: Some(65536),
            ..PathIdentity::default()
        })));
        let json = serde_json::to_value(&loopback).expect("encoded");
        assert_eq!(
            json["physics"],
            serde_json::json!({"payload_limit_gbps": null})
        );
        let shaped = diagnosed(
            ResultRecord::new(RecordHead {
                test: "stream".into(),
                value: 2.0,
                ..head()
            })
            .with_stack(stack(PathIdentity {
                kind: Some("testbed".into()),
                mtu_bytes: Some(1500),
                rate_bps: Some(1_000_000_000),
                bucket_bytes: Some(65536),
                ..PathIdentity::default()
            })),
        );
        let json = serde_json::to_value(&shaped).expect("encoded");
        assert_eq!(json["stack"]["path"]["bucket_bytes"], 65536);
        assert_eq!(json["physics"]["fault"]["kind"], "above_payload_limit");
        assert_eq!(json["physics"]["fault"]["value"], 2.0);
        assert_eq!(shaped.warnings.len(), 1, "{:?}", shaped.warnings);
        let back: ResultRecord = serde_json::from_value(json).expect("decoded");
        assert_eq!(back, shaped);
        // Reading a record back never judges it: what was written is what
        // is read, and judging it again changes nothing.
        assert_eq!(diagnosed(back), shaped);
    }

    /// The result model stands alone: the record module names none of the
    /// modules that judge records, so reading one needs no judgement.
    #[test]
    fn the_record_module_imports_no_diagnosis() {
        let source = include_str!("record.rs");
        for module in ["physics", "noise", "load", "diagnose"] {
            assert!(
                !source.contains(&format!("crate::{module}")),
                "record.rs names crate::{module}"
            );
        }
    }
}
