//! A results file (JSON Lines) as `report` and `compare` read it: any
//! bytes, torn lines included, load as records or one error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    // The loader reads a path; a file on tmpfs costs no disk.
    let path = std::env::temp_dir().join(format!("netgap-fuzz-records-{}", std::process::id()));
    let Ok(mut f) = std::fs::File::create(&path) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    let _ = netgap_report::load::load_file(&path);
    // libFuzzer ends the process without unwinding: nothing is left behind
    // only if every input's file goes as soon as it is read.
    let _ = std::fs::remove_file(&path);
    if let Ok(text) = std::str::from_utf8(data) {
        for line in text.lines() {
            let _ = serde_json::from_str::<netgap_core::record::ResultRecord>(line);
        }
    }
});
