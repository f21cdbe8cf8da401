//! The stacks of a run: transports looked up and available here, the
//! completion modes, the transport options each transport honours, and the
//! message buffers' layout (`--align`, `--offset`).

use super::{invalid, BufferFlags, PlanError, TransportChoice};
use crate::bench;
use netgap_core::spec::{check_size, Mode, TransportOptions};
use netgap_core::units::format_size;
use netgap_transport as transport;

/// The transports, modes and options of a run, validated: each transport
/// is available here and honours every option given.
#[derive(Clone)]
pub struct Stacks {
    /// The transports, in the order given.
    pub transports: Vec<&'static dyn transport::Transport>,
    /// The completion modes, in the order given.
    pub modes: Vec<Mode>,
    /// The options as both ends apply them.
    pub options: TransportOptions,
}

impl std::fmt::Debug for Stacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.transports.iter().map(|t| t.name()).collect();
        f.debug_struct("Stacks")
            .field("transports", &names)
            .field("modes", &self.modes)
            .field("options", &self.options)
            .finish()
    }
}

impl Stacks {
    /// The transports and options of a choice, looked up, available here
    /// and honouring every option given.
    pub(super) fn validate(c: &TransportChoice) -> Result<Stacks, PlanError> {
        let transports = transports_of(c)?;
        if c.modes.is_empty() {
            return Err(PlanError::Empty {
                what: "mode",
                hint: "use event or poll",
            });
        }
        Ok(Stacks {
            options: options_of(c, &transports)?,
            transports,
            modes: c.modes.clone(),
        })
    }

    /// Refuses a size out of the range every test accepts or above what a
    /// transport carries, naming the flag that gave it.
    pub(crate) fn check_size(&self, size_bytes: u64, flag: &'static str) -> Result<(), PlanError> {
        check_size(size_bytes).map_err(|_| PlanError::SizeOutOfRange {
            flag,
            size_bytes,
            max: format_size(netgap_core::spec::MAX_SIZE_BYTES),
        })?;
        self.check_size_on(size_bytes, flag, self.transports.iter().copied())
    }

    /// Refuses a size above what one of `transports` carries.
    pub(crate) fn check_size_on<'t>(
        &self,
        size_bytes: u64,
        flag: &'static str,
        transports: impl IntoIterator<Item = &'t dyn transport::Transport>,
    ) -> Result<(), PlanError> {
        for t in transports {
            let max = t.max_message_bytes().unwrap_or(u64::MAX);
            if size_bytes > max {
                return Err(PlanError::TooLarge {
                    flag,
                    size: format_size(size_bytes),
                    transport: t.name().to_string(),
                    max_bytes: max,
                });
            }
        }
        Ok(())
    }
}

/// `--align` and `--offset`, checked: the alignment a power of two up to
/// 1 GiB, the offset below it (below this host's page without `--align`).
/// An alignment equal to the default is still recorded: the user asked
/// for it by name.
pub(super) fn buffer_layout_of(b: BufferFlags) -> Result<(Option<u32>, u32), PlanError> {
    use netgap_core::spec::MAX_BUFFER_ALIGN_BYTES;
    let align = match b.align_bytes {
        None => None,
        Some(a) if !a.is_power_of_two() || a > u64::from(MAX_BUFFER_ALIGN_BYTES) => {
            return Err(invalid(
                "--align",
                a,
                format!("must be a power of two from 1 to {MAX_BUFFER_ALIGN_BYTES} bytes"),
            ))
        }
        Some(a) => Some(a as u32),
    };
    let limit = align.map_or(netgap_transport::buffer::page_bytes() as u64, u64::from);
    let offset = b.offset_bytes.unwrap_or(0);
    if offset >= limit {
        let of = if align.is_some() {
            "--align"
        } else {
            "the page size; --align sets a larger one"
        };
        return Err(invalid(
            "--offset",
            offset,
            format!("must be below the alignment, {limit} bytes ({of})"),
        ));
    }
    Ok((align, offset as u32))
}

/// The transports of a request, looked up and available here.
pub(crate) fn transports_of(
    c: &TransportChoice,
) -> Result<Vec<&'static dyn transport::Transport>, PlanError> {
    let mut out = Vec::new();
    for name in &c.transports {
        let t = transport::find(name).ok_or_else(|| PlanError::UnknownTransport {
            name: name.clone(),
            available: transport::names(),
        })?;
        if let Err(why) = t.availability() {
            return Err(PlanError::Unavailable {
                name: name.clone(),
                why,
            });
        }
        out.push(t);
    }
    if out.is_empty() {
        return Err(PlanError::Empty {
            what: "transport",
            hint: "see `netgap list`",
        });
    }
    Ok(out)
}

/// The point-to-point tests named, looked up; at least one.
pub(crate) fn bench_tests(names: &[String]) -> Result<Vec<&'static dyn bench::Test>, PlanError> {
    let mut tests = Vec::new();
    for name in names {
        tests.push(bench::find(name).ok_or_else(|| PlanError::UnknownTest {
            name: name.clone(),
            available: bench::names(),
        })?);
    }
    if tests.is_empty() {
        return Err(PlanError::Empty {
            what: "test",
            hint: "see `netgap list`",
        });
    }
    Ok(tests)
}

/// The options of a request as both ends apply them and results record
/// them; an option a chosen transport does not honour is refused.
pub(crate) fn options_of(
    c: &TransportChoice,
    transports: &[&'static dyn transport::Transport],
) -> Result<TransportOptions, PlanError> {
    let mut options = TransportOptions::default();
    for s in &c.options {
        for tr in transports {
            let honoured = tr.capabilities().options;
            if !honoured.contains(&s.decl) {
                let takes = if honoured.is_empty() {
                    "it takes no options".to_string()
                } else {
                    let list: Vec<String> = honoured.iter().map(|o| o.long()).collect();
                    format!("it takes {}", list.join(", "))
                };
                return Err(PlanError::OptionNotTaken {
                    flag: s.decl.long(),
                    transport: tr.name().to_string(),
                    takes,
                });
            }
        }
        s.decl.apply_value(&mut options, &s.value)?;
    }
    Ok(options)
}
