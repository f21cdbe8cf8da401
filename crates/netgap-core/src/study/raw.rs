//! The study file as TOML gives it: every table and key, unknown ones
//! refused, nothing checked yet ([`super::validate`] checks it once into
//! the validated types).

use super::Citation;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStudy {
    pub(crate) id: String,
    pub(crate) citation: Citation,
    pub(crate) method: RawMethod,
    pub(crate) testbed: RawTestbed,
    #[serde(default)]
    pub(crate) figure: Vec<RawFigure>,
    #[serde(default)]
    pub(crate) claim: Vec<RawClaim>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMethod {
    pub(crate) reps: u32,
    pub(crate) drop_each_side: u32,
    #[serde(default)]
    pub(crate) iterations: Option<u64>,
    pub(crate) text: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTestbed {
    pub(crate) hosts: u32,
    pub(crate) topology: String,
    #[serde(default = "one")]
    pub(crate) links: u32,
    #[serde(default)]
    pub(crate) rate: Option<String>,
    pub(crate) text: String,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFigure {
    pub(crate) id: String,
    pub(crate) caption: String,
    #[serde(default = "run")]
    pub(crate) command: String,
    pub(crate) tests: Vec<String>,
    #[serde(default)]
    pub(crate) transports: Vec<String>,
    #[serde(default)]
    pub(crate) modes: Vec<String>,
    #[serde(default)]
    pub(crate) sizes: Option<String>,
    #[serde(default)]
    pub(crate) conditions: Vec<String>,
    #[serde(default)]
    pub(crate) clients: Vec<u32>,
    #[serde(default)]
    pub(crate) streams: Vec<u32>,
    #[serde(default)]
    pub(crate) links: Vec<u32>,
    #[serde(default)]
    pub(crate) flags: Vec<String>,
    #[serde(default)]
    pub(crate) quick_flags: Vec<String>,
    #[serde(default)]
    pub(crate) quick_sizes: Option<String>,
    #[serde(default)]
    pub(crate) variants: Vec<Vec<String>>,
    pub(crate) x: String,
    pub(crate) y: String,
    pub(crate) series: Vec<String>,
    #[serde(default)]
    pub(crate) cpu: bool,
    pub(crate) hosts: u32,
    #[serde(default)]
    pub(crate) min_rep_ms: Option<u64>,
    pub(crate) paper: String,
    pub(crate) here: String,
}

fn run() -> String {
    "run".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClaim {
    pub(crate) figure: String,
    #[serde(default)]
    pub(crate) from: Vec<String>,
    pub(crate) text: String,
    pub(crate) published: String,
    #[serde(rename = "where")]
    pub(crate) where_: String,
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) a: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub(crate) b: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub(crate) series: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub(crate) at: Option<String>,
    #[serde(default)]
    pub(crate) vs_at: Option<String>,
    #[serde(default)]
    pub(crate) metric: Option<String>,
    #[serde(default)]
    pub(crate) above: Option<f64>,
    #[serde(default)]
    pub(crate) below: Option<f64>,
    #[serde(default)]
    pub(crate) tolerance_pct: Option<f64>,
    #[serde(default, rename = "from_x")]
    pub(crate) from_x: Option<String>,
    #[serde(default, rename = "to_x")]
    pub(crate) to_x: Option<String>,
    #[serde(default)]
    pub(crate) why: Option<String>,
    #[serde(default)]
    pub(crate) published_value: Option<f64>,
    #[serde(default)]
    pub(crate) no_mechanism: Option<String>,
    #[serde(default)]
    pub(crate) size_tolerance_pct: Option<f64>,
    #[serde(default)]
    pub(crate) size_why: Option<String>,
}
