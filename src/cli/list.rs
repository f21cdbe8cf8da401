//! `netgap list`: the tests, workloads, MPI tests, transports and their
//! options, and the importers, with what is available on this host.

use netgap::{bench, transport};

/// `netgap list`.
pub(crate) fn list() {
    println!("tests:");
    for t in bench::registry() {
        println!(
            "  {:<14} {:<15} {}",
            t.name(),
            t.metric().key(),
            t.summary()
        );
    }
    println!();
    println!("workloads (--hosts, --clients, -P, --duration):");
    for t in netgap::workload::registry() {
        println!(
            "  {:<14} {:<17} {}",
            t.name(),
            t.metric().key(),
            t.summary()
        );
    }
    println!();
    println!("MPI tests (mpirun, two ranks; records name test pingpong, stream, bibw over transport mpi):");
    for t in netgap::mpi::MpiTest::ALL {
        println!(
            "  {:<14} {:<15} {}",
            t.name(),
            t.metric().key(),
            t.summary()
        );
    }
    match netgap::mpi::availability() {
        Ok(()) => println!("  MPI: built in, mpirun found"),
        Err(why) => println!("  MPI: not available: {why}"),
    }
    println!();
    println!("transports:");
    println!("  name     available  reliable  msg-bound  cross-host  modes       max-msg");
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut unavailable = Vec::new();
    for t in transport::registry() {
        let c = t.capabilities();
        let avail = match t.availability() {
            Ok(()) => "yes",
            Err(why) => {
                unavailable.push(format!("{}: {why}", t.name()));
                "no"
            }
        };
        let modes = c
            .modes
            .iter()
            .map(|m| m.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let max_msg = t
            .max_message_bytes()
            .map_or_else(|| "-".to_string(), |b| b.to_string());
        let row = format!(
            "  {:<8} {:<10} {:<9} {:<10} {:<11} {:<11} {}",
            t.name(),
            avail,
            yes(c.reliable),
            yes(c.message_boundaries),
            yes(c.cross_host),
            modes,
            max_msg,
        );
        println!("{}", row.trim_end());
    }
    println!();
    for t in transport::registry() {
        println!("  {:<8} {}", t.name(), t.summary());
    }
    println!();
    println!("transport options:");
    for o in transport::options::all() {
        let flag = format!("{} {}", o.long(), o.value_name);
        println!(
            "  {:<20} {:<22} {}",
            flag.trim_end(),
            transport::options::transports_taking(o).join(","),
            o.help
        );
    }
    for line in unavailable {
        println!("  not available here: {line}");
    }
    println!();
    println!("peer tools' output (netgap import FORMAT FILE):");
    for i in netgap::import::registry() {
        println!("  {:<8} {}", i.name(), i.summary());
    }
}
