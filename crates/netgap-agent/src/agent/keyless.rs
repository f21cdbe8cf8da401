//! What an agent without a key refuses: anyone on the host can drive it,
//! so its data stays on loopback.

use std::net::SocketAddr;

/// Refuses, on an agent without a key, a role that would listen or send
/// beyond loopback: anyone on the host can drive such an agent, so its
/// data stays on the host.
pub(crate) fn keyless_stays_on_loopback(
    keyed: bool,
    spec: &netgap_proto::workload::WorkloadSpec,
) -> Result<(), netgap_proto::limits::LimitError> {
    if keyed {
        return Ok(());
    }
    let targets = spec
        .targets
        .iter()
        .filter_map(|t| t.parse::<std::net::SocketAddr>().ok().map(|a| a.ip()));
    let ips = spec.listen_ips.iter().chain(&spec.bind_ips).copied();
    // A staged role connects to the addresses of the roles before it
    // (`workload::place::Staged`), in its parameters.
    let staged = spec
        .params
        .get("staged")
        .and_then(|s| s.get("peers"))
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_array)
        .flatten()
        .filter_map(|a| a.as_str()?.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.ip());
    match targets
        .chain(ips)
        .chain(staged)
        .find(|ip| !ip.is_loopback())
    {
        Some(ip) => Err(netgap_proto::limits::LimitError(format!(
            "{ip} is not a loopback address; an agent without --key keeps its data on loopback"
        ))),
        None => Ok(()),
    }
}

/// Refuses, on an agent without a key, a client role whose server is
/// beyond loopback, as [`keyless_stays_on_loopback`] does a workload's.
pub(crate) fn keyless_targets_loopback(
    keyed: bool,
    target: &str,
) -> Result<(), netgap_proto::limits::LimitError> {
    match target.parse::<SocketAddr>() {
        Ok(a) if !keyed && !a.ip().is_loopback() => Err(netgap_proto::limits::LimitError(format!(
            "{} is not a loopback address; an agent without --key keeps its data on loopback",
            a.ip()
        ))),
        _ => Ok(()),
    }
}
