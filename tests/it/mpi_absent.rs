//! A netgap built without the `mpi` feature (the default build) knows the
//! MPI tests, says in `netgap list` that MPI is not built in, and refuses
//! to run them in one line that says how to get them.

use crate::common::{fails_with_one_line, netgap, ok};

#[test]
fn without_the_mpi_feature_list_says_so_and_runs_are_refused() {
    let out = ok(netgap().arg("list").output().expect("runs"));
    assert!(out.contains("mpi-latency"), "{out}");
    assert!(
        out.contains("MPI: not available: this netgap was built without MPI"),
        "{out}"
    );
    fails_with_one_line(&["run", "mpi-latency", "-s", "1"], "--features mpi");
    fails_with_one_line(
        &[
            "mpi-rank",
            "--points",
            "mpi-latency:1",
            "--reps",
            "1",
            "--iterations",
            "1",
        ],
        "built without MPI",
    );
}
