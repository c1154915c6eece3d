//! Gives the cdylib the soname of NVIDIA's library, so that binaries linked against it with
//! `-lcuda` record `libcuda.so.1` as their dependency (as with the real driver).

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
