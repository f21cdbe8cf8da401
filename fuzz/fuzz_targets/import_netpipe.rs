//! The netpipe importer's parse function on any text: records or one error
//! naming the line, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_report::import::{registry, ImportContext};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(importer) = registry().iter().find(|i| i.name() == "netpipe") else {
        return;
    };
    let ctx = ImportContext {
        size_bytes: Some(64),
        time: "2024-01-01T00:00:00Z".into(),
    };
    let _ = importer.parse(text, &ctx);
});
