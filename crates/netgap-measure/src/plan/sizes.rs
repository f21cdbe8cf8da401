//! The points of a run at its sizes: each size checked against the range
//! every test accepts and against what each transport carries, the sizes a
//! transport cannot carry left out of its points ([`SkippedSizes`]).

use super::{PlanError, Settings, Sizes};
use crate::bench;
use netgap_core::spec::{check_size, PointSpec};
use netgap_core::units::format_size;

/// The sizes of a run over several transports that one of them cannot
/// carry: left out of that transport's points, and said in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSizes {
    /// The transport.
    pub transport: String,
    /// The largest message it carries, in bytes.
    pub max_bytes: u64,
    /// The sizes left out, in bytes, in the order given.
    pub sizes_bytes: Vec<u64>,
}

impl std::fmt::Display for SkippedSizes {
    /// `udp carries at most 65507 bytes a message: skipping 1M, 4M`; a
    /// sweep's many sizes as their count and range.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const LISTED: usize = 4;
        let sizes = match (self.sizes_bytes.first(), self.sizes_bytes.last()) {
            (Some(&first), Some(&last)) if self.sizes_bytes.len() > LISTED => format!(
                "its {} sizes from {} to {}",
                self.sizes_bytes.len(),
                format_size(first),
                format_size(last)
            ),
            _ => self
                .sizes_bytes
                .iter()
                .map(|&s| format_size(s))
                .collect::<Vec<_>>()
                .join(", "),
        };
        write!(
            f,
            "{} carries at most {} bytes a message: skipping {sizes}",
            self.transport, self.max_bytes
        )
    }
}

impl Settings {
    /// The points of `tests` at `sizes` over every stack, test-major, each
    /// checked as the protocol will check it. A size that some transports
    /// carry and others do not is left out of those others' points (and
    /// listed in what is returned beside them); a size no transport of the
    /// run carries is refused.
    pub(crate) fn points(
        &self,
        tests: &[&'static dyn bench::Test],
        sizes: &Sizes,
    ) -> Result<(Vec<PointSpec>, Vec<SkippedSizes>), PlanError> {
        for &s in &sizes.bytes {
            check_size(s).map_err(|_| PlanError::SizeOutOfRange {
                flag: sizes.flag,
                size_bytes: s,
                max: format_size(netgap_core::spec::MAX_SIZE_BYTES),
            })?;
            let carried = self
                .stacks
                .transports
                .iter()
                .any(|t| t.max_message_bytes().is_none_or(|max| s <= max));
            if !carried {
                self.stacks.check_size(s, sizes.flag)?;
            }
        }
        let mut skipped: Vec<SkippedSizes> = Vec::new();
        for tr in &self.stacks.transports {
            let Some(max_bytes) = tr.max_message_bytes() else {
                continue;
            };
            let over: Vec<u64> = sizes
                .bytes
                .iter()
                .copied()
                .filter(|&s| s > max_bytes)
                .collect();
            if !over.is_empty() {
                skipped.push(SkippedSizes {
                    transport: tr.name().to_string(),
                    max_bytes,
                    sizes_bytes: over,
                });
            }
        }
        let mut points = Vec::new();
        for t in tests {
            for tr in &self.stacks.transports {
                for &mode in &self.stacks.modes {
                    if !tr.capabilities().modes.contains(&mode) {
                        return Err(PlanError::NoMode {
                            transport: tr.name().to_string(),
                            mode,
                        });
                    }
                    for &size in &sizes.bytes {
                        if tr.max_message_bytes().is_some_and(|max| size > max) {
                            continue;
                        }
                        let point = self.point(t.name(), tr.name(), mode, size);
                        point.validate()?;
                        points.push(point);
                    }
                }
            }
        }
        Ok((points, skipped))
    }

    /// Refuses a size out of range or above what the stacks carry, naming
    /// `--sizes`.
    pub fn check_sizes(&self, sizes_bytes: &[u64]) -> Result<(), PlanError> {
        for &s in sizes_bytes {
            self.stacks.check_size(s, "--sizes")?;
        }
        Ok(())
    }
}
