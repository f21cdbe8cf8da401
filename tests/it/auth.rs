//! Shared-key authentication and agent limits, end to end: the real binary
//! as agent and coordinator on loopback, and hand-made handshakes (a wrong
//! key, a replayed proof, clients that never authenticate) against it.

use crate::common;
use crate::common::{netgap, new_key_file as key_file, AgentProc as Agent};
use netgap::control::{Connect, ControlAddr, ControlConn};
use netgap::proto::auth::{AuthFrame, CoordinatorHandshake, Key};
use netgap::proto::codec::decode_reply;
use netgap::proto::message::Reply;
use serde_json::Value;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn read_key(path: &Path) -> Key {
    Key::from_bytes(std::fs::read(path).expect("key")).expect("a valid key")
}

/// Runs one pingpong point against `agent` with `key`; its output.
fn run_point(agent: &Agent, key: Option<&Path>, json: &Path, size: &str) -> std::process::Output {
    let mut cmd = netgap();
    cmd.args(["run", "pingpong", "--peer", &agent.addr, "-s", size])
        .args(["--reps", "2", "-n", "50", "--json"])
        .arg(json);
    if let Some(k) = key {
        cmd.arg("--key").arg(k);
    }
    cmd.output().expect("netgap run")
}

#[test]
fn the_right_key_runs_and_every_mismatch_is_one_clear_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = key_file(dir.path(), "key");
    let other = key_file(dir.path(), "other");
    let agent = Agent::start_with("127.0.0.1", &["--key", key.to_str().expect("utf8")]);
    let json = dir.path().join("r.jsonl");

    let out = run_point(&agent, Some(&key), &json, "64");
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&json).expect("results");
    let rec: Value = serde_json::from_str(text.lines().next().expect("a record")).expect("json");
    assert!(rec["bytes"]["client_tx"].as_u64().unwrap_or(0) >= 50 * 64);

    common::one_line_error(
        &run_point(&agent, Some(&other), &json, "64"),
        "netgap",
        "key does not match",
    );
    common::one_line_error(
        &run_point(&agent, None, &json, "64"),
        "netgap",
        "requires a shared key",
    );

    // The failed attempts took no capacity: the right key still runs.
    let out = run_point(&agent, Some(&key), &json, "64");
    assert!(out.status.success(), "{out:?}");

    // A keyless agent tells a keyed coordinator so.
    let keyless = Agent::start_with("127.0.0.1", &[]);
    common::one_line_error(
        &run_point(&keyless, Some(&key), &json, "64"),
        "netgap",
        "runs without a key",
    );
}

#[test]
fn key_files_readable_by_others_or_too_short_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = key_file(dir.path(), "key");
    assert_eq!(
        std::fs::metadata(&key).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    let out = netgap()
        .args(["serve", "--port", "0", "--key"])
        .arg(&key)
        .output()
        .expect("serve");
    common::one_line_error(&out, "netgap", "chmod 600");
    let short = dir.path().join("short");
    std::fs::write(&short, b"tiny").expect("write");
    std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let out = netgap()
        .args(["serve", "--port", "0", "--key"])
        .arg(&short)
        .output()
        .expect("serve");
    common::one_line_error(&out, "netgap", "16 to 4096 bytes");
    // `key new` never overwrites.
    let out = netgap()
        .args(["key", "new"])
        .arg(&key)
        .output()
        .expect("key");
    assert!(!out.status.success());
}

#[test]
fn an_agent_on_a_non_loopback_address_without_a_key_refuses_to_start() {
    for bind in ["0.0.0.0", "::"] {
        let out = netgap()
            .args(["serve", "--port", "0", "--bind", bind])
            .output()
            .expect("serve");
        common::one_line_error(&out, "netgap", "without --key");
    }
}

/// Connects a raw control connection to `agent` and reads its challenge.
fn raw_challenge(agent: &Agent) -> (ControlConn, Vec<u8>) {
    let addr = ControlAddr::parse(&agent.addr).expect("addr");
    let stream = addr.connect(Duration::from_secs(2)).expect("connect");
    let mut conn = ControlConn::new(stream).expect("conn");
    let challenge = conn
        .recv_payload(Duration::from_secs(2))
        .expect("challenge");
    (conn, challenge)
}

#[test]
fn a_replayed_proof_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_path = key_file(dir.path(), "key");
    let key = read_key(&key_path);
    let agent = Agent::start_with("127.0.0.1", &["--key", key_path.to_str().expect("utf8")]);

    // A real handshake; an eavesdropper records the coordinator's response.
    let (mut conn, challenge) = raw_challenge(&agent);
    let mut hs = CoordinatorHandshake::new(key.clone(), [7; 32]);
    conn.send_payload(&hs.begin()).expect("begin");
    let recorded = hs.on_challenge(&challenge).expect("response");
    conn.send_payload(&recorded).expect("response");
    let proof = conn.recv_payload(Duration::from_secs(2)).expect("proof");
    assert_eq!(hs.on_proof(&proof), Ok(()));
    drop(conn);

    // Replayed on a new connection, it answers a stale nonce.
    let (mut conn, challenge2) = raw_challenge(&agent);
    assert_ne!(challenge, challenge2, "every session gets a fresh nonce");
    conn.send_payload(&AuthFrame::Begin.encode())
        .expect("begin");
    conn.send_payload(&recorded).expect("replay");
    let reply = conn.recv_payload(Duration::from_secs(2)).expect("reply");
    match decode_reply(&reply) {
        Ok(Reply::Error { message }) => assert!(message.contains("does not match"), "{message}"),
        other => panic!("expected an error reply, got {other:?}"),
    }
    assert!(
        conn.recv_payload(Duration::from_secs(2)).is_err(),
        "the agent closes after a failed proof"
    );
}

#[test]
fn a_wrong_key_gets_no_request_parsed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_path = key_file(dir.path(), "key");
    let agent = Agent::start_with("127.0.0.1", &["--key", key_path.to_str().expect("utf8")]);
    let wrong = Key::from_bytes(vec![9; 32]).expect("key");
    let (mut conn, challenge) = raw_challenge(&agent);
    let mut hs = CoordinatorHandshake::new(wrong, [1; 32]);
    conn.send_payload(&hs.begin()).expect("begin");
    conn.send_payload(&hs.on_challenge(&challenge).expect("response"))
        .expect("send");
    // Right behind the bad proof, a request with an out-of-range parameter:
    // were it parsed, the agent would name the parameter.
    let bad = br#"{"run":{"iterations":0,"phase":"measure"}}"#;
    let _ = conn.send_payload(bad);
    let reply = conn.recv_payload(Duration::from_secs(2)).expect("reply");
    match decode_reply(&reply) {
        Ok(Reply::Error { message }) => {
            assert!(message.contains("does not match"), "{message}");
            assert!(!message.contains("iterations"), "{message}");
        }
        other => panic!("expected an error reply, got {other:?}"),
    }
    assert!(conn.recv_payload(Duration::from_secs(2)).is_err());
}

#[test]
fn clients_that_never_authenticate_hold_no_capacity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = key_file(dir.path(), "key");
    let agent = Agent::start_with("127.0.0.1", &["--key", key.to_str().expect("utf8")]);
    // More silent connections than the agent shakes hands with at once.
    let idle: Vec<TcpStream> = (0..netgap::agent::MAX_HANDSHAKES + 4)
        .map(|_| TcpStream::connect(&agent.addr).expect("connect"))
        .collect();
    // They expire after the handshake deadline; then the right key runs.
    std::thread::sleep(netgap::agent::HANDSHAKE_TIMEOUT + Duration::from_millis(500));
    let t0 = Instant::now();
    let json = dir.path().join("r.jsonl");
    let out = run_point(&agent, Some(&key), &json, "1");
    assert!(out.status.success(), "{out:?}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    drop(idle);
    // A few silent connections at once never block a real client.
    let _few: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&agent.addr).expect("connect"))
        .collect();
    let out = run_point(&agent, Some(&key), &json, "1");
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn requests_past_the_agent_limits_are_refused_before_any_data_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = key_file(dir.path(), "key");
    let agent = Agent::start_with(
        "127.0.0.1",
        &[
            "--key",
            key.to_str().expect("utf8"),
            "--max-message",
            "1K",
            "--max-duration",
            "1s",
            "--max-rate",
            "0.001",
        ],
    );
    let json = dir.path().join("r.jsonl");
    common::one_line_error(
        &run_point(&agent, Some(&key), &json, "64K"),
        "netgap",
        "limits",
    );
    // 0.001 Gbit/s for 1 s is 125,000 bytes: 50 x 1 KiB fits, a long
    // calibrated run does not.
    let out = run_point(&agent, Some(&key), &json, "1K");
    assert!(out.status.success(), "{out:?}");
    let out = netgap()
        .args(["run", "pingpong", "--peer", &agent.addr, "-s", "1K"])
        .args(["--reps", "2", "-n", "1000000", "--key"])
        .arg(&key)
        .output()
        .expect("run");
    common::one_line_error(&out, "netgap", "limits");
    let out = netgap()
        .args(["serve", "--port", "0", "--max-flows", "0"])
        .output()
        .expect("serve");
    common::one_line_error(&out, "netgap", "--max-flows");
}

#[test]
fn an_agent_serves_on_a_unix_socket_and_never_replaces_another_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("agent.sock");
    let mut child = netgap()
        .args(["serve", "--bind"])
        .arg(format!("unix:{}", sock.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent");
    // The agent says where it listens once it does: the socket's file
    // exists a moment before (between bind and listen), when a connection
    // is still refused.
    assert_eq!(
        crate::common::agent_addr(&mut child),
        format!("unix:{}", sock.display())
    );
    let json = dir.path().join("r.jsonl");
    let out = netgap()
        .args([
            "run",
            "pingpong,stream",
            "-s",
            "1K",
            "--reps",
            "2",
            "-n",
            "50",
        ])
        .arg("--peer")
        .arg(format!("unix:{}", sock.display()))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run");
    let _ = child.kill();
    let _ = child.wait();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&json).expect("results");
    assert_eq!(text.lines().count(), 2);
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the control socket is the owner's only");

    let file = dir.path().join("precious");
    std::fs::write(&file, b"keep me").expect("write");
    let out = netgap()
        .args(["serve", "--bind"])
        .arg(format!("unix:{}", file.display()))
        .output()
        .expect("serve");
    common::one_line_error(&out, "netgap", "cannot listen");
    assert_eq!(std::fs::read(&file).expect("still there"), b"keep me");
}
