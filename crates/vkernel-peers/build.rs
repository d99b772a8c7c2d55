//! Generates the gRPC echo service (tonic + prost) from proto/echo.proto;
//! needs `protoc` (Debian `protobuf-compiler`, installed by .ci/deps).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/echo.proto");
    #[cfg(feature = "grpc")]
    tonic_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/echo.proto"], &["proto"])?;
    Ok(())
}
