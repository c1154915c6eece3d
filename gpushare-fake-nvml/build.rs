//! Gives the cdylib the soname of NVIDIA's library, so that binaries linked against it with
//! `-lnvidia-ml` record `libnvidia-ml.so.1` as their dependency (as with the real driver).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
