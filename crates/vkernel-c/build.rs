//! Generates include/vkernel.h from the C ABI (cbindgen) and gives the
//! shared library its installed name.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libvkernel.so.0");
    let mut config = match cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")) {
        Ok(c) => c,
        Err(e) => panic!("cbindgen.toml: {e}"),
    };
    // The version the header comes with (`vk_version()` says the
    // library's: a program can tell the two apart).
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    config.after_includes = Some(format!("\n#define VK_VERSION \"{version}\""));
    match cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
    {
        Ok(b) => {
            b.write_to_file(format!("{dir}/include/vkernel.h"));
        }
        Err(e) => panic!("cbindgen: {e}"),
    }
}
