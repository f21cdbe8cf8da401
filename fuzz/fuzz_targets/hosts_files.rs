//! A hosts file (`--hosts FILE`) and a `--hosts` list as a user or a tool
//! may write them: parsed and checked, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_measure::cluster::{HostsArg, HostsFile};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(file) = serde_json::from_str::<HostsFile>(text) {
        if file.check().is_ok() {
            for h in &file.hosts {
                let _ = h.control_addr();
            }
        }
    }
    let _ = HostsArg::parse(text);
});
