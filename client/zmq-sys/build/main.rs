pub fn configure() {
    println!("cargo:rerun-if-changed=build/main.rs");
    println!("cargo:rerun-if-env-changed=PROFILE");

    // Note that by default `libzmq` builds without `libsodium` by instead
    // relying on `tweetnacl`. However since this `tweetnacl` [has never been
    // audited nor is ready for production](https://github.com/zeromq/libzmq/issues/3006),
    // we link against `libsodium` to enable `ZMQ_CURVE`.
    //
    // dsprep: upstream passes `None` here, which builds libzmq without CURVE at all.
    // The libsodium comes from the `libsodium-sys-stable` dependency, built from the
    // tarball it ships; its build script's `cargo:include=`/`cargo:lib=` lines reach
    // this one as DEP_SODIUM_INCLUDE/DEP_SODIUM_LIB.
    let sodium = |key: &str| {
        std::env::var_os(key).unwrap_or_else(|| {
            panic!("{} is not set: libsodium-sys-stable must be a dependency of zmq-sys", key)
        })
    };
    // libzmq's own warnings are upstream's business: a path dependency's build script shows
    // them on every cold build, which registry crates never do. `-w` silences them.
    for flags in ["CFLAGS", "CXXFLAGS"] {
        let mut value = std::env::var(flags).unwrap_or_default();
        value.push_str(" -w");
        std::env::set_var(flags, value);
    }
    let lib = sodium("DEP_SODIUM_LIB");
    let include = sodium("DEP_SODIUM_INCLUDE");
    zeromq_src::Build::new()
        .with_libsodium(Some(zeromq_src::LibLocation::new(lib, include)))
        .build();
}

fn main() {
    configure()
}
