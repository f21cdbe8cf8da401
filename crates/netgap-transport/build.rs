//! With the `xdp` feature: compiles the small C file that gives libxdp's
//! inline ring operations symbols, and links libxdp and libbpf (Debian:
//! libxdp-dev, libbpf-dev). Without it: nothing, so the default build
//! needs only Rust.

fn main() {
    println!("cargo:rerun-if-changed=src/xdp/shim.c");
    #[cfg(feature = "xdp")]
    {
        cc::Build::new()
            .file("src/xdp/shim.c")
            .warnings(true)
            .compile("netgap_xsk_shim");
        println!("cargo:rustc-link-lib=xdp");
        println!("cargo:rustc-link-lib=bpf");
    }
}
