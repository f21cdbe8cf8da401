//! With the `xdp` feature: compiles the small C file of what Rust cannot
//! call in libbpf and libxdp directly (a BPF link's versioned options,
//! the libraries' printing turned off), and links libxdp and libbpf
//! (Debian: libxdp-dev, libbpf-dev). Without it (the `xdp-user` feature
//! included): nothing, so those builds need only Rust and link no C
//! library.

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
